"""The serviceAccountToken projections of a CSI volume, and where their tokens come from.

kubelet passes the tokens the CSIDriver's `tokenRequests` ask for with every publish (by
audience, in `csi.storage.k8s.io/serviceAccount.tokens`); they are put into the store where the
projection's renderer looks for them, in memory only, never recorded (step 3 of `node`). If
kubelet passed not every audience the volume needs, the API source requests them all by
TokenRequest instead, as for a pod-spec volume; a source that cannot (the manifest source, or
`--csi-token-requests false`) makes that FAILED_PRECONDITION, naming the audience to list.

Excludes: requesting tokens (`fusevol.source.kube.tokens`), rendering them (`fusevol.projection`).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from fusevol.csi.attributes import DRIVER, Code, CsiError
from fusevol.model import (
    ProjectedVolumeSource,
    ResourceVersion,
    ServiceAccountToken,
    ServiceAccountTokenProjection,
    token_key,
)

if TYPE_CHECKING:
    from fusevol.csi.attributes import Publication
    from fusevol.model import Pod
    from fusevol.volumemanager.cache.store import ObjectStore


def token_projections(publication: Publication) -> list[ServiceAccountTokenProjection]:
    source = publication.volume.source
    if not isinstance(source, ProjectedVolumeSource):
        return []
    return [p for p in source.sources if isinstance(p, ServiceAccountTokenProjection)]


def requests_tokens(publication: Publication, *, can_request: bool, no_tokens: str) -> bool:
    """True if the volume's tokens are to be requested by the source: kubelet passed not
    all of them (the CSIDriver's tokenRequests lack an audience); without an API source
    that is FAILED_PRECONDITION (`can_request` False, `no_tokens` says why)."""
    for projection in token_projections(publication):
        if projection.audience not in publication.tokens:
            if can_request:
                return True
            raise CsiError(
                Code.FAILED_PRECONDITION,
                f"serviceAccountToken {projection.path!r}: no token for audience "
                f"{projection.audience!r} in csi.storage.k8s.io/serviceAccount.tokens: list "
                f"it in the tokenRequests of the CSIDriver {DRIVER} ({no_tokens})",
            )
    return False


def put_tokens(store: ObjectStore, publication: Publication, pod: Pod) -> None:
    """kubelet's tokens, where the projection's renderer looks for them."""
    for projection in token_projections(publication):
        token = publication.tokens[projection.audience]
        key = token_key(pod, projection)
        version = ResourceVersion(hashlib.sha256(token).hexdigest()[:16])
        store.upsert(ServiceAccountToken(key.namespace, key.name, version, token))


def delete_tokens(store: ObjectStore, publication: Publication, pod: Pod) -> None:
    """The volume's tokens out of the store."""
    for projection in token_projections(publication):
        store.delete(token_key(pod, projection))
