"""The in-memory inode tree behind the FUSE mount. Pure Python: no pyfuse3, no I/O.

Shape of the mount:

    /                               root, 0755
    /<subtree>/                     one directory per served pod volume, or per volumes that
                                    share one (its name: fusevol.fuse.naming; its root mode is
                                    the plugin's: 0777 for configMap, 1777 for the tmpfs types)
    /<subtree>/..data               -> ..2026_11_22_03_48_46.123456 (symlink)
    /<subtree>/..2026_...           one version: the payload's files and nested directories
    /<subtree>/<key>                -> ..data/<key> (top-level names only)

The tree never changes a visible node in place. Every version is a new subtree with new inode
numbers, so the kernel may cache entries, attributes, symlink targets and pages for as long as it
likes (docs/fuse.md fact 4). Structural changes arrive as the agent's own VFS operations through the
mount (`mkdir`, `symlink`, `rename`, `unlink`, `rmdir`: see `fusevol.fuse.publish`); the kernel
updates its dentry cache and raises inotify events exactly as for kubelet's tmpfs
(docs/fuse.md fact 2). A directory cannot be created empty and then filled, so its content is
built here first and *staged* under the name the agent will `mkdir`; the mkdir attaches it whole.
A name that does not exist yet needs no VFS operation at all (`add`: docs/fuse.md fact 14).

Lifetimes follow the FUSE contract (pyfuse3 `Operations.forget`): a node is in the inode table
while it is reachable from the root or the kernel still holds lookups on it; a detached node is
dropped when its lookup count reaches zero. Inode numbers are never reused.

Every change of what the kernel may know (structure, lookup counts) is told to `observer`, if
any, before the request's reply leaves: `fusevol.fuse.snapshot` keeps it in memory outside the
agent, for a successor that takes the FUSE connection over and must answer for the same inodes.

Errors are raised as `OSError(errno, ...)`; the FUSE adapter turns them into `FUSEError`.
"""

from __future__ import annotations

import bisect
import errno
import functools
import stat
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from fusevol.fuse.naming import number_after, numbered

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Reversible

    from fusevol.model import Payload

ROOT_INODE = 1

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


@dataclass(frozen=True, slots=True)
class TreeStatistics:
    nodes: int
    """Nodes in the inode table (attached or still known to the kernel)."""
    detached_known: int
    """Of those, nodes no longer reachable that the kernel has not forgotten yet."""
    staged: int


class TreeObserver(Protocol):
    """Told of every change the kernel may see, after the tree made it."""

    def remembered(self, node: Node) -> None: ...
    def forgot(self, inode: int, nlookup: int) -> None: ...
    def attached(self, parent: Node, name: bytes, node: Node) -> None: ...
    def renamed(self, old_parent: Node, old: bytes, new_parent: Node, new: bytes) -> None: ...
    def removed(self, parent: Node, name: bytes) -> None: ...


class Tree:
    def __init__(self, *, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self._clock_ns = clock_ns
        self._next_inode = ROOT_INODE + 1
        self.root = Node(ROOT_INODE, stat.S_IFDIR | 0o755, 0, 0, clock_ns(), children=Entries())
        self.root.attached = True
        self.root.parent = self.root
        self._nodes: dict[int, Node] = {ROOT_INODE: self.root}
        self._detached = 0
        """Nodes of the inode table that are not attached, counted as they come and go: every
        STATFS asks (`statistics`), and a count over the table took a millisecond a 20,000
        nodes, a tenant's to ask for in a loop."""
        self._staged: dict[tuple[int, bytes], Node] = {}
        self._orders: dict[int, _Order] = {}
        """Large directories' entries in inode order, while they do not change (`entries`)."""
        self.observer: TreeObserver | None = None

    @classmethod
    def restored(cls, nodes: dict[int, Node], *, attached: set[int], next_inode: int) -> Tree:
        """A tree made of `nodes` (linked, with their lookup counts), those in `attached` reachable
        from the root (`nodes[ROOT_INODE]`): what a predecessor served (`fusevol.fuse.snapshot`)."""
        tree = cls()
        tree.root = nodes[ROOT_INODE]
        tree.root.parent = tree.root
        tree._next_inode = next_inode
        tree._nodes = {}
        for inode, node in nodes.items():
            node.attached = inode in attached
            if node.attached or node.nlookup:
                tree._nodes[inode] = node
                tree._detached += not node.attached
        return tree

    @property
    def next_inode(self) -> int:
        """The number the next node is made with (`naming.numbered`): not an id itself."""
        return self._next_inode

    def known_nodes(self) -> list[Node]:
        """Every node of the inode table and every node below one (detached directories keep
        their content for those who hold them), each once."""
        seen: dict[int, Node] = {}
        for start in list(self._nodes.values()):
            stack = [start]
            while stack:  # a walk that stops at what an earlier one saw: each node once
                node = stack.pop()
                if node.inode not in seen:
                    seen[node.inode] = node
                    if node.children:
                        stack.extend(reversed(node.children.values()))
        return list(seen.values())

    # -- building new, unattached nodes ------------------------------------------------------------

    def new_dir(
        self, *, mode: int, uid: int = 0, gid: int = 0, mtime_ns: int | None = None
    ) -> Node:
        return self._new(stat.S_IFDIR | mode, uid, gid, mtime_ns, children=Entries())

    def new_file(
        self, data: bytes, *, mode: int, uid: int = 0, gid: int = 0, mtime_ns: int | None = None
    ) -> Node:
        return self._new(stat.S_IFREG | mode, uid, gid, mtime_ns, content=data)

    def new_symlink(self, target: bytes, *, gid: int = 0, mtime_ns: int | None = None) -> Node:
        return self._new(stat.S_IFLNK | 0o777, 0, gid, mtime_ns, content=target)

    def now_ns(self) -> int:
        """The tree's clock: one reading given as `mtime_ns` to every node built at once is one
        int for all of them, where each would make its own (36 bytes a node)."""
        return self._clock_ns()

    def build_version(
        self,
        payload: Payload,
        *,
        dir_mode: int = 0o755,
        gid: int | None = None,
        mtime_ns: int | None = None,
    ) -> Node:
        """A version directory holding `payload`'s files, not yet attached, made at `mtime_ns`
        (now, if None).

        Like AtomicWriter: the version directory and nested directories are 0755 (kubelet chmods the
        first and creates the others with MkdirAll under umask 022); files carry their own mode and
        owner. `gid` is the fsGroup, if any, applied to every node built here.
        """
        group = 0 if gid is None else gid
        top = self.new_dir(mode=dir_mode, gid=group, mtime_ns=mtime_ns)
        created = top.mtime_ns  # one int for all (`now_ns`)
        for path in sorted(payload):
            projection = payload[path]
            *dirs, base = names(path)
            parent = top
            for name in dirs:
                assert parent.children is not None
                child = parent.children.get(name)
                if child is None:
                    child = self.new_dir(mode=dir_mode, gid=group, mtime_ns=created)
                    _link(parent, name, child)
                parent = child
            uid = 0 if projection.fs_user is None else projection.fs_user
            node = self.new_file(
                projection.data, mode=projection.mode, uid=uid, gid=group, mtime_ns=created
            )
            _link(parent, base, node)
        return top

    def link(self, parent: Node, name: bytes, node: Node) -> None:
        """Put `node` into `parent` while both are still being built (not attached)."""
        assert not parent.attached, "attached directories change only through the VFS"
        _link(parent, name, node)

    def stage(self, parent: Node, name: bytes, node: Node) -> None:
        """Make `node` the directory the next `mkdir(parent, name)` attaches."""
        self._staged[(parent.inode, name)] = node

    def unstage(self, parent: Node, name: bytes) -> None:
        """Drop a staged directory that was never created. No-op if there is none."""
        self._staged.pop((parent.inode, name), None)

    # -- reading (the kernel's view) ---------------------------------------------------------------

    def __getitem__(self, inode: int) -> Node:
        try:
            return self._nodes[inode]
        except KeyError:
            raise OSError(errno.ENOENT, f"no inode {inode}") from None

    def child(self, parent: Node, name: bytes) -> Node | None:
        """The entry `name` of directory `parent`, or None. Does not count a lookup."""
        if parent.children is None:
            return None
        return parent.children.get(name)

    def lookup(self, parent_inode: int, name: bytes) -> Node:
        """Resolve `name` in a directory and count one kernel lookup on the result."""
        parent = self[parent_inode]
        if parent.children is None:
            raise OSError(errno.ENOTDIR, "not a directory")
        if name == b".":
            node = parent
        elif name == b"..":
            node = parent.parent or parent
        else:
            found = parent.children.get(name)
            if found is None:
                raise OSError(errno.ENOENT, "no such entry")
            node = found
        self.remember(node)
        return node

    def remember(self, node: Node) -> None:
        """Count one kernel lookup on `node` (`lookup` and readdirplus hand them out).

        A node the kernel holds is in the inode table, even a detached one reached through a
        directory the kernel still holds (a process whose cwd is inside a removed version)."""
        node.nlookup += 1
        if node.inode not in self._nodes:
            self._nodes[node.inode] = node
            self._detached += not node.attached
        if self.observer is not None:
            self.observer.remembered(node)

    def forget(self, inode: int, nlookup: int) -> None:
        node = self._nodes.get(inode)
        if node is None or inode == ROOT_INODE:
            return
        node.nlookup = max(0, node.nlookup - nlookup)
        if node.nlookup == 0 and not node.attached:
            del self._nodes[inode]
            self._detached -= 1
        if self.observer is not None:
            self.observer.forgot(inode, nlookup)

    def entries(self, directory: Node, after: int) -> Iterator[tuple[bytes, Node]]:
        """Entries ordered by inode number, starting after inode `after`: stable readdir offsets.

        A large directory's order is kept (`_ORDERS_KEPT` of them), and follows its changes
        (`_entered`, `_left`): a listing takes a READDIR request for every few dozen entries, and
        sorting all of them in each request made a listing of a tenant's 100,000 keys cost
        seconds of the trio thread (and minutes, while its entries change)."""
        assert directory.children is not None
        if len(directory.children) <= _ORDERED:
            for name, node in sorted(directory.children.items(), key=lambda item: item[1].inode):
                if node.inode > after:
                    yield name, node
            return
        order = self._orders.pop(directory.inode, None) or _Order.of(directory.children)
        self._orders[directory.inode] = order  # the most recently used last
        if len(self._orders) > _ORDERS_KEPT:
            del self._orders[next(iter(self._orders))]
        yield from order.after(after)

    # -- structural changes (the agent's own VFS operations) ---------------------------------------

    def mkdir(self, parent_inode: int, name: bytes) -> Node:
        parent = self._directory(parent_inode)
        node = self._staged.pop((parent.inode, name), None)
        if node is None:
            raise OSError(errno.EROFS, "only staged directories can be created")
        return self._add(parent, name, node, lookups=1)

    def add(self, parent: Node, name: bytes, node: Node) -> None:
        """Attach the new subtree `node` at `parent/name` without a VFS operation: the kernel holds
        no entry for a name that does not exist, not even a negative one (docs/fuse.md fact 14),
        so its next lookup of `name` finds `node`. No lookup is counted: the kernel knows
        nothing of it yet."""
        self._add(parent, name, node, lookups=0)

    def symlink(self, parent_inode: int, name: bytes, target: bytes) -> Node:
        parent = self._directory(parent_inode)
        node = self.new_symlink(target, gid=symlink_gid(parent))
        return self._add(parent, name, node, lookups=1)

    def adopt(self, parent: Node, name: bytes, node: Node) -> None:
        """Attach `node` (its lookup count as recorded) at `parent/name`: a recorded mkdir or
        symlink replayed (`fusevol.fuse.snapshot`). Numbers above it are never handed out."""
        below = self._attach(parent, name, node)
        self._next_inode = max(self._next_inode, *(number_after(n.inode) for n in below))

    def rename(self, old_parent_inode: int, old: bytes, new_parent_inode: int, new: bytes) -> None:
        old_parent = self._directory(old_parent_inode)
        new_parent = self._directory(new_parent_inode)
        assert old_parent.children is not None
        assert new_parent.children is not None
        node = old_parent.children.get(old)
        if node is None:
            raise OSError(errno.ENOENT, "no such entry")
        replaced = new_parent.children.get(new)
        if replaced is not None and replaced.children:
            raise OSError(errno.ENOTEMPTY, "target directory not empty")
        del old_parent.children[old]
        new_parent.children[new] = node
        node.parent = new_parent
        self._left(old_parent, node)
        if replaced is not None:
            self._left(new_parent, replaced)
            self._detach(replaced)
        self._entered(new_parent, new, node)
        self._touch(old_parent, new_parent)
        if self.observer is not None:
            self.observer.renamed(old_parent, old, new_parent, new)

    def unlink(self, parent_inode: int, name: bytes) -> None:
        self._remove(parent_inode, name, directory=False)

    def rmdir(self, parent_inode: int, name: bytes) -> None:
        """Remove a directory *with* its content: versions and volumes go in one operation."""
        self._remove(parent_inode, name, directory=True)

    def statistics(self) -> TreeStatistics:
        return TreeStatistics(len(self._nodes), self._detached, len(self._staged))

    # -- internals ---------------------------------------------------------------------------------

    def _new(self, mode: int, uid: int, gid: int, mtime_ns: int | None, **fields: object) -> Node:
        """A node numbered next (`naming.numbered`), made at `mtime_ns` (now, if None)."""
        mtime_ns = self._clock_ns() if mtime_ns is None else mtime_ns
        inode = numbered(self._next_inode)  # unguessable: a file handle names it (naming.py)
        self._next_inode += 1
        node = Node(inode, mode, uid, gid, mtime_ns, **fields)  # type: ignore[arg-type]
        return node

    def _directory(self, inode: int) -> Node:
        node = self[inode]
        if node.children is None:
            raise OSError(errno.ENOTDIR, "not a directory")
        return node

    def _remove(self, parent_inode: int, name: bytes, *, directory: bool) -> None:
        parent = self._directory(parent_inode)
        assert parent.children is not None
        node = parent.children.get(name)
        if node is None:
            raise OSError(errno.ENOENT, "no such entry")
        if node.is_dir != directory:
            raise OSError(errno.EISDIR if node.is_dir else errno.ENOTDIR, "wrong file type")
        del parent.children[name]
        self._left(parent, node)
        self._detach(node)
        self._touch(parent)
        if self.observer is not None:
            self.observer.removed(parent, name)

    def _add(self, parent: Node, name: bytes, node: Node, *, lookups: int) -> Node:
        """Attach a new `node` at `parent/name`, with the kernel's `lookups` on it (1 for the
        reply to a mkdir or symlink), and tell the observer. All or nothing: if the observer
        fails (the reply then says so, and the kernel never learns of `node`), the subtree is
        detached again, as it was."""
        if name in parent.children:  # type: ignore[operator]
            raise OSError(errno.EEXIST, "exists")
        mtime_ns = parent.mtime_ns
        below = self._attach(parent, name, node)
        node.nlookup += lookups
        try:
            if self.observer is not None:
                self.observer.attached(parent, name, node)
        except BaseException:
            node.nlookup -= lookups
            del parent.children[name]  # type: ignore[union-attr]
            self._left(parent, node)
            node.parent = None
            self._forget_all(below)
            parent.mtime_ns = mtime_ns
            raise
        return node

    def _attach(self, parent: Node, name: bytes, node: Node) -> list[Node]:
        """Link `node` at `parent/name` and enter its subtree in the inode table; returns the
        subtree's nodes. Nothing changes until the subtree has been walked."""
        below = list(walk(node))
        replaced = parent.children.get(name)  # type: ignore[union-attr]
        _link(parent, name, node)
        if replaced is not None:
            self._left(parent, replaced)
        self._entered(parent, name, node)
        for each in below:
            if not each.attached and each.inode in self._nodes:
                self._detached -= 1
            each.attached = True
            self._nodes[each.inode] = each
        self._touch(parent)
        return below

    def _detach(self, node: Node) -> None:
        self._forget_all(walk(node))

    def _forget_all(self, nodes: Iterable[Node]) -> None:
        """`nodes` are no longer reachable: out of the inode table unless the kernel holds them."""
        for each in nodes:
            was_attached, each.attached = each.attached, False
            if each.nlookup == 0:
                if self._nodes.pop(each.inode, None) is not None and not was_attached:
                    self._detached -= 1
            elif was_attached:  # kept in the table, now detached
                self._detached += 1

    def _entered(self, directory: Node, name: bytes, node: Node) -> None:
        """`node` is now `directory`'s entry `name`: in the kept order, if there is one."""
        order = self._orders.get(directory.inode)
        if order is not None:
            order.insert(name, node)

    def _left(self, directory: Node, node: Node) -> None:
        """`node` is no longer an entry of `directory`: out of the kept order, if there is one."""
        order = self._orders.get(directory.inode)
        if order is not None:
            order.remove(node)

    def _touch(self, *directories: Node) -> None:
        now = self._clock_ns()
        for directory in directories:
            directory.mtime_ns = now


_ORDERED = 64
"""Entries beyond which a directory's order by inode number is kept once sorted (`entries`)."""
_ORDERS_KEPT = 8
"""Directories whose order is kept at once: 24 bytes an entry each (100,000 keys: 2.4 MB)."""


@dataclass(frozen=True, slots=True)
class _Order:
    """A directory's entries in order of inode number: three lists, no tuple per entry."""

    inodes: list[int]
    names: list[bytes]
    nodes: list[Node]

    @classmethod
    def of(cls, children: Entries) -> _Order:
        ordered = sorted(children.items(), key=lambda item: item[1].inode)
        nodes = [node for _, node in ordered]
        return cls([node.inode for node in nodes], [name for name, _ in ordered], nodes)

    def after(self, inode: int) -> Iterator[tuple[bytes, Node]]:
        """The entries after `inode`, found by bisection, not by a walk from the first."""
        for at in range(bisect.bisect_right(self.inodes, inode), len(self.inodes)):
            yield self.names[at], self.nodes[at]

    def insert(self, name: bytes, node: Node) -> None:
        at = bisect.bisect_right(self.inodes, node.inode)
        self.inodes.insert(at, node.inode)
        self.names.insert(at, name)
        self.nodes.insert(at, node)

    def remove(self, node: Node) -> None:
        at = bisect.bisect_left(self.inodes, node.inode)
        if at < len(self.nodes) and self.nodes[at] is node:
            del self.inodes[at], self.names[at], self.nodes[at]


def names(path: str) -> tuple[bytes, ...]:
    """A payload path's names, encoded: the same bytes objects for every volume whose payload
    has that path (most volumes of a cluster share a few key names, each a directory entry and
    a link name in every volume). Only short paths are kept: a tenant's 4096-byte paths of 2048
    names each would hold some 100 KiB apiece in the cache."""
    if len(path) > _CACHED_PATH_CHARS:
        return _split(path)
    return _cached_names(path)


_CACHED_PATH_CHARS = 256
"""Paths `names` keeps: a key (at most 253 bytes) and most item paths."""


def _split(path: str) -> tuple[bytes, ...]:
    return tuple(path.encode().split(b"/"))


_cached_names = functools.lru_cache(maxsize=4096)(_split)


def symlink_gid(parent: Node) -> int:
    """The group of a symlink made in `parent`: the directory's if it is setgid (fsGroup)."""
    return parent.gid if parent.mode & stat.S_ISGID else 0


def _link(parent: Node, name: bytes, node: Node) -> None:
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
