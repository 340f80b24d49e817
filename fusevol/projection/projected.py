"""The payload of a projected volume: kubelet's `projected.collectData` (docs/kubelet.md fact 3).

Sources are merged in order into one payload, under one `..data`; a later source wins on an
identical path. configMap and secret sources follow their volumes' rules with the projected
volume's `defaultMode` and their own `optional`; downwardAPI sources follow the downwardAPI
volume's. Errors of all sources are reported together (kubelet's aggregate: `[a, b]`).
serviceAccountToken sources take the token the Kubernetes API source obtained for this pod by
TokenRequest (`get_token`; without that source there is none, and the volume fails with a clear
error). The token file has the projected volume's `defaultMode`, but 0600 when the pod has an
fsGroup or a common runAsUser (`fs_user_from`), and is owned by that user (docs/kubelet.md fact 3).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusevol.base.errors import FusevolError, VolumeSetupError
from fusevol.model import (
    ConfigMap,
    ConfigMapProjection,
    ConfigMapVolumeSource,
    DownwardAPIProjection,
    FileProjection,
    Secret,
    SecretProjection,
    SecretVolumeSource,
    ServiceAccountTokenProjection,
)
from fusevol.projection import configmap, downward, secret
from fusevol.projection.paths import clean_path, validate_field, validate_payload

if TYPE_CHECKING:
    from collections.abc import Callable

    from fusevol.model import Pod, ProjectedVolumeSource
    from fusevol.projection.downward import NodeAllocatable


def make_payload(
    source: ProjectedVolumeSource,
    pod: Pod,
    *,
    get_configmap: Callable[[str], ConfigMap | None],
    get_secret: Callable[[str], Secret | None],
    allocatable: NodeAllocatable,
    get_token: Callable[[ServiceAccountTokenProjection], bytes | None] = lambda _: None,
) -> dict[str, FileProjection]:
    payload: dict[str, FileProjection] = {}
    errors: list[str] = []
    mode = source.default_mode
    for index, projection in enumerate(source.sources):
        at = f"sources[{index}]"
        try:
            match projection:
                case ConfigMapProjection(name=name, items=items, optional=optional):
                    volume = ConfigMapVolumeSource(name, items, mode, optional)
                    payload.update(
                        configmap.make_payload(
                            volume, get_configmap(name), field=f"{at}.configMap.items"
                        )
                    )
                case SecretProjection(name=name, items=items, optional=optional):
                    secret_volume = SecretVolumeSource(name, items, mode, optional)
                    payload.update(
                        secret.make_payload(
                            secret_volume, get_secret(name), field=f"{at}.secret.items"
                        )
                    )
                case DownwardAPIProjection(items=items):
                    files, item_errors = downward.collect(
                        items, pod, default_mode=mode, allocatable=allocatable
                    )
                    payload.update(files)
                    errors.extend(item_errors)
                    if not item_errors:
                        downward.check_paths(items, f"{at}.downwardAPI.items")
                case ServiceAccountTokenProjection(path=path):
                    validate_field(clean_path(path), f"{at}.serviceAccountToken.path")
                    token = get_token(projection)
                    if token is None:
                        raise VolumeSetupError(
                            f"serviceAccountToken {path!r}: no token for service account "
                            f'"{pod.service_account_name}" (tokens need the Kubernetes API source)'
                        )
                    fs_user = fs_user_from(pod)
                    token_mode = 0o600 if fs_user is not None or pod.fs_group is not None else mode
                    payload[clean_path(path)] = FileProjection(token, token_mode, fs_user)
        except FusevolError as exc:
            errors.append(str(exc))
    if errors:
        raise VolumeSetupError(downward.aggregate_message(errors))
    return validate_payload(payload)


def fs_user_from(pod: Pod) -> int | None:
    """kubelet's `FsUserFrom`: the effective runAsUser shared by every container (init ones
    included), None if one has none or they differ."""
    users = {
        c.run_as_user if c.run_as_user is not None else pod.run_as_user
        for c in (*pod.init_containers, *pod.containers)
    }
    if len(users) != 1:
        return None
    return users.pop()
