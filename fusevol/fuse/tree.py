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
built first (`fusevol.fuse.building`) and *staged* under the name the agent will `mkdir`; the
mkdir attaches it whole. A name that does not exist yet needs no VFS operation at all (`add`:
docs/fuse.md fact 14).

Lifetimes follow the FUSE contract (pyfuse3 `Operations.forget`): a node is in the inode table
while it is reachable from the root or the kernel still holds lookups on it; a detached node is
dropped when its lookup count reaches zero. Inode numbers are never reused.

Every change of what the kernel may know (structure, lookup counts) is told to `observer`, if
any, before the request's reply leaves: `fusevol.fuse.snapshot` keeps it in memory outside the
agent, for a successor that takes the FUSE connection over and must answer for the same inodes.

Errors are raised as `OSError(errno, ...)`; the FUSE adapter turns them into `FUSEError`.

Here: the inode table, the kernel's lookups on it, and the changes that attach and detach
subtrees (each subtree checked whole before anything changes, undone if the observer fails).
Beside it: a node and a directory's entries (`fusevol.fuse.nodes`); new nodes, numbered, and a
version built whole (`fusevol.fuse.building`: `Tree` is a `Builder`); the order READDIR lists a
directory in (`fusevol.fuse.order`).
"""

from __future__ import annotations

import errno
import stat
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from fusevol.fuse.building import Builder
from fusevol.fuse.naming import number_after
from fusevol.fuse.nodes import Entries, Node, link_entry, symlink_gid, walk
from fusevol.fuse.order import Orders

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

ROOT_INODE = 1


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


class Tree(Builder):
    def __init__(self, *, clock_ns: Callable[[], int] = time.time_ns) -> None:
        super().__init__(clock_ns=clock_ns, next_inode=ROOT_INODE + 1)
        self.root = Node(ROOT_INODE, stat.S_IFDIR | 0o755, 0, 0, clock_ns(), children=Entries())
        self.root.attached = True
        self.root.parent = self.root
        self._nodes: dict[int, Node] = {ROOT_INODE: self.root}
        self._detached = 0
        """Nodes of the inode table that are not attached, counted as they come and go: every
        STATFS asks (`statistics`), and a count over the table took a millisecond a 20,000
        nodes, a tenant's to ask for in a loop."""
        self._staged: dict[tuple[int, bytes], Node] = {}
        self._orders = Orders()
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
        """Entries ordered by inode number, starting after inode `after`: stable readdir offsets
        (`Orders.entries`)."""
        return self._orders.entries(directory, after)

    # -- structural changes (the agent's own VFS operations) ---------------------------------------

    def stage(self, parent: Node, name: bytes, node: Node) -> None:
        """Make `node` the directory the next `mkdir(parent, name)` attaches."""
        self._staged[(parent.inode, name)] = node

    def unstage(self, parent: Node, name: bytes) -> None:
        """Drop a staged directory that was never created. No-op if there is none."""
        self._staged.pop((parent.inode, name), None)

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
        self._orders.left(old_parent, node)
        if replaced is not None:
            self._orders.left(new_parent, replaced)
            self._detach(replaced)
        self._orders.entered(new_parent, new, node)
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
        self._orders.left(parent, node)
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
            self._orders.left(parent, node)
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
        link_entry(parent, name, node)
        if replaced is not None:
            self._orders.left(parent, replaced)
        self._orders.entered(parent, name, node)
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

    def _touch(self, *directories: Node) -> None:
        now = self._clock_ns()
        for directory in directories:
            directory.mtime_ns = now
