"""Set-up, refresh and tear-down of the volumes served from memory.

configMap, secret, downwardAPI and projected volumes; their payload rules are in
`fusevol.projection`, their fsGroup ownership in `fusevol.projection.ownership`.

A served volume is three things: a subtree on the agent's FUSE mount holding kubelet's
AtomicWriter layout, the pod volume directory, and a read-only, shared bind mount of the first on
the second. After a restart the new bind is stacked on the previous agent's (dead or handed-over)
one, so that containers whose copy of it receives propagation (rslave) switch to the new one; the
covered one goes when the volume is torn down. Containers always get these volume types read-only
(KUBELET.md A1), so the bind is too; only the agent writes, through its own mount.

Every operation renders the payload first, so bad input (a missing object or key, an invalid path)
fails before anything on the node changes: a new volume leaves nothing behind, and a served one
keeps its last good content, as kubelet does.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import time
from typing import TYPE_CHECKING

import trio

from fusevol import layout
from fusevol.errors import VolumeSetupError
from fusevol.fsutil import mkdir_all
from fusevol.layout import Plugin
from fusevol.model import (
    ConfigMap,
    ConfigMapProjection,
    ConfigMapVolumeSource,
    DownwardAPIProjection,
    DownwardAPIVolumeSource,
    Kind,
    ObjectKey,
    ProjectedVolumeSource,
    Secret,
    SecretProjection,
    SecretVolumeSource,
    ServiceAccountToken,
    ServiceAccountTokenProjection,
    token_key,
)
from fusevol.projection import configmap, downward, ownership, projected, secret

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable
    from pathlib import Path

    from fusevol.cache.desired import VolumeToServe
    from fusevol.cache.store import ObjectStore
    from fusevol.fuse.publish import Publisher
    from fusevol.model import Payload, PodUID
    from fusevol.mount.backend import MountBackend
    from fusevol.projection.downward import NodeAllocatable

ROOT_MODES = {
    # The wrapped emptyDir: a disk directory created 0777 for configMap, a tmpfs (mode 1777) for
    # the others (KUBELET.md A1).
    Plugin.CONFIG_MAP: 0o777,
    Plugin.SECRET: 0o1777,
    Plugin.DOWNWARD_API: 0o1777,
    Plugin.PROJECTED: 0o1777,
}


class ServedVolumes:
    def __init__(
        self,
        *,
        root: Path,
        store: ObjectStore,
        publisher: Publisher,
        backend: MountBackend,
        allocatable: NodeAllocatable,
        observe_propagation: Callable[[float], None] = lambda _: None,
    ) -> None:
        """`observe_propagation(seconds)`: after each refresh that published a new version, the
        time since the change of the newest object it depends on."""
        self._observe_propagation = observe_propagation
        self._root = root
        self._store = store
        self._publisher = publisher
        self._backend = backend
        self._allocatable = allocatable

    def path(self, volume: VolumeToServe) -> Path:
        assert volume.plugin is not None
        return layout.volume_dir(self._root, volume.pod.uid, volume.plugin, volume.spec_name)

    def inputs(self, volume: VolumeToServe) -> Hashable:
        """What the volume's content depends on: its spec, the pod's fsGroup, the versions of its
        objects, and for the downward API the pod itself."""
        pod = volume.pod if _uses_downward_api(volume) else None
        return (volume.source, volume.pod.fs_group, pod, *self._object_versions(volume))

    async def set_up(self, volume: VolumeToServe) -> Hashable:
        """Serve the volume at its pod volume directory; returns the inputs it was built from."""
        inputs = self.inputs(volume)  # before rendering: a change while we work means a refresh
        payload = self.render(volume)
        assert volume.plugin is not None
        name = layout.fuse_name(volume.pod.uid, volume.spec_name)
        target = self.path(volume)
        fs_group = volume.pod.fs_group
        try:
            await self._publisher.create_volume(
                name,
                mode=ownership.dir_mode(ROOT_MODES[volume.plugin], fs_group),
                gid=fs_group or 0,
                nested=nested_mountpoints(volume),
                nested_mode=ownership.dir_mode(0o755, fs_group),
            )
            await self._publish(name, volume, payload)
            if not self._backend.is_mount_point(target):  # else a predecessor's bind, dead or not
                await trio.to_thread.run_sync(mkdir_all, target, 0o750)
            # Stacked on a predecessor's bind, so that containers holding an rslave copy of it
            # see the new one (README, "Restarts"); a no-op if ours is already there.
            await self._backend.bind(self._publisher.path(name), target, read_only=True, stack=True)
        except BaseException:
            with contextlib.suppress(Exception):
                await self.tear_down(volume.pod.uid, volume.spec_name, target)
            raise
        return inputs

    async def refresh(self, volume: VolumeToServe) -> Hashable:
        """Publish the volume's current content; returns the inputs it was built from."""
        inputs = self.inputs(volume)
        payload = self.render(volume)
        name = layout.fuse_name(volume.pod.uid, volume.spec_name)
        if await self._publish(name, volume, payload):
            keys = [*_referenced_objects(volume), volume.pod.key]
            changes = [t for t in map(self._store.changed_at, keys) if t is not None]
            if changes:
                self._observe_propagation(time.monotonic() - max(changes))
        return inputs

    async def _publish(self, name: bytes, volume: VolumeToServe, payload: Payload) -> bool:
        fs_group = volume.pod.fs_group
        return await self._publisher.publish(
            name,
            ownership.apply_fs_group(payload, fs_group),
            gid=fs_group,
            dir_mode=ownership.dir_mode(0o755, fs_group),
        )

    async def tear_down(self, uid: PodUID, spec_name: str, target: Path) -> None:
        # Paths near mounts may reach a FUSE server, our own included: never on the trio thread.
        await self._backend.unmount(target)
        await trio.to_thread.run_sync(_remove_dir, target)
        await self._publisher.remove_volume(layout.fuse_name(uid, spec_name))

    def render(self, volume: VolumeToServe) -> Payload:
        """The volume's payload, or VolumeSetupError / InvalidPayload naming what is wrong."""
        match volume.source:
            case ConfigMapVolumeSource() as source:
                key = ObjectKey(Kind.CONFIG_MAP, volume.pod.namespace, source.name)
                return configmap.make_payload(source, self._store.get(key, ConfigMap))
            case SecretVolumeSource() as source:
                key = ObjectKey(Kind.SECRET, volume.pod.namespace, source.secret_name)
                return secret.make_payload(source, self._store.get(key, Secret))
            case DownwardAPIVolumeSource(items=items, default_mode=default_mode):
                return downward.make_payload(
                    items, volume.pod, default_mode=default_mode, allocatable=self._allocatable
                )
            case ProjectedVolumeSource() as source:
                namespace = volume.pod.namespace
                return projected.make_payload(
                    source,
                    volume.pod,
                    get_configmap=lambda name: self._store.get(
                        ObjectKey(Kind.CONFIG_MAP, namespace, name), ConfigMap
                    ),
                    get_secret=lambda name: self._store.get(
                        ObjectKey(Kind.SECRET, namespace, name), Secret
                    ),
                    allocatable=self._allocatable,
                    get_token=lambda projection: self._token(volume, projection),
                )
            case _:
                raise VolumeSetupError(f"volume {volume.volume.name!r}: not served from memory")

    def _token(
        self, volume: VolumeToServe, projection: ServiceAccountTokenProjection
    ) -> bytes | None:
        token = self._store.get(token_key(volume.pod, projection), ServiceAccountToken)
        return None if token is None else token.token

    def object_versions(self, volume: VolumeToServe) -> dict[str, str | None]:
        """`"configmap ns/name"` -> its resourceVersion (None: missing), for `fusevol status`."""
        return dict(
            zip(map(str, _referenced_objects(volume)), self._object_versions(volume), strict=True)
        )

    def _object_versions(self, volume: VolumeToServe) -> tuple[str | None, ...]:
        versions = []
        for key in _referenced_objects(volume):
            obj = self._store.get(key)
            versions.append(None if obj is None else obj.resource_version)
        return tuple(versions)


def nested_mountpoints(volume: VolumeToServe) -> tuple[str, ...]:
    """kubelet's `MakeNestedMountpoints`: for every other volume a container mounts *below* this
    volume's mount path, the first path element below it, so that runc finds a mountpoint
    directory inside this (read-only) volume."""
    names: set[str] = set()
    for container in (*volume.pod.containers, *volume.pod.init_containers):
        own = [m.mount_path for m in container.volume_mounts if m.name == volume.volume.name]
        for mount in container.volume_mounts:
            if mount.name == volume.volume.name:
                continue
            for base in own:
                relative = posixpath.relpath(posixpath.normpath(mount.mount_path), base)
                if relative != "." and not relative.startswith(".."):
                    names.add(relative.split("/", 1)[0])
    return tuple(sorted(names))


def _referenced_objects(volume: VolumeToServe) -> tuple[ObjectKey, ...]:
    namespace = volume.pod.namespace
    match volume.source:
        case ConfigMapVolumeSource(name=name):
            return (ObjectKey(Kind.CONFIG_MAP, namespace, name),)
        case SecretVolumeSource(secret_name=name):
            return (ObjectKey(Kind.SECRET, namespace, name),)
        case ProjectedVolumeSource(sources=sources):
            keys = []
            for projection in sources:
                if isinstance(projection, ConfigMapProjection):
                    keys.append(ObjectKey(Kind.CONFIG_MAP, namespace, projection.name))
                elif isinstance(projection, SecretProjection):
                    keys.append(ObjectKey(Kind.SECRET, namespace, projection.name))
                elif isinstance(projection, ServiceAccountTokenProjection):
                    keys.append(token_key(volume.pod, projection))
            return tuple(keys)
        case _:
            return ()


def _uses_downward_api(volume: VolumeToServe) -> bool:
    match volume.source:
        case DownwardAPIVolumeSource():
            return True
        case ProjectedVolumeSource(sources=sources):
            return any(isinstance(p, DownwardAPIProjection) for p in sources)
        case _:
            return False


def _remove_dir(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(path)
