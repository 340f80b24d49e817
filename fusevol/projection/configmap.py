"""The payload of a configMap volume: kubelet's `configmap.MakePayload` plus its not-found rule.

Owns how a ConfigMap's two maps become one `{key: bytes}` view. The source encoded `data` once, and
payloads share those bytes, so every volume of every pod holds the same copy. The API forbids a
key in both maps, but a manifest source may not have checked, so the precedence copies kubelet's:
with items `data` is looked up first; without items `binaryData` is written last and wins. The
projection rules themselves live in `_items.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusevol.projection._items import project_keys

if TYPE_CHECKING:
    from collections.abc import Mapping

    from fusevol.model import ConfigMap, ConfigMapVolumeSource, FileProjection


def make_payload(
    source: ConfigMapVolumeSource, configmap: ConfigMap | None, *, field: str = "items"
) -> dict[str, FileProjection]:
    """Build the validated payload of `source` over `configmap` (None: not found).

    Raises `VolumeSetupError` for a missing non-optional ConfigMap or listed key, and
    `InvalidPayload` for a path AtomicWriter would reject (`field` names the items).
    """
    return project_keys(
        entries=None if configmap is None else _entries(configmap, items=bool(source.items)),
        items=source.items,
        default_mode=source.default_mode,
        optional=source.optional,
        not_found=f'configmap "{source.name}" not found',
        field=field,
        missing_key="configmap references non-existent config key",
    )


def _entries(configmap: ConfigMap, *, items: bool) -> Mapping[str, bytes]:
    if items:
        return {**configmap.binary_data, **configmap.data}
    return {**configmap.data, **configmap.binary_data}
