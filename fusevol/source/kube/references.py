"""What a pod's volumes reference: the keys of the objects the source keeps tracked for them.

A configMap, secret or projected volume shows ConfigMaps and Secrets (its serviceAccountToken
projections get tokens by TokenRequest, `tokens`: nothing to track). A claim's volume needs the
claim, then the PersistentVolume it is bound to; while unbound, its StorageClass, which says
whether this node provisions it (not under a node's identity: the Node authorizer never lets a
node read StorageClasses). A claim not read yet stands for itself: once it is read (a change the
trackers report), its references are asked for again.

Excludes: keeping the objects current (`objects`), which pods, claims and CSI volumes count
(`source`, `csi_volumes`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusevol.model import (
    Kind,
    ObjectKey,
    PersistentVolumeClaim,
    PersistentVolumeClaimVolumeSource,
    referenced_objects,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

    from fusevol.model import Pod, VolumeSource
    from fusevol.volumemanager.cache.store import ObjectStore


def pod_references(pods: Iterable[Pod], *, store: ObjectStore, as_node: bool) -> set[ObjectKey]:
    """What to track for all the volumes of `pods`."""
    keys: set[ObjectKey] = set()
    for pod in pods:
        for volume in pod.volumes:
            keys.update(volume_references(pod, volume.source, store=store, as_node=as_node))
    return keys


def volume_references(
    pod: Pod, source: VolumeSource, *, store: ObjectStore, as_node: bool
) -> set[ObjectKey]:
    """What to track for one volume: the ConfigMaps and Secrets it shows (tokens are
    requested, not watched), or a claim's objects."""
    if isinstance(source, PersistentVolumeClaimVolumeSource):
        return claim_references(
            ObjectKey(Kind.PERSISTENT_VOLUME_CLAIM, pod.namespace, source.claim_name),
            store=store,
            as_node=as_node,
        )
    return {
        key for key in referenced_objects(pod, source) if key.kind in (Kind.CONFIG_MAP, Kind.SECRET)
    }


def claim_references(claim_key: ObjectKey, *, store: ObjectStore, as_node: bool) -> set[ObjectKey]:
    """The claim, and its volume once bound, else its class (which says who provisions it)."""
    claim = store.get(claim_key, PersistentVolumeClaim)
    if claim is None:
        return {claim_key}
    if not claim.volume_name:
        if not claim.storage_class_name or as_node:
            return {claim_key}
        return {claim_key, ObjectKey(Kind.STORAGE_CLASS, "", claim.storage_class_name)}
    return {claim_key, ObjectKey(Kind.PERSISTENT_VOLUME, "", claim.volume_name)}
