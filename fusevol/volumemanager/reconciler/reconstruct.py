"""What the agent finds on the node when it starts, and the last sweep when it stops.

Reconstruction (kubelet's `reconstruct.go`, docs/kubelet.md fact 9), in order:
    (1) The previous agent's own FUSE mount is dead (its content lived in that process's
        memory): abort and detach it. Its binds at pod volume directories stay, dead: the new
        binds are stacked on them, which is how containers that bound them recover.
    (2) Every `<root>/pods/<uid>/volumes/<plugin dir>/<spec name>` becomes an actual-state entry
        marked UNCERTAIN. The reconciler then sets up those still desired — a no-op for a mount
        that is still there (nfs, local, emptyDir keep their mount and its ID), a fresh serve for
        the volumes served from memory, stacked on the dead bind — and tears down the others
        once every source has been read completely (nothing is torn down before that).
A pod directory is removed only when nothing is left below its `volumes/`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from fusevol.base.errors import MountError
from fusevol.model import PodUID
from fusevol.node import layout
from fusevol.node.layout import Plugin
from fusevol.volumemanager.cache.actual import MountedVolume, MountState
from fusevol.volumemanager.reconciler.subpaths import remove_views

if TYPE_CHECKING:
    from fusevol.mount.backend import MountBackend

log = logging.getLogger(__name__)


async def detach_dead_fuse_mounts(backend: MountBackend, root: Path) -> int:
    """(1) Abort and detach a previous agent's own FUSE mount (below `<root>/fusevol`), deepest
    first. Aborting releases a predecessor stuck on its own mount. Pod volume binds stay: the new
    binds are stacked on them (containers holding rslave copies of them then see the new ones)."""
    prefix = os.path.join(layout.agent_dir(root), "")
    dead = {
        mp.path
        for mp in backend.mount_points()
        if mp.fstype == layout.FUSE_FSTYPE and os.path.join(mp.path, "").startswith(prefix)
    }
    return await _unmount_deepest_first(backend, list(dead), force=True)


async def unmount_all_below(backend: MountBackend, root: Path) -> int:
    """Unmount every mount below `root`, deepest first: the last sweep of a clean stop."""
    prefix = os.path.join(root, "")
    paths = {mp.path for mp in backend.mount_points() if mp.path.startswith(prefix)}
    return await _unmount_deepest_first(backend, list(paths))


def reconstruct(root: Path) -> list[MountedVolume]:
    """(2) The pod volume directories on the node, as UNCERTAIN actual-state entries."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for pod_dir in sorted(layout.pods_dir(root).iterdir()):
            uid = PodUID(pod_dir.name)
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                for plugin_dir in sorted((pod_dir / "volumes").iterdir()):
                    plugin = Plugin.from_dir_name(plugin_dir.name)
                    if plugin is None:
                        log.info("not a fusevol volume, left alone path=%s", plugin_dir)
                        continue
                    for volume_dir in sorted(plugin_dir.iterdir()):
                        found.append(
                            MountedVolume(
                                layout.unique_volume_name(plugin, uid, volume_dir.name),
                                plugin,
                                uid,
                                volume_dir.name,
                                str(volume_dir),
                                inputs=None,
                                state=MountState.UNCERTAIN,
                            )
                        )
    return found


def remove_pod_dir(pod_dir: Path, *, with_volume_dirs: bool = False) -> bool:
    """Remove a pod directory whose volumes are all gone: its empty plugin directories below
    `volumes/` and `plugins/` (volume metadata), those two and itself; with `with_volume_dirs`,
    empty volume directories too (for a final sweep, when no set-up can be creating one). Removes
    nothing that is not empty or still a mount point, and never descends below the volume level.
    Returns True if the pod directory is gone."""
    volumes = pod_dir / "volumes"
    plugins = pod_dir / "plugins"
    if with_volume_dirs:  # subPath views left by a volume whose tear-down did not finish
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            for views in (pod_dir / "volume-subpaths").iterdir():
                remove_views(views)
    for parent in (volumes, plugins):
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            for plugin_dir in parent.iterdir():
                if with_volume_dirs:
                    for volume_dir in plugin_dir.iterdir():
                        with contextlib.suppress(OSError):
                            volume_dir.rmdir()
                with contextlib.suppress(OSError):
                    plugin_dir.rmdir()
    for directory in (volumes, plugins, pod_dir / "volume-subpaths", pod_dir):
        try:
            directory.rmdir()
        except FileNotFoundError:
            continue
        except OSError:
            return False
    return True


def remove_pod_dirs(pods_dir: Path) -> None:
    """Remove every pod directory below `pods_dir` that holds no mounted volume any more."""
    with contextlib.suppress(FileNotFoundError):
        for pod_dir in pods_dir.iterdir():
            remove_pod_dir(pod_dir, with_volume_dirs=True)


async def _unmount_deepest_first(
    backend: MountBackend, paths: list[str], *, force: bool = False
) -> int:
    count = 0
    for path in sorted(paths, key=lambda p: (-p.count(os.sep), p)):
        try:
            await backend.unmount(Path(path), force=force)
            count += 1
            log.info("mount removed path=%s", path)
        except MountError as exc:
            log.error("cannot remove mount path=%s error=%s", path, exc)
    return count
