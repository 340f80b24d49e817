"""The follow file system: subPath views that follow a served volume's current version.

kubelet binds a subPath of a configMap or secret volume as the file it resolves to when the
container starts, one version's file, so the container never sees an update. A view here is a
node of a second, small FUSE file system whose every lookup and open goes through the volume's
*current* `..data`: the bind on kubelet's `volume-subpaths/...` path stays the same node, and
what an open reads is the version that was current at that open.

    <root>/fusevol/follow/<uid>/<plugin dir>/<volume>/<path...>
        -> <root>/pods/<uid>/volumes/<plugin dir>/<volume>/<path...>, resolved at each lookup,
           getattr and open (symlinks followed: `key -> ..data/key`)

1. Only the four served plugin directories are reachable (never a volume that a container can
   write into: no symlink of a pod's making is ever followed), names `.`/`..` are refused, and
   the levels above a volume are root's alone (0700): a container reaches a view only through
   its bind, as a host user reaches a volume only through the pod directory (0750).
2. An inode stands for a *path*, not a version: the node bound at a view keeps its number, and its
   attributes are those of what the path resolves to now (timeouts 0: asked again each time).
   Numbers are given to paths that exist, and kept while the server runs (`forget` is a no-op):
   the table grows with the distinct paths of the served volumes, not with failed lookups.
3. `open` opens the path through the pod volume directory and keeps that file descriptor as the
   handle: the version's file is pinned, so a reader holding it reads one version to its end,
   and the next open resolves `..data` again. Files are opened `direct_io`: reads bypass the page
   cache (one page cache per inode would mix versions) and the size the kernel remembers.
   `opendir` lists the directory at that moment.
4. Read-only for everyone (EROFS); permission checks are the kernel's (`default_permissions`) on
   the modes and owners of the files it resolves to.

Why a second file system: the agent's own mount lets the kernel open files without asking
(docs/fuse.md fact 4), so it cannot give two opens of one inode two versions
(docs/fuse.md fact 13, which also says what still shares the page cache: sendfile and mmap).
This one is served by its own process (`python -m fusevol.fuse.follow --root DIR`, started by
the agent when a pod needs a view: `fusevol.fuse.servers`), which holds no state but its
inode numbers and outlives agent restarts, so views survive them whatever the containers' mount
propagation. It reads secrets into memory only, for the read that asked, and logs no content.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import stat
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pyfuse3
import trio

from fusevol.fuse import side_serve
from fusevol.fuse.answering import answering_errors
from fusevol.fuse.servers import FOLLOW
from fusevol.fuse.side_serve import SideOperations
from fusevol.node import layout
from fusevol.node.layout import Plugin

if TYPE_CHECKING:
    from collections.abc import Sequence

log = logging.getLogger(__name__)

_SERVED_DIRS = frozenset(p.dir_name.encode() for p in Plugin if p.served_from_memory)


class FollowOperations(SideOperations):
    def __init__(self, pods: Path) -> None:
        super().__init__()
        self._pods = os.fsencode(pods)
        self._paths: dict[int, tuple[bytes, ...]] = {pyfuse3.ROOT_INODE: ()}
        self._inodes: dict[tuple[bytes, ...], int] = {(): pyfuse3.ROOT_INODE}
        self._next = pyfuse3.ROOT_INODE + 1

    # -- 1, 2. paths and inodes --------------------------------------------------------------------

    def real_path(self, parts: tuple[bytes, ...]) -> bytes:
        """The pod volume path of follow path `parts` (`uid/plugin dir/volume/...`)."""
        if len(parts) < 3:
            return os.path.join(self._pods, *parts[:1])
        uid, plugin, *rest = parts
        return os.path.join(self._pods, uid, b"volumes", plugin, *rest)

    def _inode(self, parts: tuple[bytes, ...]) -> int:
        inode = self._inodes.get(parts)
        if inode is None:
            inode = self._inodes[parts] = self._next
            self._paths[inode] = parts
            self._next += 1
        return inode

    def _parts(self, inode: int) -> tuple[bytes, ...]:
        try:
            return self._paths[inode]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    async def _stat(self, inode: int) -> pyfuse3.EntryAttributes:
        return await self._stat_path(self._parts(inode), inode)

    async def _stat_path(
        self, parts: tuple[bytes, ...], inode: int | None
    ) -> pyfuse3.EntryAttributes:
        """The attributes of what `parts` resolves to now; a path that resolves to nothing gets
        no inode number (`inode` None: numbered once it exists)."""
        if len(parts) < 3:  # the levels above a volume: root's alone (as the pod directories)
            mode, uid, gid, size, mtime_ns = stat.S_IFDIR | 0o700, 0, 0, 0, time.time_ns()
        else:
            try:
                st = await trio.to_thread.run_sync(os.stat, self.real_path(parts))
            except OSError as exc:
                raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
            mode, uid, gid, size, mtime_ns = (
                st.st_mode,
                st.st_uid,
                st.st_gid,
                st.st_size,
                st.st_mtime_ns,
            )
        number = self._inode(parts) if inode is None else inode
        return _attributes(number, mode, uid, gid, size, mtime_ns)

    # -- reading -----------------------------------------------------------------------------------

    @answering_errors
    async def lookup(
        self, parent_inode: pyfuse3.InodeT, name: pyfuse3.FileNameT, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        parts = (*self._parts(parent_inode), bytes(name))
        if name in (b".", b"..") or (len(parts) == 2 and parts[1] not in _SERVED_DIRS):
            raise pyfuse3.FUSEError(errno.ENOENT)
        level = self.real_path(parts) if len(parts) == 1 else self._plugin(parts)
        # A pod or plugin level exists if the pod volume directory does.
        if len(parts) < 3 and not await trio.to_thread.run_sync(os.path.isdir, level):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return await self._stat_path(parts, None)

    def _plugin(self, parts: tuple[bytes, ...]) -> bytes:
        return os.path.join(self._pods, parts[0], b"volumes", parts[1])

    async def forget(self, inode_list: Sequence[tuple[pyfuse3.InodeT, int]]) -> None:
        pass  # an inode is a path: kept, so a path keeps its number for as long as the server runs

    @answering_errors
    async def getattr(
        self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        return await self._stat(inode)

    @answering_errors
    async def open(
        self, inode: pyfuse3.InodeT, flags: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.FileInfo:
        self._refuse_writing(flags)
        parts = self._parts(inode)
        if len(parts) < 3:
            raise pyfuse3.FUSEError(errno.EISDIR)
        try:
            fd = await trio.to_thread.run_sync(os.open, self.real_path(parts), os.O_RDONLY)
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
        return pyfuse3.FileInfo(fh=fd, direct_io=True, keep_cache=False)

    @answering_errors
    async def opendir(
        self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.FileHandleT:
        parts = self._parts(inode)
        path = self.real_path(parts) if len(parts) != 2 else self._plugin(parts)
        try:
            names = await trio.to_thread.run_sync(os.listdir, path)
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
        if len(parts) == 1:
            names = [n for n in names if n in _SERVED_DIRS]
        return self._new_dir([(n, self._inode((*parts, n))) for n in sorted(names)])

    @answering_errors
    async def readdir(
        self, fh: pyfuse3.FileHandleT, start_id: int, token: pyfuse3.ReaddirToken
    ) -> None:
        entries = self._dirs.get(fh, [])
        for offset, (name, inode) in enumerate(entries[start_id:], start=start_id + 1):
            try:
                attrs = await self._stat(inode)
            except pyfuse3.FUSEError:
                continue  # gone with the version listed
            if not pyfuse3.readdir_reply(token, name, attrs, offset):
                return


def _attributes(
    inode: int, mode: int, uid: int, gid: int, size: int, mtime_ns: int
) -> pyfuse3.EntryAttributes:
    attrs = pyfuse3.EntryAttributes()
    attrs.st_ino = inode
    attrs.st_mode = mode
    attrs.st_nlink = 2 if stat.S_ISDIR(mode) else 1
    attrs.st_uid = uid
    attrs.st_gid = gid
    attrs.st_size = size
    attrs.st_blksize = 4096
    attrs.st_blocks = (size + 511) // 512
    attrs.st_atime_ns = attrs.st_mtime_ns = attrs.st_ctime_ns = mtime_ns
    attrs.entry_timeout = 0  # 2: a path may resolve to another version at the next lookup
    attrs.attr_timeout = 0
    return attrs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fusevol.fuse.follow")
    parser.add_argument("--root", type=Path, required=True)
    args = parser.parse_args(argv)
    root = args.root.absolute()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return side_serve.run(FOLLOW, FollowOperations(layout.pods_dir(root)), root)


if __name__ == "__main__":
    sys.exit(main())
