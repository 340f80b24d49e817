"""`fusevol teardown`: what the agent's tearing-down stop does last, for a root no agent runs on."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import trio

from fusevol.agent.handover import find_predecessor
from fusevol.agent.lock import AgentLock
from fusevol.base import log
from fusevol.base.settings import MountSettings
from fusevol.fuse.servers import SERVERS
from fusevol.mount.linux import LinuxMountBackend
from fusevol.node import layout
from fusevol.volumemanager.reconciler.reconstruct import (
    detach_dead_fuse_mounts,
    remove_pod_dirs,
    unmount_all_below,
)

if TYPE_CHECKING:
    import argparse
    from pathlib import Path


async def tear_down(root: Path, *, command_timeout_s: float) -> int:
    """`fusevol teardown`: what SIGINT's stop does last, for a root no agent runs on (after a
    handing-over stop, or a crash): unmount every pod volume (a lame duck's, live, or dead ones),
    remove the pod directories, detach a dead FUSE mount, and let a lame duck go. Refused while
    an agent runs. Returns the number of mounts removed."""
    backend = LinuxMountBackend(command_timeout_s=command_timeout_s)
    lock = await AgentLock.acquire(root, backend)
    try:
        predecessor = await find_predecessor(layout.handover_socket(root))
        removed = await unmount_all_below(backend, layout.pods_dir(root))
        await trio.to_thread.run_sync(remove_pod_dirs, layout.pods_dir(root))
        for server in SERVERS:  # their binds are gone
            await trio.to_thread.run_sync(server.stop, root)
        removed += await detach_dead_fuse_mounts(backend, root)
        if predecessor is not None:  # its binds are gone: nothing left to serve
            await predecessor.release()
        return removed
    finally:
        lock.release()
        backend.close()


def main(args: argparse.Namespace) -> int:
    log.setup("info")
    removed = trio.run(
        functools.partial(
            tear_down,
            args.root.absolute(),
            command_timeout_s=MountSettings().command_timeout_s,
        )
    )
    print(f"fusevol: {removed} mounts removed below {args.root}")
    return 0
