"""Set-up, refresh and tear-down of the volumes served from memory (configMap, secret).

A served volume is three things: a subtree on the agent's FUSE mount holding kubelet's
AtomicWriter layout, the pod volume directory, and a read-only bind mount of the first on the
second. Containers always get these volume types read-only (KUBELET.md A1), so the bind is too;
only the agent writes, through its own mount.

Every operation renders the payload first, so bad input (a missing object or key, an invalid path)
fails before anything on the node changes: a new volume leaves nothing behind, and a served one
keeps its last good content, as kubelet does.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import TYPE_CHECKING

import trio

from fusevol import layout
from fusevol.cache.actual import MountedVolume
from fusevol.errors import VolumeSetupError
from fusevol.layout import Plugin
from fusevol.model import (
    ConfigMap,
    ConfigMapVolumeSource,
    Kind,
    ObjectKey,
    Secret,
    SecretVolumeSource,
    UnsupportedVolumeSource,
)
from fusevol.projection import configmap, secret

if TYPE_CHECKING:
    from collections.abc import Hashable
    from pathlib import Path

    from fusevol.cache.desired import VolumeToServe
    from fusevol.cache.store import ObjectStore
    from fusevol.fuse.publish import Publisher
    from fusevol.model import Payload, Pod, PodUID
    from fusevol.mount.backend import MountBackend

ROOT_MODES = {
    # The wrapped emptyDir: a disk directory created 0777 for configMap, a tmpfs (mode 1777) for
    # the others (KUBELET.md A1).
    Plugin.CONFIG_MAP: 0o777,
    Plugin.SECRET: 0o1777,
}


class ServedVolumes:
    def __init__(
        self,
        *,
        root: Path,
        store: ObjectStore,
        publisher: Publisher,
        backend: MountBackend,
    ) -> None:
        self._root = root
        self._store = store
        self._publisher = publisher
        self._backend = backend

    def inputs(self, volume: VolumeToServe) -> Hashable:
        """What the volume's content depends on: its spec and the versions of its objects."""
        return (volume.volume.source, *self._object_versions(volume))

    async def set_up(self, volume: VolumeToServe) -> MountedVolume:
        inputs = self.inputs(volume)  # before rendering: a change while we work means a refresh
        payload = self.render(volume)
        plugin = _require_plugin(volume)
        name = layout.fuse_name(volume.pod.uid, volume.volume.name)
        target = layout.volume_dir(self._root, volume.pod.uid, plugin, volume.volume.name)
        try:
            await self._publisher.create_volume(name, mode=ROOT_MODES[plugin])
            await self._publisher.publish(name, payload)
            # Paths near mounts may reach a FUSE server, our own included: never on the trio thread.
            await trio.to_thread.run_sync(
                functools.partial(os.makedirs, target, 0o750, exist_ok=True)
            )
            await self._backend.bind(self._publisher.path(name), target, read_only=True)
        except BaseException:
            with contextlib.suppress(Exception):
                await self._remove(name, target)
            raise
        return MountedVolume(
            volume.name, plugin, volume.pod.uid, volume.volume.name, target, inputs
        )

    async def refresh(self, volume: VolumeToServe, mounted: MountedVolume) -> MountedVolume:
        inputs = self.inputs(volume)
        payload = self.render(volume)
        await self._publisher.publish(layout.fuse_name(volume.pod.uid, volume.volume.name), payload)
        return MountedVolume(
            mounted.name, mounted.plugin, mounted.pod_uid, mounted.volume_name, mounted.path, inputs
        )

    async def tear_down(self, mounted: MountedVolume) -> None:
        await self._remove(layout.fuse_name(mounted.pod_uid, mounted.volume_name), mounted.path)

    async def remove_pod_dir(self, uid: PodUID) -> None:
        """Remove the pod's directory once none of its volumes is left on the node."""
        await trio.to_thread.run_sync(remove_pod_dir, layout.pod_dir(self._root, uid))

    def render(self, volume: VolumeToServe) -> Payload:
        """The volume's payload, or VolumeSetupError / InvalidPayload naming what is wrong."""
        match volume.volume.source:
            case ConfigMapVolumeSource() as source:
                key = ObjectKey(Kind.CONFIG_MAP, volume.pod.namespace, source.name)
                return configmap.make_payload(source, self._store.get(key, ConfigMap))
            case SecretVolumeSource() as source:
                key = ObjectKey(Kind.SECRET, volume.pod.namespace, source.secret_name)
                return secret.make_payload(source, self._store.get(key, Secret))
            case UnsupportedVolumeSource(type_name=type_name):
                raise VolumeSetupError(f"volume type {type_name!r} is not supported by fusevol")
            case _:
                raise VolumeSetupError(f"volume {volume.volume.name!r}: not served yet")

    async def _remove(self, name: bytes, target: Path) -> None:
        await self._backend.unmount(target)
        await trio.to_thread.run_sync(_remove_dir, target)
        await self._publisher.remove_volume(name)

    def _object_versions(self, volume: VolumeToServe) -> tuple[str | None, ...]:
        keys = _referenced_objects(volume.pod, volume)
        versions = []
        for key in keys:
            obj = self._store.get(key)
            versions.append(None if obj is None else obj.resource_version)
        return tuple(versions)


def _referenced_objects(pod: Pod, volume: VolumeToServe) -> tuple[ObjectKey, ...]:
    match volume.volume.source:
        case ConfigMapVolumeSource(name=name):
            return (ObjectKey(Kind.CONFIG_MAP, pod.namespace, name),)
        case SecretVolumeSource(secret_name=name):
            return (ObjectKey(Kind.SECRET, pod.namespace, name),)
        case _:
            return ()


def _require_plugin(volume: VolumeToServe) -> Plugin:
    if volume.plugin is None:
        raise VolumeSetupError(f"volume {volume.volume.name!r} has a type fusevol does not serve")
    return volume.plugin


def _remove_dir(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(path)


def remove_pod_dir(pod_dir: Path, *, with_volume_dirs: bool = False) -> bool:
    """Remove a pod directory whose volumes are all gone: its empty plugin directories, `volumes/`
    and itself; with `with_volume_dirs`, empty volume directories too (for a final sweep, when no
    set-up can be creating one). Removes nothing that is not empty or still a mount point, and
    never descends below the volume level. Returns True if the pod directory is gone."""
    volumes = pod_dir / "volumes"
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for plugin_dir in volumes.iterdir():
            if with_volume_dirs:
                for volume_dir in plugin_dir.iterdir():
                    with contextlib.suppress(OSError):
                        volume_dir.rmdir()
            with contextlib.suppress(OSError):
                plugin_dir.rmdir()
    for directory in (volumes, pod_dir):
        try:
            directory.rmdir()
        except FileNotFoundError:
            continue
        except OSError:
            return False
    return True
