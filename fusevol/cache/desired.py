"""DesiredState: which volumes the pods of this node want, as kubelet's desired state of world.

Filled by the populator from the pods in the object store; read by the reconciler. Changes go
through named verbs (`set_pod`, `delete_pod`, both idempotent) and readers get snapshots, never the
inner dicts. Trio thread only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fusevol.layout import Plugin, plugin_for, unique_volume_name
from fusevol.model import UniqueVolumeName

if TYPE_CHECKING:
    from fusevol.model import Pod, PodUID, Volume


@dataclass(frozen=True, slots=True)
class VolumeToServe:
    name: UniqueVolumeName
    plugin: Plugin | None
    """None for a volume type fusevol does not serve: desired, and failing with a clear error."""
    pod: Pod
    volume: Volume


class DesiredState:
    def __init__(self) -> None:
        self._pods: dict[PodUID, Pod] = {}
        self._volumes: dict[UniqueVolumeName, VolumeToServe] = {}

    def set_pod(self, pod: Pod) -> bool:
        """Add `pod` with its volumes, or replace it. Returns False if nothing changed."""
        if self._pods.get(pod.uid) == pod:
            return False
        self.delete_pod(pod.uid)
        self._pods[pod.uid] = pod
        for volume in pod.volumes:
            plugin = plugin_for(volume.source)
            if plugin is None:
                name = UniqueVolumeName(f"unsupported/{pod.uid}-{volume.name}")
            else:
                name = unique_volume_name(plugin, pod.uid, volume.name)
            self._volumes[name] = VolumeToServe(name, plugin, pod, volume)
        return True

    def delete_pod(self, uid: PodUID) -> bool:
        """Forget the pod and its volumes. No-op (False) if it is not known."""
        if self._pods.pop(uid, None) is None:
            return False
        for name in [n for n, v in self._volumes.items() if v.pod.uid == uid]:
            del self._volumes[name]
        return True

    def pods(self) -> tuple[Pod, ...]:
        return tuple(self._pods.values())

    def volumes_to_serve(self) -> tuple[VolumeToServe, ...]:
        return tuple(self._volumes.values())

    def get(self, name: UniqueVolumeName) -> VolumeToServe | None:
        return self._volumes.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._volumes
