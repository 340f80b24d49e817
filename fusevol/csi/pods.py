"""Which pod a CSI request is for: the pod kubelet names, as the source knows it.

A publish (step 1 of `node`) is for a pod of this node that the source delivered: the same
namespace, name, uid and service account as kubelet says (`podInfoOnMount`), with a `csi:` volume
of the name the target path gives. kubelet may see a new pod before the source does, so the
publish waits a little for it; any other pod is PERMISSION_DENIED. A pod the source has not
delivered (yet) is known only by what kubelet said of it (`bare_pod`): enough to name its volume
and its tokens.

Excludes: the checks of the request itself (`attributes`), the pod's objects (the source's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from fusevol.csi.attributes import Code, CsiError
from fusevol.model import (
    CSIVolumeSource,
    InvalidVolumeSource,
    Kind,
    ObjectKey,
    Pod,
    ResourceVersion,
)

if TYPE_CHECKING:
    from fusevol.csi.attributes import PodIdentity, Publication
    from fusevol.volumemanager.cache.store import ObjectStore


async def pod_of(
    publication: Publication,
    *,
    store: ObjectStore,
    wait_s: float,
    node_name: str,
    source_name: str,
) -> Pod:
    """The pod the request names, as the source knows it (waiting up to `wait_s` for it), or
    PERMISSION_DENIED; `node_name` and `source_name` name this node and the source in it."""
    identity = publication.pod
    with trio.move_on_after(wait_s):
        while known_pod(store, identity) is None:
            await store.wait_changed(store.generation)
    pod = store.get(ObjectKey(Kind.POD, identity.namespace, identity.name), Pod)
    who = f"pod {identity.namespace}/{identity.name}"
    if pod is None:
        reason = f"is not a pod of node {node_name} known to the {source_name}"
    elif pod.uid != identity.uid:
        reason = f"has uid {pod.uid}, not {identity.uid}"
    elif pod.service_account_name != identity.service_account:
        reason = (
            f"runs as service account {pod.service_account_name!r}, "
            f"not {identity.service_account!r}"
        )
    elif not any(
        volume.name == publication.volume.name
        and isinstance(volume.source, (CSIVolumeSource, InvalidVolumeSource))
        and volume.source.type_name == "csi"
        for volume in pod.volumes
    ):
        reason = f"has no csi volume {publication.volume.name!r}"
    else:
        return pod
    raise CsiError(Code.PERMISSION_DENIED, f"{who} {reason}: publish refused")


def known_pod(store: ObjectStore, identity: PodIdentity) -> Pod | None:
    """The pod `identity` names if the source delivered it (same uid), else None."""
    pod = store.get(ObjectKey(Kind.POD, identity.namespace, identity.name), Pod)
    return pod if pod is not None and pod.uid == identity.uid else None


def bare_pod(identity: PodIdentity) -> Pod:
    """A pod known only by what kubelet said of it (its source has not delivered it)."""
    return Pod(
        identity.uid,
        identity.namespace,
        identity.name,
        ResourceVersion(""),
        service_account_name=identity.service_account,
    )
