"""The payload of a secret volume: kubelet's `secret.MakePayload` plus its not-found rule.

`Secret.data` is already base64-decoded bytes, so it is the `{key: bytes}` view as is; the
projection rules live in `_items.py`. The bytes must never reach a message or a log line: errors
here name the Secret and its keys only, and `FileProjection`'s repr hides its data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusevol.projection._items import project_keys

if TYPE_CHECKING:
    from fusevol.model import FileProjection, Secret, SecretVolumeSource


def make_payload(
    source: SecretVolumeSource, secret: Secret | None, *, field: str = "items"
) -> dict[str, FileProjection]:
    """Build the validated payload of `source` over `secret` (None: not found).

    Raises `VolumeSetupError` for a missing non-optional Secret or listed key, and
    `InvalidPayload` for a path AtomicWriter would reject (`field` names the items).
    """
    return project_keys(
        entries=None if secret is None else secret.data,
        items=source.items,
        default_mode=source.default_mode,
        optional=source.optional,
        not_found=f'secret "{source.secret_name}" not found',
        field=field,
        missing_key="references non-existent secret key",
    )
