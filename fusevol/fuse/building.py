"""New nodes of the inode tree, not yet attached: numbered, timed, and a version built whole.

`Builder` is the part of the tree (`fusevol.fuse.tree.Tree` is one) that makes nodes no one can
see yet. Each is numbered by `fusevol.fuse.naming.numbered`, an id no container can guess, from
a number that only grows (inode numbers are never reused), and made at the tree's clock;
`build_version` makes a payload's version directory with its files and nested directories, as
kubelet's AtomicWriter lays them out. A directory cannot be created empty and then filled
through the mount, so its content is built here first; the tree then stages it for the `mkdir`
that attaches it whole. `names` turns a payload path into the names of its entries, the same
bytes for every volume.

Nothing built here is in the inode table, known to the kernel or told to the journal yet:
staging, attaching and lookup counts are `fusevol.fuse.tree`'s; the node itself is
`fusevol.fuse.nodes`'.
"""

from __future__ import annotations

import functools
import stat
from typing import TYPE_CHECKING

from fusevol.fuse.naming import numbered
from fusevol.fuse.nodes import Entries, Node, link_entry

if TYPE_CHECKING:
    from collections.abc import Callable

    from fusevol.model import Payload


class Builder:
    """Makes the tree's new nodes, numbered from `next_inode` on, at `clock_ns`."""

    def __init__(self, *, clock_ns: Callable[[], int], next_inode: int) -> None:
        self._clock_ns = clock_ns
        self._next_inode = next_inode

    @property
    def next_inode(self) -> int:
        """The number the next node is made with (`naming.numbered`): not an id itself."""
        return self._next_inode

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
                    link_entry(parent, name, child)
                parent = child
            uid = 0 if projection.fs_user is None else projection.fs_user
            node = self.new_file(
                projection.data, mode=projection.mode, uid=uid, gid=group, mtime_ns=created
            )
            link_entry(parent, base, node)
        return top

    def link(self, parent: Node, name: bytes, node: Node) -> None:
        """Put `node` into `parent` while both are still being built (not attached)."""
        assert not parent.attached, "attached directories change only through the VFS"
        link_entry(parent, name, node)

    def _new(self, mode: int, uid: int, gid: int, mtime_ns: int | None, **fields: object) -> Node:
        """A node numbered next (`naming.numbered`), made at `mtime_ns` (now, if None)."""
        mtime_ns = self._clock_ns() if mtime_ns is None else mtime_ns
        inode = numbered(self._next_inode)  # unguessable: a file handle names it (naming.py)
        self._next_inode += 1
        node = Node(inode, mode, uid, gid, mtime_ns, **fields)  # type: ignore[arg-type]
        return node


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
