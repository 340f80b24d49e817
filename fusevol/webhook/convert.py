"""A pod's configMap, secret, downwardAPI and projected volumes -> inline `csi:` volumes of the
driver fusevol.io, and the report of what was converted and why the rest was not.

A converted volume keeps its name and becomes

    csi: {driver: fusevol.io, readOnly: true, volumeAttributes: {volume: <{type: source} as JSON>}}

which the agent reads with the CSI attribute parser (`fusevol.csi.attributes`), that is with the
pod-spec parser itself. A volume is converted only where the driver then serves what kubelet
would have served:
    1. fusevol's pod-spec parser reads it as a served source: an invalid one is kept (and named in
       a warning), and so is a projected clusterTrustBundle or podCertificate source, which
       fusevol does not serve;
    2. the CSIDriver fusevol.io exists and takes inline volumes with the pod's identity
       (`Driver.problem`); a Windows pod or a mirror pod is never converted;
    3. each serviceAccountToken source's audience and lifetime are one of the CSIDriver's
       `tokenRequests`, with `requiresRepublish`: kubelet then passes the very token it would have
       projected, and refreshes it (otherwise the agent would request its own). A downward API
       file of `metadata.annotations` converts too: the agent adds kubelet's own annotations
       (`kubernetes.io/config.seen`, `config.source`) to a CSI volume's pod as kubelet does;
    4. its attribute, read back by the CSI attribute parser, is the very source of step 1.

A converted volume that is audited (`fusevol.model.audit.audited`) at the higher of the levels
its pod's annotation `fusevol.io/audit` and its namespace's ask for gets the CSI attribute
`fusevol.io/audit: "true"`: the agent may not read namespaces (the Node authorizer), so the
webhook carries the namespace's level to it. The namespace's level is asked for (`namespace_audit`,
the webhook's namespace watch) only when a volume is to be converted; `fusevol convert` has no
cluster and applies the pod's annotation only. An annotation that is no level (a typo) audits as
`all`, with a warning, as the agent reads it.

A converted volume that reads ConfigMaps or Secrets keeps its original, under a name of its own
(`reference_name`: `fusevol-ref-<name>`) that no container mounts. kubelet never sets up a volume
no container mounts (its populator skips it), but the API server's Node authorizer builds its
graph from every volume of the spec: the pod still names each object it reads, so the agent may
read them as its node, exactly as kubelet could, and whoever reads the pod's spec sees what its
volumes are made of.

The pod's annotation `fusevol.io/volumes` lists the converted volumes, for each volume of those
four types left as it was why, and the kept originals by their names (`{"converted": [...],
"notConverted": {name: reason}, "references": {"fusevol-ref-<name>": name}}`).

Idempotent: a volume already converted (a fusevol.io volume the annotation lists) stays listed,
a kept original the annotation lists is left as it is, and a second pass over a converted pod
changes nothing. The JSON text is YAML-safe: characters
YAML does not take as they are (C0 and C1 controls, U+FFFE, U+FFFF, lone surrogates) are
written as JSON escapes; astral characters are kept as they are (an escaped surrogate pair would
read back as two characters).

Excludes: the AdmissionReview (`fusevol.webhook.admission`), where the CSIDriver and the
namespaces are read from (`fusevol.webhook.cluster`), manifests of workloads
(`fusevol.webhook.manifests`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fusevol import model
from fusevol.base.errors import ManifestError
from fusevol.csi import attributes
from fusevol.decode.reader import Reader
from fusevol.decode.volume_sources import parse_volumes
from fusevol.model import PodUID
from fusevol.model.audit import ANNOTATION as AUDIT_ANNOTATION, AuditLevel, audited

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Set

DRIVER = attributes.DRIVER
ANNOTATION = "fusevol.io/volumes"
SERVED_TYPES = attributes.SERVED_TYPES
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
_DEFAULT_TOKEN_SECONDS = 3600
"""A tokenRequest without `expirationSeconds`: TokenRequest's defaulting (`SetDefaults_
TokenRequestSpec`), what kubelet's request for the CSI driver then gets."""
_NOT_YAML = re.compile("[^\t\n\r\x20-\x7e\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
"""What PyYAML's reader refuses, or reads otherwise (U+0085 is a line break to it)."""

REFERENCE_PREFIX = "fusevol-ref-"
_MAX_VOLUME_NAME = 63
"""A volume's name is a DNS label (`IsDNS1123Label`)."""
Json = Any


@dataclass(frozen=True, slots=True)
class TokenRequest:
    """One of the CSIDriver's `tokenRequests`: kubelet passes a token of this audience and
    lifetime on every publish."""

    audience: str
    expiration_seconds: int = _DEFAULT_TOKEN_SECONDS


@dataclass(frozen=True, slots=True)
class Driver:
    """What the conversion needs of the CSIDriver fusevol.io. `problem`: why nothing can be
    converted ("" when something can)."""

    problem: str = ""
    token_requests: frozenset[TokenRequest] = frozenset()
    requires_republish: bool = False

    @classmethod
    def missing(cls, why: str) -> Driver:
        return cls(problem=why)

    @classmethod
    def from_object(cls, obj: Json) -> Driver:
        """A CSIDriver object as the API server sends it (defaulted)."""
        spec = obj.get("spec") if isinstance(obj, dict) else None
        if not isinstance(spec, dict):
            return cls.missing(f"the CSIDriver {DRIVER} has no spec")
        if "Ephemeral" not in (spec.get("volumeLifecycleModes") or []):
            return cls.missing(f"the CSIDriver {DRIVER} does not list Ephemeral volumes")
        if spec.get("podInfoOnMount") is not True:
            return cls.missing(f"the CSIDriver {DRIVER} does not set podInfoOnMount")
        requests = set()
        for request in spec.get("tokenRequests") or []:
            if isinstance(request, dict) and isinstance(request.get("audience"), str):
                seconds = request.get("expirationSeconds")
                if not isinstance(seconds, int) or isinstance(seconds, bool):
                    seconds = _DEFAULT_TOKEN_SECONDS
                requests.add(TokenRequest(request["audience"], seconds))
        return cls(
            token_requests=frozenset(requests),
            requires_republish=spec.get("requiresRepublish") is True,
        )


@dataclass(frozen=True, slots=True)
class Conversion:
    """What the conversion of one pod did: the JSON Patch (RFC 6902) that makes the pod so (empty:
    nothing changes), what it reports (`references`: kept original -> converted volume), and the
    warnings for the one who created it."""

    patch: list[dict[str, Json]] = field(default_factory=list)
    converted: tuple[str, ...] = ()
    not_converted: Mapping[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    references: Mapping[str, str] = field(default_factory=dict)
    audited: tuple[str, ...] = ()
    """The converted volumes given the attribute `fusevol.io/audit: "true"` (this pass)."""


def convert_pod(
    pod: Json,
    *,
    namespace: str,
    driver: Driver,
    namespace_audit: Callable[[], AuditLevel] | None = None,
) -> Conversion:
    """The conversion of `pod` (a Pod as JSON); never raises on any JSON value.
    `namespace_audit`: the level the namespace's annotation asks for, called at most once, when
    a volume is to be converted (None: no namespace level, as in `fusevol convert`)."""
    if not isinstance(pod, dict):
        return Conversion(warnings=("the object is not a JSON object: admitted unchanged",))
    metadata = {} if pod.get("metadata") is None else pod["metadata"]
    spec = {} if pod.get("spec") is None else pod["spec"]
    if not isinstance(metadata, dict) or not isinstance(spec, dict):
        return Conversion(warnings=("metadata or spec is not a JSON object: admitted unchanged",))
    annotations = metadata.get("annotations") or {}
    if not isinstance(annotations, dict):
        annotations = {}
    if MIRROR_ANNOTATION in annotations:
        return Conversion()  # kubelet runs the static pod's own spec, not this copy's
    name = _pod_name(metadata)
    reader = Reader(origin="admission", subject=f"pod {namespace}/{name}")
    raw = spec.get("volumes")
    try:
        volumes = parse_volumes(reader, raw)
    except ManifestError as exc:
        return Conversion(warnings=(f"{exc}: admitted unchanged",))
    assert isinstance(raw, list) or not volumes
    entries: list[Json] = raw if isinstance(raw, list) else []
    identity = attributes.PodIdentity(
        namespace, name, PodUID(""), _string(spec.get("serviceAccountName")) or "default"
    )
    pod_problem = driver.problem or _pod_problem(spec)
    before, references_before = _listed(annotations.get(ANNOTATION))
    taken: set[str] = {volume.name for volume in volumes}
    patch: list[dict[str, Json]] = []
    converted: list[str] = []
    not_converted: dict[str, str] = {}
    references: dict[str, str] = {}
    warnings: list[str] = []
    audit_levels: list[AuditLevel] = []  # the pod's and the namespace's, once asked for
    audited_names: list[str] = []

    def audit_level() -> AuditLevel:
        if not audit_levels:
            pod_level = _pod_audit(annotations.get(AUDIT_ANNOTATION), warnings)
            ns_level = namespace_audit() if namespace_audit is not None else AuditLevel.OFF
            audit_levels.append(max(pod_level, ns_level))
        return audit_levels[0]

    for index, (entry, volume) in enumerate(zip(entries, volumes, strict=True)):
        type_name = _type_of(entry)
        if type_name == "csi" and _is_ours(entry) and volume.name in before:
            converted.append(volume.name)  # (a second pass)
            continue
        if volume.name in references_before and references_before[volume.name] in before:
            references[volume.name] = references_before[volume.name]  # (a second pass)
            continue
        if type_name not in SERVED_TYPES:
            continue
        if isinstance(volume.source, model.InvalidVolumeSource):
            reason = f"fusevol cannot read it: {volume.source.error}"
            warnings.append(f"volume {volume.name!r} is not converted: {reason}")
        elif isinstance(volume.source, model.UnsupportedVolumeSource):
            reason = f"fusevol does not serve {volume.source.type_name} sources"
        else:
            reason = pod_problem or _token_problem(volume.source, driver)
        csi_attributes: dict[str, str] = {}
        if not reason:
            text = _yaml_safe(json.dumps({type_name: entry[type_name]}, ensure_ascii=False))
            csi_attributes["volume"] = text
            if audited(audit_level(), volume.source):
                csi_attributes[attributes.AUDIT] = "true"
            reason = _read_back_problem(csi_attributes, volume, identity)
        if reason:
            not_converted[volume.name] = reason
            continue
        converted.append(volume.name)
        if attributes.AUDIT in csi_attributes:
            audited_names.append(volume.name)
        patch.append(
            {
                "op": "replace",
                "path": f"/spec/volumes/{index}",
                "value": {
                    "name": volume.name,
                    "csi": {
                        "driver": DRIVER,
                        "readOnly": True,
                        "volumeAttributes": csi_attributes,
                    },
                },
            }
        )
        if model.names_objects(volume.source):
            reference = reference_name(volume.name, taken)
            taken.add(reference)
            references[reference] = volume.name
            patch.append(
                {"op": "add", "path": "/spec/volumes/-", "value": {**entry, "name": reference}}
            )
    if converted or not_converted:
        report = json.dumps(
            {"converted": converted, "notConverted": not_converted}
            | ({"references": references} if references else {})
        )
        if annotations.get(ANNOTATION) != report:
            patch.append(_annotate(pod, report))
    return Conversion(
        patch,
        tuple(converted),
        not_converted,
        tuple(warnings),
        references,
        tuple(audited_names),
    )


def _pod_name(metadata: Mapping[str, Json]) -> str:
    """The pod's name; at admission a controller's pod has only its `generateName`."""
    name = _string(metadata.get("name"))
    return name or (_string(metadata.get("generateName")) + "<generated>")


def _pod_problem(spec: Mapping[str, Json]) -> str:
    os_name = spec.get("os")
    selector = spec.get("nodeSelector")
    if (isinstance(os_name, dict) and os_name.get("name") == "windows") or (
        isinstance(selector, dict) and selector.get("kubernetes.io/os") == "windows"
    ):
        return f"a Windows pod: {DRIVER} serves Linux nodes"
    return ""


def _token_problem(source: model.VolumeSource, driver: Driver) -> str:
    """(3) Why kubelet would not pass the volume's tokens to the driver as it projects them."""
    if not isinstance(source, model.ProjectedVolumeSource):
        return ""
    for projection in source.sources:
        if not isinstance(projection, model.ServiceAccountTokenProjection):
            continue
        wanted = TokenRequest(projection.audience, projection.expiration_seconds)
        if wanted not in driver.token_requests:
            return (
                f"serviceAccountToken {projection.path!r}: audience {projection.audience!r} for "
                f"{projection.expiration_seconds} s is not one of the tokenRequests of the "
                f"CSIDriver {DRIVER}"
            )
        if not driver.requires_republish:
            return (
                f"serviceAccountToken {projection.path!r}: the CSIDriver {DRIVER} does not set "
                "requiresRepublish (its tokens would not be refreshed)"
            )
    return ""


def _pod_audit(text: Json, warnings: list[str]) -> AuditLevel:
    """The level the pod's annotation asks for; one that is no level audits as `all`, as the
    agent reads it (`fusevol.model.audit.pod_level`), with a warning."""
    if text is None:
        return AuditLevel.OFF
    if not isinstance(text, str):  # `fusevol convert`: YAML reads an unquoted `off` as false
        warnings.append(
            f"annotation {AUDIT_ANNOTATION}: {text!r} is not a string (the API server refuses "
            "it: quote it): audited as all"
        )
        return AuditLevel.ALL
    try:
        return AuditLevel.parse(text, where=f"annotation {AUDIT_ANNOTATION}")
    except ValueError as exc:
        warnings.append(f"{exc}: audited as all")
        return AuditLevel.ALL


def _read_back_problem(
    csi_attributes: Mapping[str, str], volume: model.Volume, identity: attributes.PodIdentity
) -> str:
    """(4) Why the attributes would not be served as the volume: "" when they would."""
    try:
        source = attributes.read_source(csi_attributes, identity, volume.name)
    except attributes.CsiError as exc:
        return f"the CSI driver would refuse it: {exc}"
    if source != volume.source:
        return "the CSI driver would read it otherwise"
    return ""


def _yaml_safe(text: str) -> str:
    return _NOT_YAML.sub(lambda m: f"\\u{ord(m[0]):04x}", text)


def _annotate(pod: Mapping[str, Json], report: str) -> dict[str, Json]:
    """The patch operation that sets the annotation (`add` replaces a member that exists)."""
    metadata = pod.get("metadata")
    if not isinstance(metadata, dict):
        return {"op": "add", "path": "/metadata", "value": {"annotations": {ANNOTATION: report}}}
    if isinstance(metadata.get("annotations"), dict):
        return {"op": "add", "path": "/metadata/annotations/fusevol.io~1volumes", "value": report}
    return {"op": "add", "path": "/metadata/annotations", "value": {ANNOTATION: report}}


def reference_name(name: str, taken: Set[str]) -> str:
    """The name under which the original of the converted volume `name` is kept: a DNS label
    that no volume in `taken` has."""
    candidate = REFERENCE_PREFIX + name
    for attempt in itertools.count():
        if len(candidate) <= _MAX_VOLUME_NAME and candidate not in taken:
            return candidate
        digest = hashlib.sha256(f"{name}/{attempt}".encode()).hexdigest()[:12]
        head = name[: _MAX_VOLUME_NAME - len(REFERENCE_PREFIX) - len(digest) - 1]
        candidate = f"{REFERENCE_PREFIX}{head}-{digest}"
    raise AssertionError("unreachable")


def _listed(annotation: Json) -> tuple[frozenset[str], dict[str, str]]:
    """The volumes an earlier pass converted, and the originals it kept (by their names), from
    its annotation (anything else: none)."""
    try:
        value = json.loads(annotation) if isinstance(annotation, str) else None
    except ValueError:
        return frozenset(), {}
    if not isinstance(value, dict):
        return frozenset(), {}
    listed = value.get("converted")
    converted = frozenset(
        name for name in (listed if isinstance(listed, list) else ()) if isinstance(name, str)
    )
    kept = value.get("references")
    references = {
        reference: name
        for reference, name in (kept.items() if isinstance(kept, dict) else ())
        if isinstance(reference, str) and isinstance(name, str)
    }
    return converted, references


def _type_of(entry: Json) -> str:
    types = [k for k, v in entry.items() if k != "name" and v is not None]
    return str(types[0]) if len(types) == 1 else ""


def _is_ours(entry: Mapping[str, Json]) -> bool:
    csi = entry.get("csi")
    return isinstance(csi, dict) and csi.get("driver") == DRIVER


def _string(value: Json) -> str:
    return value if isinstance(value, str) else ""
