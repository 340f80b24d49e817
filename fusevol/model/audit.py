"""Which served volumes are audited: every open of their files is recorded (`fusevol.fuse.audit`).

A volume is audited at the highest level any of these asks for; none of them can lower what
another asks (a tenant cannot turn off an audit its node or its namespace turned on):

    the node's default          `fusevol run --audit off|secrets|all` (the chart's `audit.default`)
    the pod's annotation        `fusevol.io/audit: off|secrets|all`
    the namespace's annotation  the same, copied by the admission webhook into each volume it
                                converts (the node may not read namespaces)
    a CSI volume's attribute    `fusevol.io/audit: "true"` (every file of that volume)

`secrets` audits the volumes that show a Secret (secret volumes, projected volumes with a secret
source); `all` every configMap, secret, downwardAPI and projected volume.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fusevol.model.sources import ProjectedVolumeSource, SecretProjection, SecretVolumeSource

if TYPE_CHECKING:
    from collections.abc import Mapping

ANNOTATION = "fusevol.io/audit"
"""A pod's or a namespace's audit level; also the CSI volume attribute ("true" / "false")."""


class AuditLevel(enum.IntEnum):
    OFF = 0
    SECRETS = 1
    ALL = 2

    @classmethod
    def parse(cls, text: str, *, where: str) -> AuditLevel:
        """`off`, `secrets` or `all`; anything else is a ValueError naming `where`."""
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"{where}: {text!r} is not one of off, secrets, all") from None


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a file of a served volume comes from: an object's key, or a downward API field
    (kind "Pod"), at the object's resourceVersion (`fusevol.projection.origins`)."""

    kind: str
    namespace: str
    name: str
    resource_version: str
    key: str


def pod_level(annotations: Mapping[str, str]) -> AuditLevel:
    """The level a pod's annotation asks for. An unknown value asks for `all`: the annotation's
    author wanted an audit, and a typo must not silently turn it off (the webhook and
    `fusevol convert` warn of such a value)."""
    text = annotations.get(ANNOTATION)
    if text is None:
        return AuditLevel.OFF
    try:
        return AuditLevel.parse(text, where=ANNOTATION)
    except ValueError:
        return AuditLevel.ALL


def shows_secret(source: object) -> bool:
    match source:
        case SecretVolumeSource():
            return True
        case ProjectedVolumeSource(sources=sources):
            return any(isinstance(p, SecretProjection) for p in sources)
        case _:
            return False


def audited(level: AuditLevel, source: object) -> bool:
    """Whether a served volume of `source` is audited at `level`."""
    return level is AuditLevel.ALL or (level is AuditLevel.SECRETS and shows_secret(source))
