"""One decoded Kubernetes object (a manifest document, or an API server's JSON) -> a fusevol model
object, with the API server's defaulting and the subset of `pkg/apis/core/validation` that shapes
what fusevol serves.

Owns the per-kind converters (Pod, ConfigMap, Secret, PersistentVolume, PersistentVolumeClaim,
StorageClass of `storage.k8s.io/v1`), the defaulting fusevol relies on (namespace `default`,
`stringData` merged over `data`, a stable uid for pods that carry none) and their validation
(docs/kubelet.md fact 4). What becomes a directory on the node has the form the API server
would give it, whatever a manifest says: a pod's and a claim's uid that of a UID, a container's
name a DNS label unique in its pod (with the names validated already: namespaces, objects,
volumes). Pod volumes are read by `fusevol.decode.volume_sources`, typed fields by
`fusevol.decode.reader`; container `resources` are kept as quantity strings after a light check
(`reader.Reader.quantity_map`), and parsed where a downwardAPI file reads them. Error messages
carry keys and paths, never values (Secret data stays out of logs).

Excludes: text decoding (`fusevol.decode.manifest`), validation of fields fusevol does not read
(label syntax, images, resource names and requests against limits, Secret type-specific keys,
required containers), and the payload path rules applied when a volume is rendered
(`fusevol.projection.paths`).
"""

from __future__ import annotations

import logging
import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fusevol import model
from fusevol.decode.reader import NO_ENTRIES, Reader, quote
from fusevol.decode.volume_sources import parse_volumes, persistent_source
from fusevol.model import KubeObject, ResourceVersion, VolumeName

if TYPE_CHECKING:
    from collections.abc import Mapping

log = logging.getLogger(__name__)


def convert_object(document: Mapping[Any, object], *, origin: str) -> KubeObject | None:
    """One decoded object (a manifest document, or an API server's JSON) -> a model object, with
    the same defaulting and validation; None for kinds fusevol does not act on. Raises
    `ManifestError` naming `origin`, the object and the field."""
    return convert(document, origin=origin, where="object")


# -- one object ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Header:
    namespace: str
    name: str
    resource_version: ResourceVersion
    metadata: Mapping[object, object]

    @property
    def identity(self) -> tuple[str, str, ResourceVersion]:
        """The first three fields of ConfigMap and Secret."""
        return self.namespace, self.name, self.resource_version


def convert(document: Mapping[object, object], *, origin: str, where: str) -> KubeObject | None:
    document_reader = Reader(origin, where)
    kind = document_reader.string(document.get("kind"), "kind")  # as the API decodes: a string
    api_version = document_reader.string(document.get("apiVersion", "v1"), "apiVersion")
    if kind not in _KINDS or api_version != _API_VERSIONS.get(kind, "v1"):
        log.debug("%s: %s: skipped kind=%r apiVersion=%r", origin, where, kind, api_version)
        return None
    label = str(kind).lower()
    unnamed = Reader(origin, f"{where} ({label})")
    metadata = unnamed.mapping(document.get("metadata"), "metadata")
    name = unnamed.term(metadata.get("name"), "metadata.name", required=True)
    if kind in ("PersistentVolume", "StorageClass"):  # cluster-scoped
        r = Reader(origin, f"{label} {name}")
        r.dns_name(name, "metadata.name", subdomain=True)
        version = r.string(metadata.get("resourceVersion"), "metadata.resourceVersion")
        header = _Header("", name, ResourceVersion(version), metadata)
        if kind == "StorageClass":
            return _storage_class(r, document=document, header=header)
        return _persistent_volume(r, document=document, header=header)
    namespace = unnamed.term(metadata.get("namespace"), "metadata.namespace") or "default"
    r = Reader(origin, f"{label} {namespace}/{name}")
    r.dns_name(name, "metadata.name", subdomain=True)
    r.dns_name(namespace, "metadata.namespace", subdomain=False)
    version = r.string(metadata.get("resourceVersion"), "metadata.resourceVersion")
    header = _Header(namespace, name, ResourceVersion(version), metadata)
    if kind == "ConfigMap":
        return _config_map(r, document=document, header=header)
    if kind == "Secret":
        return _secret(r, document=document, header=header)
    if kind == "PersistentVolumeClaim":
        return _claim(r, document=document, header=header)
    return _pod(r, document=document, header=header)


_KINDS = frozenset(
    {"Pod", "ConfigMap", "Secret", "PersistentVolume", "PersistentVolumeClaim", "StorageClass"}
)
_API_VERSIONS = {"StorageClass": "storage.k8s.io/v1"}
"""The apiVersion of the kinds outside core/v1."""
_PV_TYPES = ("nfs", "local", "hostPath")


def _persistent_volume(
    r: Reader, *, document: Mapping[object, object], header: _Header
) -> model.PersistentVolume:
    spec = r.mapping(document.get("spec") or {}, "spec")
    types = [key for key in spec if key in _PV_TYPES and spec[key] is not None]
    if len(types) > 1:
        r.fail("spec", "may not specify more than 1 volume type")
    source: model.PersistentVolumeSource
    if types:
        source = persistent_source(
            r, type_name=str(types[0]), value=spec[types[0]], path=f"spec.{types[0]}"
        )
    else:
        others = [str(k) for k in spec if str(k) not in _PV_SPEC_FIELDS]
        source = model.UnsupportedVolumeSource(type_name=others[0] if others else "none")
    claim_ref, claim_uid = None, ""
    if spec.get("claimRef") is not None:
        ref = r.mapping(spec.get("claimRef"), "spec.claimRef")
        claim_ref = (
            r.string(ref.get("namespace"), "spec.claimRef.namespace") or "default",
            r.string(ref.get("name"), "spec.claimRef.name", required=True),
        )
        claim_uid = r.string(ref.get("uid"), "spec.claimRef.uid")
    options = [
        r.string(o, f"spec.mountOptions[{i}]")
        for i, o in enumerate(r.sequence(spec.get("mountOptions") or [], "spec.mountOptions"))
    ]
    capacity = r.quantity_map(spec.get("capacity"), "spec.capacity")
    return model.PersistentVolume(
        header.name,
        header.resource_version,
        source,
        mount_options=tuple(options),
        annotations=r.string_map(header.metadata.get("annotations"), "metadata.annotations"),
        claim_ref=claim_ref,
        storage_class_name=r.string(spec.get("storageClassName"), "spec.storageClassName"),
        claim_uid=claim_uid,
        reclaim_policy=_choice(
            r, spec.get("persistentVolumeReclaimPolicy"), "spec.persistentVolumeReclaimPolicy",
            ("Delete", "Recycle", "Retain"),
        ),
        capacity=capacity.get("storage", ""),
        node_names=_node_names(r, spec.get("nodeAffinity")),
    )  # fmt: skip


_HOSTNAME_LABEL = "kubernetes.io/hostname"


def _node_names(r: Reader, value: object) -> tuple[str, ...]:
    """The hostnames of `nodeAffinity.required` terms `kubernetes.io/hostname In [...]`; other
    terms are not read (fusevol does not schedule)."""
    required = r.mapping(
        r.mapping(value, "spec.nodeAffinity").get("required"), "spec.nodeAffinity.required"
    )
    terms = "spec.nodeAffinity.required.nodeSelectorTerms"
    names: list[str] = []
    for i, term in enumerate(r.sequence(required.get("nodeSelectorTerms"), terms)):
        at = f"{terms}[{i}].matchExpressions"
        expressions = r.sequence(r.mapping(term, f"{terms}[{i}]").get("matchExpressions"), at)
        for j, raw in enumerate(expressions):
            expression = r.mapping(raw, f"{at}[{j}]")
            if expression.get("key") == _HOSTNAME_LABEL and expression.get("operator") == "In":
                values = r.sequence(expression.get("values"), f"{at}[{j}].values")
                names += [r.string(v, f"{at}[{j}].values[{k}]") for k, v in enumerate(values)]
    return tuple(names)


def _choice(r: Reader, value: object, path: str, allowed: tuple[str, ...]) -> str:
    """An optional enum field: "" when absent, else one of `allowed` (the API's message)."""
    text = r.string(value, path)
    if text and text not in allowed:
        supported = ", ".join(quote(a) for a in allowed)
        r.fail(path, f"unsupported value {quote(text)}: supported values: {supported}")
    return text


_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_UID = re.compile(rf"{_UUID}|[0-9a-f]{{32}}")
"""A UID's forms: RFC 4122's text of a UUID, what the API server gives every object (and fusevol
a pod without one), or 32 hexadecimal digits, what kubelet gives a static pod without one. A
pod's uid names its directory (`<root>/pods/<uid>`), a claim's the one provisioned for it
(`pvc-<uid>`): nothing else is taken, not even another single path element."""


def _uid(r: Reader, value: object) -> str:
    """`metadata.uid`: "" if absent, else one of `_UID`'s forms."""
    uid = r.string(value, "metadata.uid")
    if uid and not _UID.fullmatch(uid):
        shown = quote(uid) if len(uid) <= 64 else f"({len(uid)} characters)"
        r.fail(
            "metadata.uid",
            f"invalid value {shown}: must be a UUID (8-4-4-4-12 hexadecimal digits, as the API "
            'server gives: "7d3c5a8e-0f4b-4c2e-9a61-3b5f2d8c9e10") or 32 hexadecimal digits '
            "(kubelet's static pods)",
        )
    return uid


def _storage_class(
    r: Reader, *, document: Mapping[object, object], header: _Header
) -> model.StorageClass:
    """`ValidateStorageClass`: a provisioner; reclaimPolicy Delete or Retain (default Delete);
    volumeBindingMode Immediate or WaitForFirstConsumer (default Immediate)."""
    provisioner = r.string(document.get("provisioner"), "provisioner", required=True)
    reclaim = r.string(document.get("reclaimPolicy"), "reclaimPolicy") or "Delete"
    _choice(r, reclaim, "reclaimPolicy", ("Delete", "Retain"))
    mode = r.string(document.get("volumeBindingMode"), "volumeBindingMode") or "Immediate"
    _choice(r, mode, "volumeBindingMode", ("Immediate", "WaitForFirstConsumer"))
    return model.StorageClass(
        header.name,
        header.resource_version,
        provisioner,
        parameters=r.string_map(document.get("parameters"), "parameters"),
        reclaim_policy=reclaim,
        volume_binding_mode=mode,
    )


_PV_SPEC_FIELDS = frozenset(
    {
        "capacity",
        "accessModes",
        "claimRef",
        "persistentVolumeReclaimPolicy",
        "storageClassName",
        "mountOptions",
        "volumeMode",
        "nodeAffinity",
        "volumeAttributesClassName",
    }
)


def _claim(
    r: Reader, *, document: Mapping[object, object], header: _Header
) -> model.PersistentVolumeClaim:
    spec = r.mapping(document.get("spec") or {}, "spec")
    resources = r.mapping(spec.get("resources"), "spec.resources")
    requests = r.quantity_map(resources.get("requests"), "spec.resources.requests")
    return model.PersistentVolumeClaim(
        *header.identity,
        volume_name=r.string(spec.get("volumeName"), "spec.volumeName"),
        storage_class_name=r.string(spec.get("storageClassName"), "spec.storageClassName"),
        uid=_uid(r, header.metadata.get("uid")),
        storage_request=requests.get("storage", ""),
        annotations=r.string_map(header.metadata.get("annotations"), "metadata.annotations"),
    )


def _config_map(
    r: Reader, *, document: Mapping[object, object], header: _Header
) -> model.ConfigMap:
    data = r.string_map(document.get("data"), "data")
    binary_data: dict[str, bytes] = {}
    for key in data:
        r.config_key(key, f"data[{quote(key)}]")
    for key, text in r.string_map(document.get("binaryData"), "binaryData").items():
        path = f"binaryData[{quote(key)}]"
        r.config_key(key, path)
        if key in data:
            r.fail(path, "duplicate of key present in data")
        binary_data[key] = r.decode_base64(text, path)
    size = sum(len(k) + len(v.encode()) for k, v in data.items())
    r.total_size(size + sum(len(k) + len(v) for k, v in binary_data.items()))
    return model.ConfigMap(
        *header.identity,
        data={key: value.encode() for key, value in data.items()},
        binary_data=binary_data or NO_ENTRIES,
        immutable=r.boolean(document.get("immutable"), "immutable"),
    )


def _secret(r: Reader, *, document: Mapping[object, object], header: _Header) -> model.Secret:
    data: dict[str, bytes] = {}
    for key, text in r.string_map(document.get("data"), "data").items():
        path = f"data[{quote(key)}]"
        r.config_key(key, path)
        data[key] = r.decode_base64(text, path)
    for key, text in r.string_map(document.get("stringData"), "stringData").items():
        r.config_key(key, f"stringData[{quote(key)}]")
        data[key] = text.encode()  # stringData wins over data, as in the API server
    r.total_size(sum(len(k) + len(v) for k, v in data.items()))
    return model.Secret(
        *header.identity,
        data=data,
        type=r.term(document.get("type"), "type") or "Opaque",
        immutable=r.boolean(document.get("immutable"), "immutable"),
    )


def _pod(r: Reader, *, document: Mapping[object, object], header: _Header) -> model.Pod:
    metadata = header.metadata
    spec = r.mapping(document.get("spec"), "spec")
    security = r.mapping(spec.get("securityContext"), "spec.securityContext")
    status = r.mapping(document.get("status"), "status")
    volumes = parse_volumes(r, spec.get("volumes"))
    names = frozenset(volume.name for volume in volumes)
    uid = _uid(r, metadata.get("uid")) or str(
        uuid.uuid5(uuid.NAMESPACE_URL, f"fusevol:{header.namespace}/{header.name}")
    )
    taken: set[str] = set()  # container names, init containers' included
    return model.Pod(
        uid=model.PodUID(uid),
        namespace=header.namespace,
        name=header.name,
        resource_version=header.resource_version,
        node_name=r.term(spec.get("nodeName"), "spec.nodeName"),
        labels=r.string_map(metadata.get("labels"), "metadata.labels", terms=True),
        annotations=r.string_map(metadata.get("annotations"), "metadata.annotations"),
        volumes=volumes,
        containers=_containers(
            r, spec.get("containers"), path="spec.containers", volumes=names, taken=taken
        ),
        init_containers=_containers(
            r, spec.get("initContainers"), path="spec.initContainers", volumes=names, taken=taken
        ),
        fs_group=r.user_id(security.get("fsGroup"), "spec.securityContext.fsGroup"),
        run_as_user=r.user_id(security.get("runAsUser"), "spec.securityContext.runAsUser"),
        service_account_name=r.term(spec.get("serviceAccountName"), "spec.serviceAccountName")
        or r.term(spec.get("serviceAccount"), "spec.serviceAccount")
        or "default",
        deleting=metadata.get("deletionTimestamp") is not None,
        finished=r.string(status.get("phase"), "status.phase") in model.TERMINAL_PHASES,
        origin=r.origin,
    )


def _containers(
    r: Reader, value: object, *, path: str, volumes: frozenset[str], taken: set[str]
) -> tuple[model.Container, ...]:
    """`taken`: the names of the pod's containers read so far, to which these are added.
    A name is a DNS label, unique in the pod: it names the directory of the container's subPath
    views (`volume-subpaths/<volume>/<container>/<index>`)."""
    containers: list[model.Container] = []
    for index, raw in enumerate(r.sequence(value, path)):
        at = f"{path}[{index}]"
        container = r.mapping(raw, at)
        mounts = r.sequence(container.get("volumeMounts"), f"{at}.volumeMounts")
        security = r.mapping(container.get("securityContext"), f"{at}.securityContext")
        resources = r.mapping(container.get("resources"), f"{at}.resources")
        limits = r.quantity_map(resources.get("limits"), f"{at}.resources.limits")
        requests = r.quantity_map(resources.get("requests"), f"{at}.resources.requests")
        name = r.term(container.get("name"), f"{at}.name", required=True)
        r.dns_name(name, f"{at}.name", subdomain=False)
        if name in taken:
            r.fail(f"{at}.name", f"Duplicate value: {quote(name)}")
        taken.add(name)
        containers.append(
            model.Container(
                name=name,
                volume_mounts=tuple(
                    _mount(r, mount, path=f"{at}.volumeMounts[{i}]", volumes=volumes)
                    for i, mount in enumerate(mounts)
                ),
                run_as_user=r.user_id(security.get("runAsUser"), f"{at}.securityContext.runAsUser"),
                resources=_resources(limits, requests),
                env=_env(r, container.get("env"), path=f"{at}.env"),
            )
        )
    return tuple(containers)


_NO_RESOURCES = model.ResourceRequirements(NO_ENTRIES, NO_ENTRIES)


def _resources(
    limits: Mapping[str, str], requests: Mapping[str, str]
) -> model.ResourceRequirements:
    """`SetDefaults_Pod`: a limit without a request is the request too. kubelet reads every pod
    so defaulted, a static pod's manifest included. Most containers of a node set none: one
    object for all of them."""
    if not limits and not requests:
        return _NO_RESOURCES
    return model.ResourceRequirements(limits, {**limits, **requests})


def _mount(r: Reader, value: object, *, path: str, volumes: frozenset[str]) -> model.VolumeMount:
    mount = r.mapping(value, path)
    volume = r.term(mount.get("name"), f"{path}.name", required=True)
    if volume not in volumes:
        r.fail(f"{path}.name", f"Not found: {quote(volume)}")
    return model.VolumeMount(
        name=VolumeName(volume),
        mount_path=r.term(mount.get("mountPath"), f"{path}.mountPath", required=True),
        read_only=r.boolean(mount.get("readOnly"), f"{path}.readOnly"),
        sub_path=r.term(mount.get("subPath"), f"{path}.subPath"),
        sub_path_expr=r.string(mount.get("subPathExpr"), f"{path}.subPathExpr"),
        mount_propagation=_propagation(r, mount.get("mountPropagation"), f"{path}"),
    )


_PROPAGATIONS = ("None", "HostToContainer", "Bidirectional")


def _propagation(r: Reader, value: object, path: str) -> str:
    propagation = r.string(value, f"{path}.mountPropagation")
    if propagation and propagation not in _PROPAGATIONS:
        r.fail(
            f"{path}.mountPropagation",
            f"Unsupported value: {quote(propagation)}: supported values: "
            + ", ".join(quote(p) for p in _PROPAGATIONS),
        )
    return propagation


def _env(r: Reader, value: object, *, path: str) -> tuple[model.EnvVar, ...]:
    """A container's `env`: literal values and downward-API fieldRefs (what a subPathExpr may
    use here); any other `valueFrom` is kept by name only."""
    env: list[model.EnvVar] = []
    for index, raw in enumerate(r.sequence(value, path)):
        at = f"{path}[{index}]"
        entry = r.mapping(raw, at)
        name = r.string(entry.get("name"), f"{at}.name", required=True)
        source = r.mapping(entry.get("valueFrom"), f"{at}.valueFrom")
        field_ref = None
        if "fieldRef" in source:
            ref = r.mapping(source.get("fieldRef"), f"{at}.valueFrom.fieldRef")
            field_ref = model.ObjectFieldSelector(
                field_path=r.string(
                    ref.get("fieldPath"), f"{at}.valueFrom.fieldRef.fieldPath", required=True
                ),
                api_version=r.string(ref.get("apiVersion"), f"{at}.valueFrom.fieldRef.apiVersion")
                or "v1",
            )
        other = next((str(key) for key in source if key != "fieldRef"), "")
        env.append(
            model.EnvVar(
                name=name,
                value=r.string(entry.get("value"), f"{at}.value"),
                field_ref=field_ref,
                other=other,
            )
        )
    return tuple(env)
