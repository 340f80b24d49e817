"""The agent's one FUSE mount: pyfuse3.init, main and close.

pyfuse3 keeps its session in a module global, so there is exactly one mount per process
(FUSE.md fact 1); every pod volume is a subtree of it, bind-mounted at the pod's volume directory.
Mount options: `allow_other` (containers run as other uids), `default_permissions` (the kernel
checks modes and owners from our attributes, as on kubelet's tmpfs), and a recognisable fsname.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pyfuse3
import trio

from fusevol.layout import FUSE_SUBTYPE

if TYPE_CHECKING:
    from pathlib import Path

log = logging.getLogger(__name__)

FSNAME = "fusevol"


async def serve(
    operations: pyfuse3.Operations,
    mountpoint: Path,
    *,
    max_tasks: int,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Mount at `mountpoint`, report started, answer requests until cancelled, then unmount."""
    options = {f"fsname={FSNAME}", f"subtype={FUSE_SUBTYPE}", "allow_other", "default_permissions"}
    pyfuse3.init(operations, str(mountpoint), options)
    log.info("FUSE mounted mountpoint=%s", mountpoint)
    try:
        task_status.started()
        await pyfuse3.main(min_tasks=1, max_tasks=max_tasks)
    finally:
        pyfuse3.close(unmount=True)
        log.info("FUSE unmounted mountpoint=%s", mountpoint)
