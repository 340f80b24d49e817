"""subPath views of served volumes: set up with their volume, kept, torn down with it.

For every container mount with a subPath (or subPathExpr) into a configMap, secret, downwardAPI
or projected volume, the agent binds the follow file system's node of that path
(`fusevol.fuse.follow`) read-only at kubelet's place for it:

    <root>/pods/<uid>/volume-subpaths/<volume>/<container>/<index>   (a file or a directory)

1. `set_up(volume)`, after the volume is served (its set-up and every refresh; a volume whose
   shared subtree another pod refreshed is refreshed itself while a view is `missing`): start
   the follow server if needed, then for each such mount whose path exists in the current
   version, create the target (an empty file, or a directory, as kubelet does) and bind the view;
   a view already bound and alive is left as it is, a dead one (a follow server that died) gets a
   new bind on top. A subPath that does not exist (yet) or cannot be expanded is logged and
   skipped: the volume itself is served, the view is made at the next refresh that brings the
   path, and `fusevol mounts` names the mount until then. A view never fails its volume (nor
   does a follow server that cannot start): the error is logged, `fusevol wait` names it.
2. `tear_down(uid, volume)`, before the volume goes: every view of the volume unmounted, its
   targets and directories removed.
Views outlive agent restarts with the follow server; the next agent finds them bound.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from fusevol.base.errors import MountError, VolumeSetupError
from fusevol.base.fsutil import mkdir_all
from fusevol.fuse.servers import FOLLOW
from fusevol.node import layout
from fusevol.node.container_mounts import SubPathError, mount_subpath

if TYPE_CHECKING:
    from fusevol.model import PodUID
    from fusevol.mount.backend import MountBackend
    from fusevol.volumemanager.cache.desired import VolumeToServe

log = logging.getLogger(__name__)


def views_dir(root: Path, uid: PodUID, volume: str) -> Path:
    return layout.pod_dir(root, uid) / "volume-subpaths" / volume


class SubpathViews:
    def __init__(self, *, root: Path, backend: MountBackend) -> None:
        self._root = root
        self._backend = backend

    def wanted(self, volume: VolumeToServe) -> list[tuple[str, int, str]]:
        """(container, index, subPath) of every mount of the volume with a subPath."""
        if volume.target is not None or volume.plugin is None:
            return []  # a CSI volume: kubelet makes its subPath mounts
        pod, name = volume.pod, volume.volume.name
        found = []
        for container in (*pod.init_containers, *pod.containers):
            for index, mount in enumerate(container.volume_mounts):
                if mount.name != name or not (mount.sub_path or mount.sub_path_expr):
                    continue
                try:
                    sub_path = mount_subpath(pod, container, index)
                except SubPathError as exc:
                    log.error(
                        "subPath view skipped pod=%s/%s error=%s", pod.namespace, pod.name, exc
                    )
                    continue
                if sub_path:
                    found.append((container.name, index, sub_path))
        return found

    def missing(self, volume: VolumeToServe) -> bool:
        """A view of the volume is not bound yet (its path may have come with a version that
        another pod's refresh of a shared subtree published: the volume must be refreshed)."""
        return any(
            not self._backend.is_mount_point(self._target(volume, container, index))
            for container, index, _ in self.wanted(volume)
        )

    def _target(self, volume: VolumeToServe, container: str, index: int) -> Path:
        return views_dir(self._root, volume.pod.uid, volume.volume.name) / container / str(index)

    async def set_up(self, volume: VolumeToServe) -> None:
        wanted = self.wanted(volume)
        if not wanted:
            return
        assert volume.plugin is not None
        try:
            await trio.to_thread.run_sync(FOLLOW.ensure_running, self._root)
        except (VolumeSetupError, OSError) as exc:  # the volume is served all the same
            log.error("subPath views not made pod=%s/%s error=%s", *_pod(volume), exc)
            return
        follow = FOLLOW.mountpoint(self._root)
        base = follow / volume.pod.uid / volume.plugin.dir_name / volume.spec_name
        for container, index, sub_path in wanted:
            source, target = base / sub_path, self._target(volume, container, index)
            try:
                await self._bind(source, target)
            except (OSError, MountError) as exc:
                log.error(
                    "subPath view not made pod=%s/%s container=%s volume=%s subPath=%s error=%s",
                    volume.pod.namespace,
                    volume.pod.name,
                    container,
                    volume.volume.name,
                    sub_path,
                    exc,
                )

    async def _bind(self, source: Path, target: Path) -> None:
        # Stats reach the follow server, which reads through our own FUSE mount: in a thread.
        is_dir = await trio.to_thread.run_sync(_stat_is_dir, source)
        if self._backend.is_mount_point(target):
            if await trio.to_thread.run_sync(_alive, target):
                return
        else:
            await trio.to_thread.run_sync(_make_target, target, is_dir)
        await self._backend.bind(source, target, read_only=True, stack=True)
        log.info("subPath view bound target=%s", target)

    async def tear_down(self, uid: PodUID, volume: str) -> None:
        top = views_dir(self._root, uid, volume)
        if not await trio.to_thread.run_sync(os.path.isdir, top):
            return
        prefix = os.path.join(await trio.to_thread.run_sync(os.path.realpath, top), "")
        for mp in self._backend.mount_points():
            if mp.path.startswith(prefix):
                await self._backend.unmount(Path(mp.path))
        await trio.to_thread.run_sync(remove_views, top)


def _pod(volume: VolumeToServe) -> tuple[str, str]:
    return volume.pod.namespace, volume.pod.name


def remove_views(top: Path) -> None:
    """Remove a volume's view targets and directories (`top/<container>/<index>`), then
    `volume-subpaths` itself if it is empty. A target still mounted stays (EBUSY), and nothing
    below a target is ever touched."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for container in top.iterdir():
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                for target in container.iterdir():
                    with contextlib.suppress(OSError):
                        if target.is_symlink() or not target.is_dir():
                            target.unlink()
                        else:
                            target.rmdir()
            with contextlib.suppress(OSError):
                container.rmdir()
    for directory in (top, top.parent):
        with contextlib.suppress(OSError):
            directory.rmdir()


def _stat_is_dir(path: Path) -> bool:
    return os.path.isdir(path) if os.path.exists(path) else _missing(path)


def _missing(path: Path) -> bool:
    raise FileNotFoundError(
        2, "no such file or directory in the volume's current version", str(path)
    )


def _alive(path: Path) -> bool:
    try:
        os.stat(path)
    except OSError:
        return False
    return True


def _make_target(target: Path, is_dir: bool) -> None:
    mkdir_all(target.parent, 0o750)
    if is_dir:
        with contextlib.suppress(FileExistsError):
            target.mkdir(mode=0o750)
    else:
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o640))
