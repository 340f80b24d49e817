"""What the two side file systems (`fusevol.fuse.servers`: follow, audit) share: the handlers
they answer alike (`SideOperations`), and their process' serving loop (`run`): mount, answer
requests until SIGTERM or SIGINT, or until idle (nothing of it bound and no agent on the root for
a few seconds), unmount. The follow and audit servers' `main` both end here.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import time
from typing import TYPE_CHECKING, Any

import pyfuse3
import trio

from fusevol.fuse.answering import Failures, answering_errors

if TYPE_CHECKING:
    from pathlib import Path

    from fusevol.fuse.servers import SideServer

log = logging.getLogger(__name__)

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT


class SideOperations(pyfuse3.Operations):
    """A file handle is a descriptor the server opened on the file it stands for: reads are
    preads of it, its release closes it. Directory handles index `_dirs`, which `opendir` fills.
    statfs is a constant; a change of a file (setattr, create, write) is refused (EROFS)."""

    supports_dot_lookup = False
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self) -> None:
        super().__init__()
        self.failures = Failures()
        """Requests answered EIO for an unexpected exception (`fusevol.fuse.answering`)."""
        self._dirs: dict[int, list[Any]] = {}
        self._next_dir = 1

    @staticmethod
    def _refuse_writing(flags: int) -> None:
        """EROFS for an open that asks to write: both mirror files only to read."""
        if flags & _WRITE_FLAGS:
            raise pyfuse3.FUSEError(errno.EROFS)

    def _new_dir(self, entries: list[Any]) -> pyfuse3.FileHandleT:
        handle = self._next_dir
        self._next_dir += 1
        self._dirs[handle] = entries
        return pyfuse3.FileHandleT(handle)

    @answering_errors
    async def read(self, fh: pyfuse3.FileHandleT, off: int, size: int) -> bytes:
        try:
            return await trio.to_thread.run_sync(os.pread, fh, size, off)
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None

    @answering_errors
    async def release(self, fh: pyfuse3.FileHandleT) -> None:
        os.close(fh)

    @answering_errors
    async def releasedir(self, fh: pyfuse3.FileHandleT) -> None:
        self._dirs.pop(fh, None)

    @answering_errors
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        stats = pyfuse3.StatvfsData()
        stats.f_bsize = stats.f_frsize = 4096
        stats.f_namemax = 255
        return stats

    @answering_errors
    async def setattr(self, *args: object) -> pyfuse3.EntryAttributes:
        raise pyfuse3.FUSEError(errno.EROFS)

    @answering_errors
    async def create(self, *args: object) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        raise pyfuse3.FUSEError(errno.EROFS)

    @answering_errors
    async def write(self, fh: pyfuse3.FileHandleT, off: int, buf: bytes) -> int:
        raise pyfuse3.FUSEError(errno.EROFS)


IDLE_EXIT_S = 5.0
"""Without any bind of it and without an agent for this long, a server unmounts and exits."""


def run(
    server: SideServer,
    operations: pyfuse3.Operations,
    root: Path,
    *,
    idle_exit: bool = True,
    read_only: bool = True,
) -> int:
    """Take the server's lock, mount `operations` read-only at its mountpoint and serve; 0 at
    once if another server of the root holds the lock. Without `idle_exit`, serve until
    stopped (a supervisor's server: the chart's audit DaemonSet). Without `read_only`, the
    mount takes structural operations, which the server decides on (the audit server's are
    the agent's publisher's)."""
    # A supervisor's server waits for one the agent started to go (idle, once the agent binds
    # nothing more of it) rather than exit and be restarted again and again.
    lock = server.take_lock(root, wait=not idle_exit)
    if lock is None:
        return 0  # another server serves this root
    mountpoint = server.mountpoint(root)
    mountpoint.mkdir(mode=0o755, exist_ok=True)
    options = {
        f"fsname={server.subtype}",
        f"subtype={server.subtype}",
        "allow_other",
        "default_permissions",
        *(["ro"] if read_only else []),
    }
    pyfuse3.init(operations, str(mountpoint), options)
    log.info("%s server serving mountpoint=%s pid=%d", server.name, mountpoint, os.getpid())
    try:
        trio.run(_serve, server, root, idle_exit)
    finally:
        pyfuse3.close(unmount=True)
        os.close(lock)
    return 0


async def _serve(server: SideServer, root: Path, idle_exit: bool) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pyfuse3.main)

            async def stop_on_signal() -> None:
                async for signum in signals:
                    name = signal.Signals(signum).name
                    log.info("%s server stopping signal=%s", server.name, name)
                    nursery.cancel_scope.cancel()
                    return

            async def stop_when_idle() -> None:
                idle_since = None
                while True:
                    await trio.sleep(1.0)
                    # Abandoned on a stop: once pyfuse3.main is cancelled nothing answers this
                    # server's own requests, and a thread left waiting on one would keep the
                    # process alive for ever (until close() ends the connection).
                    busy = await trio.to_thread.run_sync(
                        server.in_use, root, abandon_on_cancel=True
                    )
                    now = time.monotonic()
                    idle_since = None if busy else idle_since or now
                    if idle_since is not None and now - idle_since >= IDLE_EXIT_S:
                        log.info("%s server idle, stopping: nothing bound, no agent", server.name)
                        nursery.cancel_scope.cancel()
                        return

            nursery.start_soon(stop_on_signal)
            if idle_exit:
                nursery.start_soon(stop_when_idle)
