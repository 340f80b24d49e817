"""What the agent finds on the node when it starts.

A previous agent that was killed leaves its FUSE mount dead (ENOTCONN) and the pod bind mounts of
it dead too. Their content lived in that agent's memory, so nothing can be adopted from them: they
are detached (deepest first) and the reconciler sets every desired volume up afresh. Pod
directories of pods no longer desired are removed by the reconciler once empty.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from fusevol.errors import MountError
from fusevol.reconciler.volumes import remove_pod_dir

if TYPE_CHECKING:
    from fusevol.mount.backend import MountBackend

log = logging.getLogger(__name__)


async def clean_stale_mounts(backend: MountBackend, root: Path) -> int:
    """Unmount every mount below `root`, deepest first. Returns how many were unmounted."""
    prefix = os.path.join(root, "")  # root is absolute (Settings)
    stale = sorted(
        {mp.path for mp in backend.mount_points() if mp.path.startswith(prefix)},
        key=lambda p: (-p.count(os.sep), p),
    )
    count = 0
    for path in stale:
        try:
            await backend.unmount(Path(path))
            count += 1
            log.info("stale mount removed path=%s", path)
        except MountError as exc:
            log.error("cannot remove stale mount path=%s error=%s", path, exc)
    return count


def remove_pod_dirs(pods_dir: Path) -> None:
    """Remove every pod directory below `pods_dir` that holds no mounted volume any more."""
    with contextlib.suppress(FileNotFoundError):
        for pod_dir in pods_dir.iterdir():
            remove_pod_dir(pod_dir, with_volume_dirs=True)
