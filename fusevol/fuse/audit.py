"""The audit file system: audited volumes, served so that every open of their files is recorded.

The agent's own mount lets the kernel open files without asking (docs/fuse.md fact 4): the fast
read path, and blind. An audited volume is bound at its pod volume directory from this second,
small FUSE file system instead, which mirrors the agent's mount and answers each open itself:

    <root>/fusevol/audit/<subtree>/...  ->  <root>/fusevol/mnt/<subtree>/..., looked up anew

1. Only audited subtrees are reachable (those the audit index names: `fusevol.fuse.audit_index`);
   its root lists nothing, and sits in `<root>/fusevol/` (0700): a container reaches a volume only
   through its bind, a host user not at all.
2. A node's number is its number on the agent's mount, whose versions are new nodes, never
   changed (docs/fuse.md fact 4): one page cache a version's file, so opens keep the cache
   (FOPEN_KEEP_CACHE) and a second read of a file costs what it costs on the agent's mount.
   Entries and attributes are kept as long as the agent's mount keeps them: every change is
   made through this mount (4), so a path walk asks nothing and only the open reaches the server.
3. Every open reaches this server (nothing negotiates no_open here) and is recorded before it is
   answered, while the caller waits in open(2), so its process is still there to be described
   (`fusevol.fuse.callers`): the record (`fusevol.fuse.audit_records`) names the version the open
   resolved to, which the file descriptor then pins. A record that cannot be written fails the
   open (EIO): nothing is read unrecorded.
4. The publisher's structural operations on an audited volume (mkdir, symlink, rename, unlink,
   rmdir: `fusevol.fuse.publish`, `Publisher.route`) are made through this mount and passed on
   to the agent's, as the publisher (this process takes its group): the kernel then updates this
   mount's caches itself, and inotify watchers of an audited volume see kubelet's events
   (docs/fuse.md fact 2). Anyone else gets EROFS (the pods' binds are read-only besides);
   permission checks are the kernel's (`default_permissions`) on the modes and owners of the
   agent's mount.

Served by its own process (`python -m fusevol.fuse.audit --root DIR`, started by the agent when a
volume is audited, or by the chart's audit DaemonSet: `fusevol.fuse.servers`), which holds no
state but the numbers the kernel knows, so it outlives agent restarts: it reaches the agent's
mount by its path, whichever agent serves it. It reads file contents into memory only, for the
read that asked, and never logs or records one.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pyfuse3
import trio

from fusevol.fuse import side_serve
from fusevol.fuse.answering import answering_errors
from fusevol.fuse.audit_index import IndexReader
from fusevol.fuse.audit_records import RecordFile, now, record, records_path
from fusevol.fuse.callers import Callers
from fusevol.fuse.servers import AUDIT
from fusevol.fuse.side_serve import SideOperations
from fusevol.fuse.vfs_helper import PUBLISHER_GID
from fusevol.node import layout

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

_TIMEOUT_S = 300.0
"""How long the kernel keeps entries and attributes (the agent's mount's default): every change
of an audited volume is made through this mount (4), so the kernel updates them itself."""


class AuditOperations(SideOperations):
    enable_symlink_cache = True
    """2: a link's number is its number on the agent's mount, where a link never changes (a new
    `..data` is a new link), so its target may be kept (fusevol's patched pyfuse3 asks for it)."""

    def __init__(
        self, source: Path, *, index: IndexReader, records: RecordFile, callers: Callers
    ) -> None:
        """`source`: the agent's mountpoint."""
        super().__init__()
        self._source = os.fsencode(source)
        self._index = index
        self._records = records
        self._callers = callers
        self._paths: dict[int, tuple[bytes, ...]] = {pyfuse3.ROOT_INODE: ()}
        self._lookups: dict[int, int] = {}

    # -- 1, 2. paths and numbers -------------------------------------------------------------------

    def _real(self, parts: tuple[bytes, ...]) -> bytes:
        return os.path.join(self._source, *parts)

    def _parts(self, inode: int) -> tuple[bytes, ...]:
        try:
            return self._paths[inode]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ESTALE) from None

    async def _stat(self, parts: tuple[bytes, ...]) -> pyfuse3.EntryAttributes:
        try:
            st = await trio.to_thread.run_sync(os.lstat, self._real(parts))
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
        inode = pyfuse3.ROOT_INODE if not parts else st.st_ino
        if parts:
            self._paths[inode] = parts
        return _attributes(inode, st)

    @answering_errors
    async def lookup(
        self, parent_inode: pyfuse3.InodeT, name: pyfuse3.FileNameT, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        parent = self._parts(parent_inode)
        if name in (b".", b".."):
            raise pyfuse3.FUSEError(errno.ENOENT)
        if not parent and not await trio.to_thread.run_sync(self._index.audited, bytes(name)):
            raise pyfuse3.FUSEError(errno.ENOENT)  # 1: not an audited subtree
        attrs = await self._stat((*parent, bytes(name)))
        self._lookups[attrs.st_ino] = self._lookups.get(attrs.st_ino, 0) + 1
        return attrs

    async def forget(self, inode_list: Sequence[tuple[pyfuse3.InodeT, int]]) -> None:
        for inode, count in inode_list:
            left = self._lookups.get(inode, 0) - count
            if left > 0:
                self._lookups[inode] = left
            else:
                self._lookups.pop(inode, None)
                if inode != pyfuse3.ROOT_INODE:
                    self._paths.pop(inode, None)

    @answering_errors
    async def getattr(
        self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        return await self._stat(self._parts(inode))

    @answering_errors
    async def readlink(self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext) -> bytes:
        try:
            return await trio.to_thread.run_sync(os.readlink, self._real(self._parts(inode)))
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None

    # -- 3. opens, recorded ------------------------------------------------------------------------

    @answering_errors
    async def open(
        self, inode: pyfuse3.InodeT, flags: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.FileInfo:
        self._refuse_writing(flags)
        parts = self._parts(inode)
        # On this thread: a few system calls, none of which waits for the agent while the kernel
        # holds the path (the open of the agent's mount only, and then only if the agent is not
        # answering, when the file could not be read anyway); a worker thread cost 70 µs an open.
        fd = self._open(parts, ctx.pid, ctx.uid, ctx.gid)
        return pyfuse3.FileInfo(fh=fd, keep_cache=True)

    def _open(self, parts: tuple[bytes, ...], pid: int, uid: int, gid: int) -> int:
        received = now()
        try:
            fd = os.open(self._real(parts), os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
        try:
            reader = self._callers.describe(pid, uid, gid)
            subtree, version, path = parts[0], b"".join(parts[1:2]), b"/".join(parts[2:])
            found = self._index.find(subtree, version, os.fsdecode(path))
            event = record(
                reader=reader,
                found=found,
                version=os.fsdecode(version),
                path=os.fsdecode(path),
                received=received,
            )
            self._records.write(event)
        except Exception:
            os.close(fd)
            log.exception("an open could not be recorded: refused")
            raise pyfuse3.FUSEError(errno.EIO) from None
        return fd

    # -- directories -------------------------------------------------------------------------------

    @answering_errors
    async def opendir(
        self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.FileHandleT:
        parts = self._parts(inode)
        entries: list[tuple[bytes, pyfuse3.EntryAttributes]] = []
        if parts:  # 1: the root lists nothing
            try:
                names = await trio.to_thread.run_sync(os.listdir, self._real(parts))
            except OSError as exc:
                raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
            for name in sorted(names):
                try:
                    entries.append((name, await self._stat((*parts, name))))
                except pyfuse3.FUSEError:
                    continue  # gone with the version listed
        return self._new_dir(entries)

    @answering_errors
    async def readdir(
        self, fh: pyfuse3.FileHandleT, start_id: int, token: pyfuse3.ReaddirToken
    ) -> None:
        entries = self._dirs.get(fh, [])
        for offset, (name, attrs) in enumerate(entries[start_id:], start=start_id + 1):
            if not pyfuse3.readdir_reply(token, name, attrs, offset):
                return
            self._lookups[attrs.st_ino] = self._lookups.get(attrs.st_ino, 0) + 1

    # -- 4. the publisher's operations, passed on --------------------------------------------------

    @answering_errors
    async def mkdir(
        self,
        parent_inode: pyfuse3.InodeT,
        name: pyfuse3.FileNameT,
        mode: int,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        parts = self._child(parent_inode, name, ctx)
        await self._pass_on(os.mkdir, self._real(parts), mode)
        return await self._entry(parts)

    @answering_errors
    async def symlink(
        self,
        parent_inode: pyfuse3.InodeT,
        name: pyfuse3.FileNameT,
        target: pyfuse3.FileNameT,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        parts = self._child(parent_inode, name, ctx)
        await self._pass_on(os.symlink, bytes(target), self._real(parts))
        return await self._entry(parts)

    @answering_errors
    async def rename(
        self,
        parent_inode_old: pyfuse3.InodeT,
        name_old: pyfuse3.FileNameT,
        parent_inode_new: pyfuse3.InodeT,
        name_new: pyfuse3.FileNameT,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> None:
        if flags:
            raise pyfuse3.FUSEError(errno.EINVAL)
        old = self._child(parent_inode_old, name_old, ctx)
        new = self._child(parent_inode_new, name_new, ctx)
        await self._pass_on(os.rename, self._real(old), self._real(new))
        moved = await self._stat(new)  # its number now stands for the new path
        self._paths[moved.st_ino] = new

    @answering_errors
    async def unlink(
        self, parent_inode: pyfuse3.InodeT, name: pyfuse3.FileNameT, ctx: pyfuse3.RequestContext
    ) -> None:
        await self._pass_on(os.unlink, self._real(self._child(parent_inode, name, ctx)))

    @answering_errors
    async def rmdir(
        self, parent_inode: pyfuse3.InodeT, name: pyfuse3.FileNameT, ctx: pyfuse3.RequestContext
    ) -> None:
        await self._pass_on(os.rmdir, self._real(self._child(parent_inode, name, ctx)))

    def _child(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> tuple[bytes, ...]:
        """The path of `name` in `parent_inode`, for one of the publisher's own operations
        (root with its group: `fusevol.fuse.vfs_helper`); anyone else's is refused."""
        if not (ctx.uid == 0 and ctx.gid == PUBLISHER_GID):
            raise pyfuse3.FUSEError(errno.EROFS)
        if name in (b".", b"..") or b"/" in name:
            raise pyfuse3.FUSEError(errno.EINVAL)
        return (*self._parts(parent_inode), bytes(name))

    async def _pass_on(self, operation: Callable[..., object], *args: object) -> None:
        """Make the operation on the agent's mount, as the publisher (this process runs with
        its group): the agent applies it to its tree."""
        try:
            await trio.to_thread.run_sync(lambda: operation(*args))
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None

    async def _entry(self, parts: tuple[bytes, ...]) -> pyfuse3.EntryAttributes:
        attrs = await self._stat(parts)
        self._lookups[attrs.st_ino] = self._lookups.get(attrs.st_ino, 0) + 1
        return attrs


def _attributes(inode: int, st: os.stat_result) -> pyfuse3.EntryAttributes:
    attrs = pyfuse3.EntryAttributes()
    attrs.st_ino = inode
    attrs.st_mode = st.st_mode
    attrs.st_nlink = st.st_nlink
    attrs.st_uid = st.st_uid
    attrs.st_gid = st.st_gid
    attrs.st_size = st.st_size
    attrs.st_blksize = 4096
    attrs.st_blocks = (st.st_size + 511) // 512
    attrs.st_atime_ns = st.st_atime_ns
    attrs.st_mtime_ns = st.st_mtime_ns
    attrs.st_ctime_ns = st.st_ctime_ns
    attrs.entry_timeout = _TIMEOUT_S  # 2
    attrs.attr_timeout = _TIMEOUT_S
    return attrs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fusevol.fuse.audit")
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument(
        "--runtime-state",
        type=Path,
        default=None,
        help="containerd's state directory, for containers' names (default: none read)",
    )
    parser.add_argument(
        "--stay",
        action="store_true",
        help="serve until stopped, even with no volume audited and no agent (a supervisor's "
        "server: the chart's audit DaemonSet)",
    )
    args = parser.parse_args(argv)
    root = args.root.absolute()
    os.umask(0o077)  # the records: root's alone
    os.setgroups([])
    os.setgid(PUBLISHER_GID)  # 4: what it passes on to the agent's mount is the publisher's
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    records = RecordFile(records_path(root))
    operations = AuditOperations(
        layout.fuse_mountpoint(root),
        index=IndexReader(root),
        records=records,
        callers=Callers(args.runtime_state),
    )
    try:
        return side_serve.run(AUDIT, operations, root, idle_exit=not args.stay, read_only=False)
    finally:
        records.close()


if __name__ == "__main__":
    sys.exit(main())
