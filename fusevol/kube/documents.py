"""API documents and model objects, both ways: `convert` reads what the API server sends (an
invalid object is logged and skipped, never fatal), `to_document` renders what the agent writes
(a provisioned PersistentVolume, to the API or to the agent's own record).

No `kubernetes` import here: the manifest source's record uses it too.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from fusevol.base.errors import ManifestError
from fusevol.decode.objects import convert_object
from fusevol.model import LocalVolumeSource, PersistentVolume

if TYPE_CHECKING:
    from fusevol.model import KubeObject

log = logging.getLogger(__name__)

_HOSTNAME_LABEL = "kubernetes.io/hostname"


def convert(raw: dict[str, Any], *, origin: str) -> KubeObject | None:
    """An API object as a model object; None (and one ERROR line) if it is invalid for fusevol."""
    try:
        return convert_object(raw, origin=origin)
    except ManifestError as exc:
        log.error("object rejected, keeping its previous state: %s", exc)
        return None


def to_document(pv: PersistentVolume) -> dict[str, Any]:
    """`pv` as the API shows a provisioned local PV."""
    assert isinstance(pv.source, LocalVolumeSource), pv
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": pv.reclaim_policy or "Delete",
        "storageClassName": pv.storage_class_name,
        "volumeMode": "Filesystem",
        "local": {"path": pv.source.path},
    }
    if pv.capacity:
        spec["capacity"] = {"storage": pv.capacity}
    if pv.mount_options:
        spec["mountOptions"] = list(pv.mount_options)
    if pv.claim_ref is not None:
        namespace, name = pv.claim_ref
        ref = {"kind": "PersistentVolumeClaim", "namespace": namespace, "name": name}
        spec["claimRef"] = {**ref, "uid": pv.claim_uid} if pv.claim_uid else ref
    if pv.node_names:
        expression = {"key": _HOSTNAME_LABEL, "operator": "In", "values": list(pv.node_names)}
        terms = [{"matchExpressions": [expression]}]
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": terms}}
    metadata: dict[str, Any] = {"name": pv.name, "resourceVersion": pv.resource_version}
    if pv.annotations:
        metadata["annotations"] = dict(pv.annotations)
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": metadata, "spec": spec}
