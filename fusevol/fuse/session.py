"""The agent's one FUSE mount: pyfuse3.init, main and close.

pyfuse3 keeps its session in a module global, so there is exactly one mount per process
(docs/fuse.md fact 1); every pod volume is a subtree of it, bind-mounted at the pod's volume
directory. Mount options: `allow_other` (containers run as other uids), `default_permissions` (the
kernel checks modes and owners from our attributes, as on kubelet's tmpfs), and a recognisable
fsname.

Which pyfuse3 serves the mount is logged: fusevol's patched build (`.ci/install-pyfuse3`) gives
the fast read path (`fusevol.fuse.ops`), stock pyfuse3 works without it.
"""

from __future__ import annotations

import importlib.metadata
import logging
from typing import TYPE_CHECKING

import pyfuse3
import trio

from fusevol.layout import FUSE_SUBTYPE

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

log = logging.getLogger(__name__)

FSNAME = "fusevol"


def has_fast_read_path() -> bool:
    """True if the installed pyfuse3 can negotiate symlink caching and no_open (the patched one)."""
    return hasattr(pyfuse3, "negotiated_capabilities")


async def serve(
    operations: pyfuse3.Operations,
    mountpoint: Path,
    *,
    max_tasks: int,
    unmount: Callable[[], bool] = lambda: True,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Mount at `mountpoint`, report started, answer requests until cancelled, then unmount
    unless `unmount()` says no (a lame duck's mountpoint is the next agent's: fusevol.handover);
    closing the session aborts the connection either way."""
    options = {f"fsname={FSNAME}", f"subtype={FUSE_SUBTYPE}", "allow_other", "default_permissions"}
    pyfuse3.init(operations, str(mountpoint), options)
    log.info(
        "FUSE mounted mountpoint=%s pyfuse3=%s fast_read_path=%s",
        mountpoint,
        importlib.metadata.version("pyfuse3"),
        "yes" if has_fast_read_path() else "no (stock pyfuse3: see .ci/install-pyfuse3)",
    )
    try:
        task_status.started()
        await pyfuse3.main(min_tasks=1, max_tasks=max_tasks)
    finally:
        detach = unmount()
        pyfuse3.close(unmount=detach)
        log.info("FUSE %s mountpoint=%s", "unmounted" if detach else "closed", mountpoint)
