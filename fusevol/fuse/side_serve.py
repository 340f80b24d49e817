"""The serving loop of a side file system's process (`fusevol.fuse.servers`): mount, answer
requests until SIGTERM or SIGINT, or until idle (nothing of it bound and no agent on the root for
a few seconds), unmount. The follow and audit servers' `main` both end here.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import TYPE_CHECKING

import pyfuse3
import trio

if TYPE_CHECKING:
    from pathlib import Path

    from fusevol.fuse.servers import SideServer

log = logging.getLogger(__name__)

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
