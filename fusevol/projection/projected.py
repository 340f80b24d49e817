"""The payload of a projected volume: kubelet's `projected.collectData` (KUBELET.md A3).

Sources are merged in order into one payload, under one `..data`; a later source wins on an
identical path. configMap and secret sources follow their volumes' rules with the projected
volume's `defaultMode` and their own `optional`; downwardAPI sources follow the downwardAPI
volume's. Errors of all sources are reported together (kubelet's aggregate: `[a, b]`).
serviceAccountToken sources need a TokenRequest, hence the Kubernetes API source: without one they
fail with a clear error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusevol.errors import FusevolError, VolumeSetupError
from fusevol.model import (
    ConfigMap,
    ConfigMapProjection,
    ConfigMapVolumeSource,
    DownwardAPIProjection,
    Secret,
    SecretProjection,
    SecretVolumeSource,
    ServiceAccountTokenProjection,
)
from fusevol.projection import configmap, downward, secret
from fusevol.projection.paths import validate_payload

if TYPE_CHECKING:
    from collections.abc import Callable

    from fusevol.model import FileProjection, Pod, ProjectedVolumeSource
    from fusevol.projection.downward import NodeAllocatable


def make_payload(
    source: ProjectedVolumeSource,
    pod: Pod,
    *,
    get_configmap: Callable[[str], ConfigMap | None],
    get_secret: Callable[[str], Secret | None],
    allocatable: NodeAllocatable,
) -> dict[str, FileProjection]:
    payload: dict[str, FileProjection] = {}
    errors: list[str] = []
    mode = source.default_mode
    for projection in source.sources:
        try:
            match projection:
                case ConfigMapProjection(name=name, items=items, optional=optional):
                    volume = ConfigMapVolumeSource(name, items, mode, optional)
                    payload.update(configmap.make_payload(volume, get_configmap(name)))
                case SecretProjection(name=name, items=items, optional=optional):
                    secret_volume = SecretVolumeSource(name, items, mode, optional)
                    payload.update(secret.make_payload(secret_volume, get_secret(name)))
                case DownwardAPIProjection(items=items):
                    files, item_errors = downward.collect(
                        items, pod, default_mode=mode, allocatable=allocatable
                    )
                    payload.update(files)
                    errors.extend(item_errors)
                case ServiceAccountTokenProjection(path=path):
                    raise VolumeSetupError(
                        f"serviceAccountToken {path!r}: needs the Kubernetes API source"
                    )
        except FusevolError as exc:
            errors.append(str(exc))
    if errors:
        raise VolumeSetupError(downward.aggregate_message(errors))
    return validate_payload(payload)
