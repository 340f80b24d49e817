"""A served volume's payload: rendered from the object store, and its paths' length checked.

`render` picks the projection of the volume's type (`fusevol.projection`: configMap, secret,
downwardAPI, projected) and hands it the objects, the pod and the node's allocatable resources it
reads; a missing object or key, or an invalid path, raises VolumeSetupError / InvalidPayload
naming what is wrong, before anything on the node changes (`served`). `check_lengths` is
kubelet's ENAMETOOLONG for a path it could not write below the volume's own directory, the kernel
refusing it as longer than PATH_MAX (`paths.check_written_under`), the error naming the item's
field (`sources[1].configMap.items[0].path`), as the path rules' errors do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusevol.base.errors import VolumeSetupError
from fusevol.model import (
    ConfigMap,
    ConfigMapProjection,
    ConfigMapVolumeSource,
    DownwardAPIProjection,
    DownwardAPIVolumeSource,
    Kind,
    ObjectKey,
    ProjectedVolumeSource,
    Secret,
    SecretProjection,
    SecretVolumeSource,
    ServiceAccountToken,
    ServiceAccountTokenProjection,
    token_key,
)
from fusevol.projection import configmap, downward, paths, projected, secret
from fusevol.projection.paths import clean_path

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

    from fusevol.model import DownwardAPIVolumeFile, KeyToPath, Payload
    from fusevol.projection.downward import NodeAllocatable
    from fusevol.volumemanager.cache.desired import VolumeToServe
    from fusevol.volumemanager.cache.store import ObjectStore


def render(volume: VolumeToServe, *, store: ObjectStore, allocatable: NodeAllocatable) -> Payload:
    """The volume's payload, or VolumeSetupError / InvalidPayload naming what is wrong."""
    match volume.source:
        case ConfigMapVolumeSource() as source:
            key = ObjectKey(Kind.CONFIG_MAP, volume.pod.namespace, source.name)
            return configmap.make_payload(source, store.get(key, ConfigMap))
        case SecretVolumeSource() as source:
            key = ObjectKey(Kind.SECRET, volume.pod.namespace, source.secret_name)
            return secret.make_payload(source, store.get(key, Secret))
        case DownwardAPIVolumeSource(items=items, default_mode=default_mode):
            return downward.make_payload(
                items, volume.pod, default_mode=default_mode, allocatable=allocatable
            )
        case ProjectedVolumeSource() as source:
            namespace = volume.pod.namespace
            return projected.make_payload(
                source,
                volume.pod,
                get_configmap=lambda name: store.get(
                    ObjectKey(Kind.CONFIG_MAP, namespace, name), ConfigMap
                ),
                get_secret=lambda name: store.get(ObjectKey(Kind.SECRET, namespace, name), Secret),
                allocatable=allocatable,
                get_token=lambda projection: _token(store, volume, projection),
            )
        case _:
            raise VolumeSetupError(f"volume {volume.volume.name!r}: not served from memory")


def _token(
    store: ObjectStore, volume: VolumeToServe, projection: ServiceAccountTokenProjection
) -> bytes | None:
    token = store.get(token_key(volume.pod, projection), ServiceAccountToken)
    return None if token is None else token.token


def check_lengths(volume: VolumeToServe, directory: Path, payload: Iterable[str]) -> None:
    """kubelet's ENAMETOOLONG for a path of `payload` below the volume's own `directory`
    (`paths.check_written_under`), the error naming the item's field."""
    paths.check_written_under(
        str(directory),
        payload,
        field_of=lambda path: _item_field(volume.source, path),
    )


def _item_field(source: object, path: str) -> str:
    """The field of `source` that gives the payload `path`, e.g.
    `sources[1].configMap.items[0].path`; "" if none (a key without items)."""

    def first(items: Iterable[KeyToPath | DownwardAPIVolumeFile], at: str) -> str:
        for index, item in enumerate(items):
            if clean_path(item.path) == path:
                return f"{at}[{index}].path"
        return ""

    match source:
        case (
            ConfigMapVolumeSource(items=items)
            | SecretVolumeSource(items=items)
            | DownwardAPIVolumeSource(items=items)
        ):
            return first(items, "items")
        case ProjectedVolumeSource(sources=sources):
            for index, projection in enumerate(sources):
                at = f"sources[{index}]"
                match projection:
                    case ServiceAccountTokenProjection(path=token_path):
                        token = clean_path(token_path) == path
                        found = f"{at}.serviceAccountToken.path" if token else ""
                    case ConfigMapProjection(items=items):
                        found = first(items, f"{at}.configMap.items")
                    case SecretProjection(items=items):
                        found = first(items, f"{at}.secret.items")
                    case DownwardAPIProjection(items=items):
                        found = first(items, f"{at}.downwardAPI.items")
                    case _:
                        found = ""
                if found:
                    return found
    return ""
