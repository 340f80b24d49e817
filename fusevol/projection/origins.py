"""Where each file of a served volume comes from: the object, its resourceVersion and the key (or
downward API field) that a path of the payload shows. Names only, never data: the audit of
reads records these (`fusevol.fuse.audit`).

The mapping follows the payload builders' rules: without items every key of the object is a file
of its name; with items, each listed key that exists is at its item's path; a downward API file
shows a field of the pod; a projected volume's later sources win a path over earlier ones, as its
payload's do. A path the payload lacks (a failed item) has no origin, and one without an origin
here is recorded without an object.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusevol.model import (
    ConfigMap,
    ConfigMapProjection,
    ConfigMapVolumeSource,
    DownwardAPIProjection,
    DownwardAPIVolumeFile,
    DownwardAPIVolumeSource,
    Kind,
    ObjectKey,
    ProjectedVolumeSource,
    Secret,
    SecretProjection,
    SecretVolumeSource,
    ServiceAccountTokenProjection,
)
from fusevol.model.audit import Origin
from fusevol.projection.paths import clean_path

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from fusevol.model import KeyToPath, Pod


def origins(pod: Pod, source: object, get: Callable[[ObjectKey], object]) -> dict[str, Origin]:
    """`{path: Origin}` for the files a volume of `source` shows; `get(key)` reads the store."""
    match source:  # a volume of one source shows what the same projection would
        case ConfigMapVolumeSource(name=name, items=items):
            projections: tuple[object, ...] = (ConfigMapProjection(name, items),)
        case SecretVolumeSource(secret_name=name, items=items):
            projections = (SecretProjection(name, items),)
        case DownwardAPIVolumeSource(items=items):
            projections = (DownwardAPIProjection(items),)
        case ProjectedVolumeSource(sources=sources):
            projections = tuple(sources)
        case _:
            projections = ()
    found: dict[str, Origin] = {}
    for projection in projections:
        match projection:
            case ConfigMapProjection(name=name, items=items):
                found.update(_keys(Kind.CONFIG_MAP, pod.namespace, name, items, get))
            case SecretProjection(name=name, items=items):
                found.update(_keys(Kind.SECRET, pod.namespace, name, items, get))
            case DownwardAPIProjection(items=items):
                found.update(_fields(pod, items))
            case ServiceAccountTokenProjection(path=path):
                account = pod.service_account_name
                found[clean_path(path)] = Origin(
                    "ServiceAccount", pod.namespace, account, "", "token"
                )
    return found


def _keys(
    kind: Kind,
    namespace: str,
    name: str,
    items: tuple[KeyToPath, ...],
    get: Callable[[ObjectKey], object],
) -> Iterable[tuple[str, Origin]]:
    obj = get(ObjectKey(kind, namespace, name))
    if isinstance(obj, ConfigMap):
        keys, version = {*obj.data, *obj.binary_data}, obj.resource_version
    elif isinstance(obj, Secret):
        keys, version = set(obj.data), obj.resource_version
    else:
        return
    for path, key in ((i.path, i.key) for i in items) if items else ((k, k) for k in keys):
        if key in keys:
            yield clean_path(path), Origin(kind.value, namespace, name, str(version), key)


def _fields(pod: Pod, items: tuple[DownwardAPIVolumeFile, ...]) -> Iterable[tuple[str, Origin]]:
    for item in items:
        if item.field_ref is not None:
            field = item.field_ref.field_path
        elif item.resource_field_ref is not None:
            field = item.resource_field_ref.resource
        else:
            continue
        origin = Origin("Pod", pod.namespace, pod.name, str(pod.resource_version), field)
        yield clean_path(item.path), origin
