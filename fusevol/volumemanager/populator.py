"""Populator: the pods in the object store -> the desired state of world.

The store holds exactly the pods of this node (each source filters by node). For each pod the
populator resolves every volume into what is to be set up (kubelet's `createVolumeSpec`): an
inline source as it is, a `persistentVolumeClaim` through its claim to the bound
PersistentVolume, whose name then names the volume directory. A claim that is missing or unbound
becomes a volume carrying that error, so it shows in `fusevol status` and is retried; it is
resolved again on every pass, and served as soon as the claim is bound.

An unbound claim binds to a PV whose claimRef names it (and its uid, if the PV records one): the
PV controller's pre-bound binding, which is how a provisioned volume reaches its claim. An unbound
claim of a StorageClass provisioned by this node (`fusevol.provision`) is collected in
`claims_to_provision()`: a pod of this node is its first consumer, or the scheduler selected this
node for it (`volume.kubernetes.io/selected-node`: its pod gets a node once it is bound). One
whose PV is recorded already (the Kubernetes source: created, the PV controller's binding not seen
yet) is not collected again.

A pod that has finished (`status.phase` Succeeded or Failed: its containers have stopped and
none starts again) has its volumes torn down as if it were gone, while the API server keeps it
(a Job's pods, until they are deleted): kubelet's own unmounts them then
(`findAndRemoveDeletedPods`, unless `--keep-terminated-pod-volumes`).

CSI volumes (`DesiredState.set_csi`, from kubelet's NodePublishVolume) are resolved again on
every pass with the current copy of their pod, so downward API files follow it; a pod gone from
the store keeps its last copy until kubelet unpublishes. With `pod_volumes=False` (CSI mode: the
agent serves what kubelet asks for) the pods' own `spec.volumes` are not set up.

`has_added_pods` turns true after the first pass that follows the sources' complete initial
listing: until then nothing may be torn down, or a restart would unmount volumes whose pods simply
have not been read yet (kubelet's `HasAddedPods`).

Every pod reaches the desired state with the annotations kubelet adds to the pods it accepts
(kubelet's `pkg/kubelet/config`; docs/pod-annotations.md), whichever source it came from: this is
the one place both sources' pods go through. `kubernetes.io/config.source` (`api` or `file`, the
manifest source being kubelet's file source), `kubernetes.io/config.seen` (when the agent first saw
the pod, kept across restarts by `FirstSeen`), and for `file` pods `kubernetes.io/config.hash`, the
pod's uid, as kubelet sets it. They replace a value the pod gives for the same key, as kubelet's
do. Only the copy in the desired state carries them, so only what is built from it (the downward
API) shows them: the store keeps the objects as the sources delivered them, and nothing writes
them anywhere.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from fusevol.model import (
    CSIVolumeSource,
    InvalidVolumeSource,
    Kind,
    NFSVolumeSource,
    ObjectKey,
    PersistentVolume,
    PersistentVolumeClaim,
    PersistentVolumeClaimVolumeSource,
    Pod,
    StorageClass,
    UniqueVolumeName,
    UnsupportedVolumeSource,
)
from fusevol.node.layout import plugin_for, unique_volume_name
from fusevol.provision.hostpath import ClaimToProvision
from fusevol.volumemanager.cache.desired import CsiVolume, VolumeToServe

if TYPE_CHECKING:
    from collections.abc import Iterator

    from fusevol.model import PodUID, Volume
    from fusevol.provision.hostpath import HostPathProvisioner
    from fusevol.volumemanager.cache.desired import DesiredState
    from fusevol.volumemanager.cache.seen import FirstSeen
    from fusevol.volumemanager.cache.store import ObjectStore

log = logging.getLogger(__name__)

MOUNT_OPTIONS_ANNOTATION = "volume.beta.kubernetes.io/mount-options"
CONFIG_SOURCE_ANNOTATION = "kubernetes.io/config.source"
CONFIG_SEEN_ANNOTATION = "kubernetes.io/config.seen"
CONFIG_HASH_ANNOTATION = "kubernetes.io/config.hash"


class ConfigSource(enum.Enum):
    """Where the agent's pods come from, by kubelet's names for its pod sources."""

    API = "api"
    """The Kubernetes API server."""
    FILE = "file"
    """A manifest directory: kubelet's static pods from `--pod-manifest-path`."""


@dataclasses.dataclass(frozen=True, slots=True)
class KubeletAnnotations:
    """What the populator needs to annotate pods as kubelet does."""

    source: ConfigSource
    first_seen: FirstSeen

    def apply(self, pod: Pod) -> Pod:
        """`pod` with kubelet's annotations (a copy; `pod` itself is left as it is)."""
        annotations = Annotated(pod, self.source, self.first_seen.seen(pod.uid))
        return dataclasses.replace(pod, annotations=annotations)


class Annotated(Mapping[str, str]):
    """A pod's annotations with kubelet's (`KubeletAnnotations`), read through to the pod's own
    instead of merged into a dict of their own: 64 bytes a pod, not 200 (a node's thousands of
    pods). `pod`: the pod they are added to (`Populator._accept` knows it by it)."""

    __slots__ = ("_seen", "_source", "pod")

    def __init__(self, pod: Pod, source: ConfigSource, seen: str) -> None:
        self.pod = pod
        self._source = source
        self._seen = seen

    def __getitem__(self, key: str) -> str:
        if key == CONFIG_SOURCE_ANNOTATION:
            return self._source.value
        if key == CONFIG_SEEN_ANNOTATION:
            return self._seen
        if key == CONFIG_HASH_ANNOTATION and self._source is ConfigSource.FILE:
            return self.pod.uid
        return self.pod.annotations[key]

    def __iter__(self) -> Iterator[str]:
        own = self.pod.annotations
        yield from own
        yield from (key for key in self._added() if key not in own)

    def __len__(self) -> int:
        own = self.pod.annotations
        return len(own) + sum(key not in own for key in self._added())

    def __repr__(self) -> str:
        return repr(dict(self))

    def _added(self) -> tuple[str, ...]:
        if self._source is ConfigSource.FILE:
            return (CONFIG_SOURCE_ANNOTATION, CONFIG_SEEN_ANNOTATION, CONFIG_HASH_ANNOTATION)
        return (CONFIG_SOURCE_ANNOTATION, CONFIG_SEEN_ANNOTATION)


class Populator:
    def __init__(
        self,
        *,
        store: ObjectStore,
        desired: DesiredState,
        provisioner: HostPathProvisioner | None = None,
        annotations: KubeletAnnotations | None = None,
        pod_volumes: bool = True,
    ) -> None:
        """`annotations`: kubelet's annotations to add to every pod (None: pods as they are).
        `pod_volumes`: serve the pods' own `spec.volumes` (False in CSI mode: only what kubelet
        publishes)."""
        self._pod_volumes = pod_volumes
        self._store = store
        self._desired = desired
        self._provisioner = provisioner
        self._annotations = annotations
        self._accepted: dict[PodUID, Pod] = {}
        """Per pod, its annotated copy: the same while the store's pod is the same (the one its
        annotations are of), so an unchanged pod costs one identity check."""
        self._has_added_pods = False
        self._to_provision: dict[ObjectKey, ClaimToProvision] = {}
        self._csi_resolved: dict[UniqueVolumeName, tuple[CsiVolume, Pod | None]] = {}
        """Per CSI volume, what its last resolution was made of (the volume as published, the
        store's pod): while both are the same objects, resolving it again changes nothing, and a
        burst of publishes (kubelet's, 80 at once) need not resolve every volume at every pass."""
        self._resolved: dict[PodUID, Pod] = {}
        """Pods resolved already whose volumes depend on nothing but the pod (no claim): while the
        store holds the same object, resolving it again cannot change anything."""

    @property
    def has_added_pods(self) -> bool:
        return self._has_added_pods

    def populate(self) -> None:
        """One full pass. Cheap when nothing changed; idempotent."""
        synced = self._store.synced
        self._to_provision = {}
        pods = {pod.uid: self._accept(pod) for pod in self._store.pods() if not pod.finished}
        self._accepted = {uid: self._accepted[uid] for uid in pods if uid in self._accepted}
        for pod in self._desired.pods():
            if pod.uid not in pods:
                self._resolved.pop(pod.uid, None)
                self._desired.delete_pod(pod.uid)
                stored = self._store.get(pod.key, Pod)
                gone = "finished" if stored is not None and stored.uid == pod.uid else "removed"
                log.info("pod %s pod=%s/%s uid=%s", gone, pod.namespace, pod.name, pod.uid)
        if self._annotations is not None:
            if synced:  # before, a pod not delivered yet is not gone
                # A CSI volume's pod lives as long as kubelet's volume does, in the store or
                # not (deleted, or not delivered yet): its time must not change pass to pass.
                csi_pods = {csi.pod.uid for csi in self._desired.csi_volumes()}
                self._annotations.first_seen.retain(pods.keys() | csi_pods)
            self._annotations.first_seen.save()  # before any volume shows a new time
        for pod in pods.values():
            if self._resolved.get(pod.uid) is pod:
                continue  # a pass of thousands of unchanged pods costs a lookup each
            volumes = (
                tuple(self.resolve(pod, volume) for volume in pod.volumes)
                if self._pod_volumes
                else ()
            )
            if self._desired.set_pod(pod, volumes):
                log.debug("pod added or updated pod=%s/%s uid=%s", pod.namespace, pod.name, pod.uid)
            claims = (isinstance(v.source, PersistentVolumeClaimVolumeSource) for v in pod.volumes)
            if not any(claims):
                self._resolved[pod.uid] = pod
            else:
                self._resolved.pop(pod.uid, None)
        csi_volumes = self._desired.csi_volumes()
        made_of = {}
        for csi in csi_volumes:
            stored = self._store.get(csi.pod.key, Pod)
            made_of[csi.name] = (csi, stored)
            last = self._csi_resolved.get(csi.name)
            if last is None or last[0] is not csi or last[1] is not stored:
                self._desired.set_resolved(csi.name, self.resolve_csi(csi, stored))
        self._csi_resolved = made_of
        self._collect_selected_claims()
        if synced:
            self._has_added_pods = True

    def resolve_csi_now(self, name: UniqueVolumeName) -> VolumeToServe | None:
        """Resolve one CSI volume now, as the next pass would (a publish, which kubelet waits
        for); None if the desired state does not hold it."""
        csi = self._desired.csi(name)
        if csi is None:
            return None
        stored = self._store.get(csi.pod.key, Pod)
        resolved = self.resolve_csi(csi, stored)
        if self._annotations is not None:
            self._annotations.first_seen.save()  # before any volume shows a new time
        self._desired.set_resolved(name, resolved)
        self._csi_resolved[name] = (csi, stored)
        return resolved

    def _accept(self, pod: Pod) -> Pod:
        if self._annotations is None:
            return pod
        accepted = self._accepted.get(pod.uid)
        if accepted is None or not _annotated_from(accepted, pod):
            accepted = self._accepted[pod.uid] = self._annotations.apply(pod)
        return accepted

    def _collect_selected_claims(self) -> None:
        """Unbound claims the scheduler selected this node for, whose pods have no node yet."""
        if self._provisioner is None:
            return
        for claim in self._store.list(Kind.PERSISTENT_VOLUME_CLAIM):
            assert isinstance(claim, PersistentVolumeClaim)
            if (
                claim.key not in self._to_provision
                and not claim.volume_name
                and self._provisioner.selected_here(claim)
                and self._pre_bound(claim) is None
            ):
                self._unbound(claim)

    def claims_to_provision(self) -> tuple[ClaimToProvision, ...]:
        """The unbound claims of the last pass that pods of this node use and this node
        provisions."""
        return tuple(self._to_provision.values())

    def resolve(self, pod: Pod, volume: Volume) -> VolumeToServe:
        source = volume.source
        if isinstance(source, PersistentVolumeClaimVolumeSource):
            return self._resolve_claim(pod, volume, source)
        if isinstance(source, InvalidVolumeSource):
            return _failed(pod, volume, source.error)
        plugin = plugin_for(source)
        if plugin is None:
            type_name = (
                source.type_name
                if isinstance(source, (UnsupportedVolumeSource, CSIVolumeSource))
                else "?"
            )
            return _failed(pod, volume, f"volume type {type_name!r} is not supported by fusevol")
        read_only = source.read_only if isinstance(source, NFSVolumeSource) else False
        return VolumeToServe(
            unique_volume_name(plugin, pod.uid, volume.name),
            plugin,
            pod,
            volume,
            spec_name=volume.name,
            source=source,
            read_only=read_only,
        )

    def resolve_csi(self, csi: CsiVolume, stored: Pod | None = None) -> VolumeToServe:
        """A CSI volume with the store's copy of its pod (the same uid), else the one it has,
        with kubelet's annotations as a pod-spec volume has them (a downward API file of
        `metadata.annotations` shows them); fsGroup is the publish's `volume_mount_group`, and
        the bind is at kubelet's target."""
        pod = stored if stored is not None else self._store.get(csi.pod.key, Pod)
        if pod is None or pod.uid != csi.pod.uid:
            pod = csi.pod
        pod = dataclasses.replace(self._accept(pod), fs_group=csi.fs_group)
        resolved = self.resolve(pod, csi.volume)
        return dataclasses.replace(
            resolved, name=csi.name, read_only=True, target=csi.target, audit=csi.audit
        )

    def _resolve_claim(
        self, pod: Pod, volume: Volume, source: PersistentVolumeClaimVolumeSource
    ) -> VolumeToServe:
        claim_key = ObjectKey(Kind.PERSISTENT_VOLUME_CLAIM, pod.namespace, source.claim_name)
        claim = self._store.get(claim_key, PersistentVolumeClaim)
        if claim is None:
            return _failed(pod, volume, f'persistentvolumeclaim "{source.claim_name}" not found')
        if claim.volume_name:
            pv_key = ObjectKey(Kind.PERSISTENT_VOLUME, "", claim.volume_name)
            pv = self._store.get(pv_key, PersistentVolume)
            if pv is None:
                return _failed(pod, volume, f'persistentvolume "{claim.volume_name}" not found')
        else:
            pv = self._pre_bound(claim)
            if pv is None:
                return _failed(pod, volume, self._unbound(claim))
        if pv.claim_ref is not None and pv.claim_ref != (pod.namespace, source.claim_name):
            return _failed(
                pod,
                volume,
                f'persistentvolume "{pv.name}" is bound to claim '
                f"{pv.claim_ref[0]}/{pv.claim_ref[1]}, not {pod.namespace}/{source.claim_name}",
            )
        plugin = plugin_for(pv.source)
        if plugin is None:
            return _failed(pod, volume, f'persistentvolume "{pv.name}": unsupported volume type')
        pv_read_only = pv.source.read_only if isinstance(pv.source, NFSVolumeSource) else False
        return VolumeToServe(
            unique_volume_name(plugin, pod.uid, pv.name),
            plugin,
            pod,
            volume,
            spec_name=pv.name,
            source=pv.source,
            read_only=source.read_only or claim.read_only or pv_read_only,
            mount_options=_mount_options(pv),
        )

    def _pre_bound(self, claim: PersistentVolumeClaim) -> PersistentVolume | None:
        for pv in self._store.list(Kind.PERSISTENT_VOLUME):
            assert isinstance(pv, PersistentVolume)
            if pv.claim_ref == (claim.namespace, claim.name) and pv.claim_uid in ("", claim.uid):
                return pv
        return None

    def _unbound(self, claim: PersistentVolumeClaim) -> str:
        """Why `claim` has no volume; collects it if this node is to provision it."""
        unbound = f"PVC {claim.namespace}/{claim.name} is not bound to a volume"
        if self._provisioner is None or not claim.storage_class_name:
            return unbound
        class_key = ObjectKey(Kind.STORAGE_CLASS, "", claim.storage_class_name)
        storage_class = self._store.get(class_key, StorageClass)
        if storage_class is None or not self._provisioner.wants(claim, storage_class):
            return unbound
        provisioned = self._provisioner.recorded_for(claim)
        if provisioned is not None:  # the PV exists; the API's binding has not come yet
            return f"{unbound}: provisioned as {provisioned.name}, waiting for the binding"
        self._to_provision[claim.key] = ClaimToProvision(claim, storage_class)
        return f"{unbound}: waiting for {storage_class.provisioner} to provision it"


def _mount_options(pv: PersistentVolume) -> tuple[str, ...]:
    """kubelet's `MountOptionFromSpec`: the annotation wins over `spec.mountOptions`."""
    annotation = pv.annotations.get(MOUNT_OPTIONS_ANNOTATION)
    if annotation is not None:
        return tuple(o.strip() for o in annotation.split(",") if o.strip())
    return pv.mount_options


def _annotated_from(accepted: Pod, pod: Pod) -> bool:
    annotations = accepted.annotations
    return isinstance(annotations, Annotated) and annotations.pod is pod


def _failed(pod: Pod, volume: Volume, error: str) -> VolumeToServe:
    name = UniqueVolumeName(f"unresolved/{pod.uid}-{volume.name}")
    return VolumeToServe(name, None, pod, volume, spec_name=volume.name, error=error)
