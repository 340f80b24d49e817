"""`fusevol convert`: what the webhook would do to the pods of a manifest, as a manifest.

Reads multi-document YAML or JSON (`kind: List` too); converts every Pod and every pod template
of a workload (Deployment, ReplicaSet, StatefulSet, DaemonSet, Job, CronJob,
ReplicationController, PodTemplate) as the webhook converts a pod (`fusevol.webhook.convert`),
in the object's namespace (`default` without one); other documents pass unchanged. The driver is
taken to exist, with the token requests given; the audit follows the pods' own annotation only
(the namespaces' are the cluster's). What comes out is YAML (comments are not kept),
one document per document in, and a report per pod: what was converted, and why not the rest.

Excludes: the webhook's namespace and pod selection (its configuration's), the cluster.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml

from fusevol.base.errors import ManifestError
from fusevol.webhook.convert import Conversion, Driver, convert_pod

if TYPE_CHECKING:
    from collections.abc import Iterator

TEMPLATES: dict[str, tuple[str, ...]] = {
    "Pod": (),
    "PodTemplate": ("template",),
    "Deployment": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
"""Where each kind keeps the pod (or the pod template) the webhook would see."""


@dataclass(frozen=True, slots=True)
class Report:
    """One pod's conversion: `subject` names the object (`Deployment default/web`)."""

    subject: str
    conversion: Conversion

    def lines(self) -> list[str]:
        conversion = self.conversion
        lines = [
            f"{self.subject}: converted {', '.join(conversion.converted) or 'nothing'}",
            *(
                [f"{self.subject}: audited {', '.join(conversion.audited)}"]
                if conversion.audited
                else []
            ),
            *(
                f"{self.subject}: kept {name} unmounted as {reference}: the pod names what it reads"
                for reference, name in conversion.references.items()
            ),
            *(
                f"{self.subject}: not converted {name}: {reason}"
                for name, reason in conversion.not_converted.items()
            ),
        ]
        # A volume's warning says what its "not converted" line says already.
        warnings = [w for w in conversion.warnings if not w.startswith("volume ")]
        return lines + [f"{self.subject}: warning: {w}" for w in warnings]


def convert_text(text: bytes, *, origin: str, driver: Driver) -> tuple[str, list[Report]]:
    """The converted manifest (YAML) and a report per pod; ManifestError if it does not parse."""
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ManifestError(f"{origin}: not YAML or JSON: {exc}") from None
    reports: list[Report] = []
    for document in documents:
        for obj in _objects(document):
            reports.extend(_convert(obj, driver))
    out = yaml.safe_dump_all(documents, sort_keys=False, default_flow_style=False)
    return out, reports


def _objects(document: Any) -> Iterator[dict[str, Any]]:
    if isinstance(document, dict) and document.get("kind") == "List":
        for item in document.get("items") or []:
            yield from _objects(item)
    elif isinstance(document, dict):
        yield document


def _convert(obj: dict[str, Any], driver: Driver) -> list[Report]:
    path = TEMPLATES.get(str(obj.get("kind")))
    if path is None:
        return []
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        metadata = {}
    namespace = str(metadata.get("namespace") or "default")
    pod: Any = obj
    for key in path:
        pod = pod.get(key) if isinstance(pod, dict) else None
    subject = f"{obj['kind']} {namespace}/{metadata.get('name') or metadata.get('generateName')}"
    if not isinstance(pod, dict):
        return [Report(subject, Conversion(warnings=("no pod template: left as it is",)))]
    conversion = convert_pod(pod, namespace=namespace, driver=driver)
    apply_patch(pod, conversion.patch)
    return [Report(subject, conversion)]


def apply_patch(obj: dict[str, Any], patch: list[dict[str, Any]]) -> None:
    """Apply the conversion's patch in place: its `add` and `replace` operations (RFC 6902) on
    object members, array elements and the end of an array (`-`), which are all it makes."""
    for operation in patch:
        *parents, last = [
            p.replace("~1", "/").replace("~0", "~") for p in operation["path"].split("/")[1:]
        ]
        target: Any = obj
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        value = json.loads(json.dumps(operation["value"]))
        if isinstance(target, list) and last == "-":
            target.append(value)
        elif isinstance(target, list) and operation["op"] == "add":
            target.insert(int(last), value)
        elif isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value
