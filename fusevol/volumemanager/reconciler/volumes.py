"""One interface over every volume type, for the reconciler: set up, refresh, tear down.

Served volumes (configMap, secret, downwardAPI, projected) go to `served.ServedVolumes`: a FUSE
subtree bind-mounted at the pod volume directory, refreshed whenever their inputs change.
Mount-backed volumes (nfs, local, hostPath, emptyDir, gitRepo) go to `mount.plugins.MountPlugins`;
once set up they are never refreshed (as under kubelet, a mount is not redone for a changed spec).
A volume the populator could not resolve (unsupported type, unbound claim) fails with its error.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fusevol.base.errors import VolumeSetupError
from fusevol.mount.batch import Batches, in_thread
from fusevol.mount.plugins import MountPlugins
from fusevol.node import layout
from fusevol.volumemanager.cache.actual import MountedVolume
from fusevol.volumemanager.reconciler.reconstruct import remove_pod_dir
from fusevol.volumemanager.reconciler.served import Prepared, ServedVolumes
from fusevol.volumemanager.reconciler.subpaths import SubpathViews

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Iterable

    from fusevol.fuse.publish import Publisher
    from fusevol.model import ObjectKey, PodUID
    from fusevol.mount.backend import MountBackend
    from fusevol.node.layout import Plugin
    from fusevol.projection.downward import NodeAllocatable
    from fusevol.volumemanager.cache.desired import VolumeToServe
    from fusevol.volumemanager.cache.store import ObjectStore
    from fusevol.volumemanager.reconciler.auditing import Auditing


class Volumes:
    def __init__(
        self,
        *,
        root: Path,
        store: ObjectStore,
        publisher: Publisher,
        backend: MountBackend,
        allocatable: NodeAllocatable,
        observe_propagation: Callable[[float], None] = lambda _: None,
        git_timeout_s: float = 300.0,
        subtree_names: Callable[[bytes], bytes] = lambda readable: readable,
        auditing: Auditing | None = None,
    ) -> None:
        self._root = root
        self._pod_dirs: Batches[Callable[[], object]] = Batches(in_thread)
        self.served = ServedVolumes(
            root=root,
            store=store,
            publisher=publisher,
            backend=backend,
            allocatable=allocatable,
            observe_propagation=observe_propagation,
            subtree_names=subtree_names,
            auditing=auditing,
        )
        self.mounted = MountPlugins(root=root, backend=backend, git_timeout_s=git_timeout_s)
        self.views = SubpathViews(root=root, backend=backend)
        """subPath views of the served volumes, made with them
        (`fusevol.volumemanager.reconciler.subpaths`)."""

    def inputs(self, volume: VolumeToServe) -> Hashable:
        """What the volume is built from; a set-up volume is refreshed when this changes."""
        if volume.plugin is None:
            return (volume.error,)
        if volume.plugin.served_from_memory:
            return self.served.inputs(volume)
        return (volume.source, volume.read_only, volume.mount_options)

    def shared_subtree(self, volume: VolumeToServe) -> bytes | None:
        """The subtree the volume shares with other pods' volumes (None: not shared)."""
        if volume.plugin is None or not volume.plugin.served_from_memory:
            return None
        return self.served.shared_subtree(volume)

    def to_refresh_first(self, changed: Iterable[ObjectKey]) -> list[VolumeToServe]:
        """One user of each shared subtree built from a `changed` object (`ServedVolumes`)."""
        return self.served.to_refresh_first(changed)

    def objects(self, volume: VolumeToServe) -> tuple[ObjectKey, ...]:
        """The objects of the store that the volume's inputs follow (none for a mount)."""
        if volume.plugin is None or not volume.plugin.served_from_memory:
            return ()
        return self.served.objects(volume)

    def is_current(self, volume: VolumeToServe, inputs: Hashable) -> bool:
        """True if the volume's content is built from `inputs` already (a shared subtree that
        another pod's refresh published): its refresh is only to record them (`refreshed`)."""
        return (
            self.shared_subtree(volume) is not None
            and self.served.is_current(volume, inputs)
            and not self.views.missing(volume)  # its path came with this version: bind it
        )

    def refreshed(self, mounted: MountedVolume, inputs: Hashable) -> MountedVolume:
        """`mounted`, now built from `inputs`."""
        return dataclasses.replace(mounted, inputs=inputs, updated_at=time.time())

    def object_versions(self, volume: VolumeToServe) -> dict[str, str | None]:
        """The resourceVersion of every object the volume is built from (None: missing)."""
        if volume.plugin is None or not volume.plugin.served_from_memory:
            return {}
        return self.served.object_versions(volume)

    async def set_up(self, volume: VolumeToServe) -> MountedVolume:
        plugin = _require_plugin(volume)
        if plugin.served_from_memory:
            inputs = await self.served.set_up(volume)
            path = str(self.served.path(volume))
            await self.views.set_up(volume)
        else:
            inputs = self.inputs(volume)
            path = str(await self.mounted.set_up(volume))
        return _mounted(volume, plugin, path, inputs)

    async def prepare(self, volume: VolumeToServe) -> Prepared:
        """A served volume made ready to bind, in a thread, later (`ServedVolumes.prepare`)."""
        _require_plugin(volume)
        return await self.served.prepare(volume)

    def bound(self, volume: VolumeToServe, prepared: Prepared, device: str) -> MountedVolume:
        """The bind of `prepared` was made: the volume, set up as `set_up` leaves one."""
        plugin = _require_plugin(volume)
        self.served.bound(prepared, device)
        return _mounted(volume, plugin, str(prepared.target), prepared.inputs)

    async def unprepare(self, volume: VolumeToServe) -> None:
        """Undo `prepare` of a volume whose bind was never made."""
        await self.served.unprepare(volume.pod.uid, volume.spec_name)

    async def refresh(self, volume: VolumeToServe, mounted: MountedVolume) -> MountedVolume:
        if mounted.plugin.served_from_memory:
            inputs = await self.served.refresh(volume)
            await self.views.set_up(volume)
        else:
            inputs = self.inputs(volume)
        return self.refreshed(mounted, inputs)

    async def tear_down(self, mounted: MountedVolume) -> None:
        if mounted.plugin.served_from_memory:
            await self.views.tear_down(mounted.pod_uid, mounted.spec_name)
            await self.served.tear_down(mounted.pod_uid, mounted.spec_name, Path(mounted.path))
        else:
            await self.mounted.tear_down(mounted.plugin, Path(mounted.path))

    async def remove_pod_dir(self, uid: PodUID) -> None:
        """Remove the pod's directory once none of its volumes is left on the node (directories
        on the node's disk, with nothing mounted below: in batches, as 2000 pods go at once)."""
        pod_dir = layout.pod_dir(self._root, uid)
        await self._pod_dirs.call(functools.partial(remove_pod_dir, pod_dir))


def _mounted(volume: VolumeToServe, plugin: Plugin, path: str, inputs: Hashable) -> MountedVolume:
    """The volume set up at `path` from `inputs`."""
    path = sys.intern(path)  # the mount table holds it too (`MountTable.bound`): one copy
    return MountedVolume(
        volume.name, plugin, volume.pod.uid, volume.spec_name, path, inputs, updated_at=time.time()
    )


def _require_plugin(volume: VolumeToServe) -> Plugin:
    if volume.plugin is None:
        raise VolumeSetupError(volume.error or f"volume {volume.volume.name!r} cannot be served")
    return volume.plugin
