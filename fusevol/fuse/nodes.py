"""A node of the in-memory inode tree (`fusevol.fuse.tree`) and a directory's entries.

`Node` is what every inode of the mount is: a directory, a regular file or a symlink, with its
attributes, its content and the two facts of its lifetime the tree keeps (the kernel's lookup
count, whether the root reaches it). It is shaped for memory: thousands of volumes hold five or
more nodes each, so a node has slots, shares its (mode, uid, gid) with every node of the same
three, and a small directory's entries are a flat tuple (`Entries`).

Also here: the few helpers every side of the tree uses on nodes (`walk`, iterative; `link_entry`;
`symlink_gid`).

Nothing here numbers, attaches or counts nodes: the inode table and its changes are
`fusevol.fuse.tree`'s, the building of new nodes `fusevol.fuse.building`'s.
"""

from __future__ import annotations

import stat
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Reversible

_ATTRIBUTES: dict[tuple[int, int, int], tuple[int, int, int]] = {}
"""Each (st_mode, uid, gid) triple, one tuple for every node that has it: a node holds one
reference where it held three, 16 bytes less on each of the five or more nodes of each of
thousands of volumes (a node is 96 bytes, pymalloc's class below 112), and the few values a
node's owner and mode take are made once."""


_SMALL = 8
"""Entries a directory holds in a flat tuple; beyond, in a dict."""


class Entries:
    """A directory's entries, name -> node, in insertion order: the part of `dict` the tree
    uses. Nearly every directory is small (a volume's holds three entries, a version's one):
    up to `_SMALL` entries are a flat tuple, (name, node, name, node, ...), 56 bytes for one
    entry and 88 for three where a dict is 224, on the two directories of each of thousands
    of volumes. Beyond, a dict (the mount's root holds a directory per pod volume). A name is
    bytes and a node never equals one, so `tuple.index` finds a name at its even place.
    A dict's count of subdirectories is kept once counted, and follows its changes
    (`subdirectories`): a tenant's ConfigMap of 100,000 keys would cost 100,000 steps in every
    GETATTR of its directories, and the kernel asks for one after each of the 200,000 symlinks
    and unlinks of an edit that renames all the keys."""

    __slots__ = ("_items", "_subdirectories")

    def __init__(self) -> None:
        self._items: tuple[Any, ...] | dict[bytes, Node] = ()
        self._subdirectories = -1
        """The dict's entries that are directories; -1: not counted yet."""

    def subdirectories(self) -> int:
        """How many entries are directories (what a directory's link count adds to 2)."""
        items = self._items
        if not isinstance(items, dict):
            return sum(1 for node in items[1::2] if node.children is not None)
        if self._subdirectories < 0:
            self._subdirectories = sum(1 for node in items.values() if node.children is not None)
        return self._subdirectories

    def get(self, name: bytes) -> Node | None:
        items = self._items
        if isinstance(items, dict):
            return items.get(name)
        try:
            return cast("Node", items[items.index(name) + 1])
        except ValueError:
            return None

    def __getitem__(self, name: bytes) -> Node:
        node = self.get(name)
        if node is None:
            raise KeyError(name)
        return node

    def __setitem__(self, name: bytes, node: Node) -> None:
        items = self._items
        if isinstance(items, dict):
            if self._subdirectories >= 0:
                self._subdirectories += _is_dir(node) - _is_dir(items.get(name))
            items[name] = node
        elif name in items:
            at = items.index(name) + 1
            self._items = (*items[:at], node, *items[at + 1 :])
        elif len(items) < 2 * _SMALL:
            self._items = (*items, name, node)
        else:
            self._items = {**dict(self.items()), name: node}

    def __delitem__(self, name: bytes) -> None:
        items = self._items
        if isinstance(items, dict):
            if self._subdirectories >= 0:
                self._subdirectories -= _is_dir(items.get(name))
            del items[name]
        elif name in items:
            at = items.index(name)
            self._items = (*items[:at], *items[at + 2 :])
        else:
            raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, bytes) and name in self._items  # a dict's keys, a tuple's names

    def __len__(self) -> int:
        items = self._items
        return len(items) if isinstance(items, dict) else len(items) // 2

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.keys())

    def keys(self) -> Iterable[bytes]:
        items = self._items
        return items.keys() if isinstance(items, dict) else items[0::2]

    def values(self) -> Reversible[Node]:
        items = self._items
        return items.values() if isinstance(items, dict) else items[1::2]

    def items(self) -> Iterable[tuple[bytes, Node]]:
        items = self._items
        if isinstance(items, dict):
            return items.items()
        return zip(items[0::2], items[1::2], strict=True)


def _is_dir(node: Node | None) -> int:
    return int(node is not None and node.children is not None)


class Node:
    __slots__ = (
        "_attributes",
        "attached",
        "children",
        "content",
        "inode",
        "mtime_ns",
        "nlookup",
        "parent",
    )

    def __init__(
        self,
        inode: int,
        mode: int,
        uid: int,
        gid: int,
        mtime_ns: int,
        content: bytes = b"",
        children: Entries | None = None,
        parent: Node | None = None,
        nlookup: int = 0,
        attached: bool = False,
    ) -> None:
        self.inode = inode
        attributes = (mode, uid, gid)
        self._attributes = _ATTRIBUTES.setdefault(attributes, attributes)
        self.mtime_ns = mtime_ns
        self.content = content
        """A regular file's data, a symlink's target: one field for both."""
        self.children = children
        """Directory entries (directories only)."""
        self.parent = parent
        self.nlookup = nlookup
        """Lookups the kernel holds on this node (FUSE lookup count)."""
        self.attached = attached
        """Reachable from the root."""

    def __repr__(self) -> str:
        return f"Node(inode={self.inode}, mode={self.mode:o}, attached={self.attached})"

    @property
    def mode(self) -> int:
        """Full `st_mode`: file type and permission bits."""
        return self._attributes[0]

    @property
    def uid(self) -> int:
        return self._attributes[1]

    @property
    def gid(self) -> int:
        return self._attributes[2]

    @property
    def data(self) -> bytes:
        """File content (regular files only)."""
        return self.content if stat.S_ISREG(self.mode) else b""

    @property
    def target(self) -> bytes:
        """Symlink target (symlinks only)."""
        return self.content if stat.S_ISLNK(self.mode) else b""

    @property
    def is_dir(self) -> bool:
        return self.children is not None

    @property
    def size(self) -> int:
        return 0 if self.children is not None else len(self.content)

    @property
    def nlink(self) -> int:
        if self.children is None:
            return 1 if self.attached else 0
        return 2 + self.children.subdirectories()


def symlink_gid(parent: Node) -> int:
    """The group of a symlink made in `parent`: the directory's if it is setgid (fsGroup)."""
    return parent.gid if parent.mode & stat.S_ISGID else 0


def link_entry(parent: Node, name: bytes, node: Node) -> None:
    """Make `node` the entry `name` of directory `parent`: no check, no count, no table."""
    assert parent.children is not None
    parent.children[name] = node
    node.parent = parent


def walk(node: Node) -> Iterator[Node]:
    """`node` and every node below it, parents first, each directory's entries in order.

    With a stack of its own, not recursion: a tenant's item path sets the depth (2048 levels fit
    AtomicWriter's 4096 bytes, `fusevol.projection.paths`), and Python's recursion stops at 1000
    frames with a RecursionError in whichever request or operation walked."""
    stack = [node]
    while stack:
        each = stack.pop()
        yield each
        if each.children:
            stack.extend(reversed(each.children.values()))
