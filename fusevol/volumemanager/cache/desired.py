"""DesiredState: which volumes the pods of this node want, as kubelet's desired state of world.

Filled by the populator, which resolves each pod volume (a claim to its PersistentVolume, say)
into a `VolumeToServe`; read by the reconciler. CSI volumes (`fusevol.csi`) are kept apart: a
`CsiVolume` is added by kubelet's NodePublishVolume and removed by its NodeUnpublishVolume, not by
the pod's comings and goings, and the populator resolves each into a `VolumeToServe` (the pod's
current copy) on every pass. Changes go through named verbs (`set_pod`,
`delete_pod`, both idempotent) and readers get snapshots, never the inner dicts. Trio thread only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fusevol.volumemanager.cache.changes import Changes, Subscribers

if TYPE_CHECKING:
    from pathlib import Path

    from fusevol.model import (
        PersistentVolumeSource,
        Pod,
        PodUID,
        UniqueVolumeName,
        Volume,
        VolumeSource,
    )
    from fusevol.node.layout import Plugin


@dataclass(frozen=True, slots=True)
class VolumeToServe:
    name: UniqueVolumeName
    plugin: Plugin | None
    """None when the volume cannot be served (unsupported type, unbound claim): see `error`."""
    pod: Pod
    volume: Volume
    """The pod's `spec.volumes[]` entry."""
    spec_name: str = ""
    """The volume directory's name: the volume's name, or its PersistentVolume's."""
    source: VolumeSource | PersistentVolumeSource | None = None
    """What to set up: the inline source, or the bound PersistentVolume's."""
    read_only: bool = False
    mount_options: tuple[str, ...] = ()
    error: str = ""
    """Why the volume cannot be set up now; the reconciler reports it and retries."""
    target: Path | None = None
    """Where to serve it when not at its pod volume directory: a CSI volume's target path."""
    audit: bool = False
    """Audited whatever the levels of the node and the pod (a CSI volume's `fusevol.io/audit`
    attribute: `fusevol.model.audit`)."""


@dataclass(frozen=True, slots=True)
class CsiVolume:
    """A volume kubelet published through the CSI node plugin (`fusevol.csi`)."""

    name: UniqueVolumeName
    pod: Pod
    """The pod as identified at publish; the populator serves it with the store's current copy."""
    volume: Volume
    """`Volume(<the pod's volume name>, <the source its volumeAttributes describe>)`."""
    target: Path
    """kubelet's target path: the bind goes there."""
    fs_group: int | None = None
    """From the publish's `volume_mount_group` (the pod's fsGroup)."""
    audit: bool = False
    """Its `fusevol.io/audit` attribute (`fusevol.csi.attributes`)."""


class DesiredState:
    """Every change bumps `generation` and wakes `wait_changed()`: a CSI publish waits on it
    for the populator to resolve its volume."""

    def __init__(self) -> None:
        self._pods: dict[PodUID, Pod] = {}
        self._volumes: dict[UniqueVolumeName, VolumeToServe] = {}
        self._by_pod: dict[PodUID, tuple[VolumeToServe, ...]] = {}
        self._csi: dict[UniqueVolumeName, CsiVolume] = {}
        self._csi_resolved: dict[UniqueVolumeName, VolumeToServe] = {}
        self._changes = Changes()

    @property
    def generation(self) -> int:
        """How many changes so far."""
        return self._changes.value

    async def wait_changed(self, since: int) -> None:
        """Return as soon as `generation` differs from `since`."""
        await self._changes.wait_changed(since)

    @property
    def subscribers(self) -> Subscribers:
        """Events set when the volume they were added under changes."""
        return self._changes.subscribers

    def set_pod(self, pod: Pod, volumes: tuple[VolumeToServe, ...]) -> bool:
        """Add `pod` wanting `volumes`, or replace it. Returns False if nothing changed."""
        if self._pods.get(pod.uid) == pod and self._by_pod.get(pod.uid) == volumes:
            return False
        self.delete_pod(pod.uid)
        self._pods[pod.uid] = pod
        self._by_pod[pod.uid] = volumes
        for volume in volumes:
            self._volumes[volume.name] = volume
        self._changes.bump(*(volume.name for volume in volumes))
        return True

    def delete_pod(self, uid: PodUID) -> bool:
        """Forget the pod and its volumes. No-op (False) if it is not known."""
        if self._pods.pop(uid, None) is None:
            return False
        gone = self._by_pod.pop(uid, ())
        for volume in gone:
            # two of a pod's volumes on one claim are one volume (its PersistentVolume's name)
            self._volumes.pop(volume.name, None)
        self._changes.bump(*(volume.name for volume in gone))
        return True

    def set_csi(self, volume: CsiVolume) -> None:
        """Add or replace a CSI volume; the populator's next pass resolves it (`set_resolved`)."""
        self._csi[volume.name] = volume
        self._csi_resolved.pop(volume.name, None)
        self._changes.bump(volume.name)

    def set_resolved(self, name: UniqueVolumeName, resolved: VolumeToServe) -> None:
        """What CSI volume `name` is to serve now (the populator). No-op if it is gone."""
        if name in self._csi and self._csi_resolved.get(name) != resolved:
            self._csi_resolved[name] = resolved
            self._changes.bump(name)

    def delete_csi(self, name: UniqueVolumeName) -> bool:
        """Forget a CSI volume. No-op (False) if it is not known."""
        self._csi_resolved.pop(name, None)
        if self._csi.pop(name, None) is None:
            return False
        self._changes.bump(name)
        return True

    def csi_volumes(self) -> tuple[CsiVolume, ...]:
        return tuple(self._csi.values())

    def csi(self, name: UniqueVolumeName) -> CsiVolume | None:
        """The CSI volume `name` as published (resolved or not)."""
        return self._csi.get(name)

    def pods(self) -> tuple[Pod, ...]:
        return tuple(self._pods.values())

    def pod(self, uid: PodUID) -> Pod | None:
        """The pod `uid`, from the source or as a CSI publish named it; None if unknown."""
        if (pod := self._pods.get(uid)) is not None:
            return pod
        return next((v.pod for v in self._csi.values() if v.pod.uid == uid), None)

    def volumes_to_serve(self) -> tuple[VolumeToServe, ...]:
        return (*self._volumes.values(), *self._csi_resolved.values())

    def volumes_of(self, uid: PodUID) -> tuple[VolumeToServe, ...]:
        """The volumes the source's pod `uid` wants (none if it is not known)."""
        return self._by_pod.get(uid, ())

    def csi_to_serve(self) -> tuple[VolumeToServe, ...]:
        """The CSI volumes resolved (`volumes_to_serve` without the source's pods' volumes)."""
        return tuple(self._csi_resolved.values())

    def get(self, name: UniqueVolumeName) -> VolumeToServe | None:
        return self._volumes.get(name) or self._csi_resolved.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._volumes or name in self._csi_resolved
