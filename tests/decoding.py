"""What `parse_manifest` reports for bad input, wherever it reports it.

An error in a volume's source fails that volume alone (`InvalidVolumeSource`, the pod is still
read); any other error fails the manifest (`ManifestError`). `manifest_error` gives either as the
one full message, `<origin>: <object>: <field>: <what>`, so that a table of bad inputs need not
know which of the two a rule is.
"""

from __future__ import annotations

from fusevol.base.errors import ManifestError
from fusevol.decode.manifest import parse_manifest
from fusevol.model import InvalidVolumeSource, Pod


def manifest_error(data: bytes, *, origin: str) -> str:
    """The error of `data`; AssertionError if it has none, or more than one invalid volume."""
    try:
        objects = parse_manifest(data, origin=origin)
    except ManifestError as exc:
        return str(exc)
    errors = [
        f"{origin}: pod {obj.namespace}/{obj.name}: {volume.source.error}"
        for obj in objects
        if isinstance(obj, Pod)
        for volume in obj.volumes
        if isinstance(volume.source, InvalidVolumeSource)
    ]
    assert len(errors) == 1, f"expected one error, got {errors}"
    return errors[0]
