"""The key-to-file projection that kubelet's configMap and secret `MakePayload` share.

Owns the rules both builders apply once they hold a `{key: bytes}` view of the object
(docs/kubelet.md fact 3): a missing object is empty when optional and an error otherwise; without
items every key becomes a file named after it with `defaultMode`; with items only the listed keys
are projected, at `item.path` with `item.mode` or `defaultMode`, and a listed key that is absent is
skipped when optional and an error otherwise. The result goes through `validate_payload`; an item
path it would refuse is refused first with the item's field named (`items[3].path: ...`).

Excludes how each kind turns into that view (`configmap.py`, `secret.py`). Error messages carry
keys and names only, never data: the same code builds Secret payloads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusevol.base.errors import VolumeSetupError
from fusevol.model import FileProjection
from fusevol.projection.paths import validate_field, validate_payload

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from fusevol.model import KeyToPath


def project_keys(
    *,
    entries: Mapping[str, bytes] | None,
    items: Sequence[KeyToPath],
    default_mode: int,
    optional: bool,
    not_found: str,
    missing_key: str,
    field: str = "items",
) -> dict[str, FileProjection]:
    """Build the validated payload of `entries` (None: the object does not exist).

    `not_found` is the whole message for a missing object; `missing_key` is the message prefix for
    an absent listed key, completed with `: <key>` as kubelet does. `field` names the items in
    errors (`sources[1].configMap.items` in a projected volume).
    """
    if entries is None:
        if optional:
            return {}
        raise VolumeSetupError(not_found)
    payload: dict[str, FileProjection] = {}
    if not items:
        for key, value in entries.items():
            payload[key] = FileProjection(data=value, mode=default_mode)
        return validate_payload(payload)
    for index, item in enumerate(items):
        data = entries.get(item.key)
        if data is None:
            if optional:
                continue
            raise VolumeSetupError(f"{missing_key}: {item.key}")
        validate_field(item.path, f"{field}[{index}].path")
        mode = default_mode if item.mode is None else item.mode
        payload[item.path] = FileProjection(data=data, mode=mode)
    return validate_payload(payload)
