"""Manifest text -> fusevol model objects, validated the way the API server would validate them.

Owns: decoding one manifest file (`*.json`: one JSON value; anything else: multi-document YAML),
picking out the kinds fusevol acts on (Pod, ConfigMap, Secret, PersistentVolume,
PersistentVolumeClaim, and StorageClass of `storage.k8s.io/v1`; also inside `kind: List`),
the API defaulting fusevol relies on (namespace `default`, `stringData` merged over `data`, a
stable uid for pods that carry none) and the subset of `pkg/apis/core/validation` that shapes what
fusevol serves (docs/kubelet.md fact 4). Pod volumes are read by `fusevol.source.volumes`, typed
fields by `fusevol.source._reader`; container `resources` are kept as quantity strings after a light
check (`_reader.Reader.quantity_map`), and parsed where a downwardAPI file reads them.

Shaped as one pure function over bytes so that tests and the watcher (`fusevol.source.local`) feed
it alike. One bad object rejects the whole file with a `ManifestError` naming the file, the object
and the field: the watcher then keeps the file's previous objects, so a half-finished edit never
tears anything down. Error messages carry keys and paths, never values (Secret data stays out of
logs, and so do YAML snippets).

Excludes: file I/O and watching (`fusevol.source.local`), resourceVersion assignment (the watcher
numbers what it delivers), validation of fields fusevol does not read (label syntax, images,
resource names and requests against limits, Secret type-specific keys, required containers), and
the payload path rules applied when a volume is rendered (`fusevol.projection.paths`).
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml

from fusevol import model
from fusevol.errors import ManifestError
from fusevol.model import KubeObject, ObjectKey, ResourceVersion, VolumeName
from fusevol.source._reader import Reader, describe_type, quote
from fusevol.source.volumes import parse_volumes, persistent_source

if TYPE_CHECKING:
    from collections.abc import Hashable, Iterator, Mapping

try:
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]

log = logging.getLogger(__name__)

_MAX_DEPTH = 500  # Kubernetes objects need a few dozen levels
_MERGE_TAG = "tag:yaml.org,2002:merge"


def parse_manifest(text: bytes, *, origin: str) -> list[KubeObject]:
    """The Pods, ConfigMaps and Secrets in one manifest file, in file order.

    `origin` is the file's path: it selects the format (`.json` or YAML) and starts every error
    message. Other kinds and empty documents are skipped (logged at DEBUG). Raises `ManifestError`
    if any document or object is invalid, or if the file defines the same object twice.
    """
    objects: list[KubeObject] = []
    seen: dict[ObjectKey, str] = {}
    for where, document in _documents(_load(text, origin=origin), origin=origin):
        obj = _convert(document, origin=origin, where=where)
        if obj is None:
            continue
        if obj.key in seen:
            raise ManifestError(f"{origin}: {obj.key}: defined twice ({seen[obj.key]}, {where})")
        seen[obj.key] = where
        objects.append(obj)
    return objects


def convert_object(document: Mapping[Any, object], *, origin: str) -> KubeObject | None:
    """One decoded object (a manifest document, or an API server's JSON) -> a model object, with
    the same defaulting and validation; None for kinds fusevol does not act on. Raises
    `ManifestError` naming `origin`, the object and the field."""
    return _convert(document, origin=origin, where="object")


# -- decoding --------------------------------------------------------------------------------------


class _StrictLoader(_SafeLoader):
    """The safe loader, refusing duplicate mapping keys as kubectl does ("already set in map")."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        if not isinstance(node, yaml.MappingNode):  # `!!set |`, `!!omap x`: the base class says so
            return super().construct_mapping(node, deep=deep)
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # unhashable: the base class reports it
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """PyYAML's constructors fail on a bad tagged scalar (`!!int ''`, `!!bool x`,
        `!!timestamp 2024-13-01`) with whatever Python raises, its message quoting the value: that
        becomes a ConstructorError at the node, naming the tag only (the value may be a secret)."""
        try:
            return super().construct_object(node, deep=deep)
        except _CONSTRUCTOR_FAILURES:
            raise yaml.constructor.ConstructorError(
                None, None, f"not a valid {node.tag} value", node.start_mark
            ) from None


_CONSTRUCTOR_FAILURES = (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError)


def _load(text: bytes, *, origin: str) -> list[object]:
    try:
        source = text.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{origin}: not valid UTF-8 (byte {exc.start})") from None
    if origin.endswith(".json"):
        try:
            return [json.loads(source)]
        except RecursionError:
            raise ManifestError(f"{origin}: invalid JSON: nested too deeply") from None
        except json.JSONDecodeError as exc:
            where = f"line {exc.lineno} column {exc.colno}"
            raise ManifestError(f"{origin}: {where}: invalid JSON: {exc.msg}") from None
        except ValueError:  # int()'s limit: a number of over 4300 digits
            raise ManifestError(f"{origin}: invalid JSON: a number has too many digits") from None
    try:
        _check_depth(source, origin=origin)
        return list(yaml.load_all(source, Loader=_StrictLoader))
    except yaml.MarkedYAMLError as exc:
        # Built from the parts, not str(exc): the pure-Python loader's snippet would quote the line.
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
        raise ManifestError(
            f"{origin}: {where}invalid YAML: {exc.problem or exc.context}"
        ) from None
    except RecursionError:
        raise ManifestError(f"{origin}: invalid YAML: nested too deeply") from None
    except yaml.YAMLError as exc:  # unmarked: the reader's "unacceptable character #x0000"
        raise ManifestError(f"{origin}: invalid YAML: {exc}") from None
    except _CONSTRUCTOR_FAILURES:  # in the second half of a collection's constructor: no node
        raise ManifestError(
            f"{origin}: invalid YAML: a tagged value cannot be constructed"
        ) from None


def _check_depth(source: str, *, origin: str) -> None:
    """Refuse YAML nested deeper than `_MAX_DEPTH`, from libyaml's events (its parser uses a heap
    stack). Its C composer recurses without limit: a deep file would crash the whole process."""
    depth = 0
    for event in yaml.parse(source, Loader=_StrictLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > _MAX_DEPTH:
                line = f"line {event.start_mark.line + 1}: " if event.start_mark else ""
                raise ManifestError(f"{origin}: {line}invalid YAML: nested too deeply")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _documents(
    loaded: list[object], *, origin: str
) -> Iterator[tuple[str, Mapping[object, object]]]:
    """(where, mapping) for every non-empty document, with the items of `kind: List` unrolled."""
    for index, document in enumerate(loaded, start=1):
        where = f"document {index}"
        if document is None:
            continue
        if not isinstance(document, dict):
            raise ManifestError(
                f"{origin}: {where}: must be a mapping, not {describe_type(document)}"
            )
        if document.get("kind") != "List":
            yield where, document
            continue
        for item_index, item in enumerate(Reader(origin, where).sequence(document.get("items"))):
            if not isinstance(item, dict):
                raise ManifestError(f"{origin}: {where}: items[{item_index}]: must be a mapping")
            yield f"{where} items[{item_index}]", item


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


def _convert(document: Mapping[object, object], *, origin: str, where: str) -> KubeObject | None:
    document_reader = Reader(origin, where)
    kind = document_reader.string(document.get("kind"), "kind")  # as the API decodes: a string
    api_version = document_reader.string(document.get("apiVersion", "v1"), "apiVersion")
    if kind not in _KINDS or api_version != _API_VERSIONS.get(kind, "v1"):
        log.debug("%s: %s: skipped kind=%r apiVersion=%r", origin, where, kind, api_version)
        return None
    label = str(kind).lower()
    unnamed = Reader(origin, f"{where} ({label})")
    metadata = unnamed.mapping(document.get("metadata"), "metadata")
    name = unnamed.string(metadata.get("name"), "metadata.name", required=True)
    if kind in ("PersistentVolume", "StorageClass"):  # cluster-scoped
        r = Reader(origin, f"{label} {name}")
        r.dns_name(name, "metadata.name", subdomain=True)
        version = r.string(metadata.get("resourceVersion"), "metadata.resourceVersion")
        header = _Header("", name, ResourceVersion(version), metadata)
        if kind == "StorageClass":
            return _storage_class(r, document=document, header=header)
        return _persistent_volume(r, document=document, header=header)
    namespace = unnamed.string(metadata.get("namespace"), "metadata.namespace") or "default"
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
        uid=r.string(header.metadata.get("uid"), "metadata.uid"),
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
        binary_data=binary_data,
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
        type=r.string(document.get("type"), "type") or "Opaque",
        immutable=r.boolean(document.get("immutable"), "immutable"),
    )


def _pod(r: Reader, *, document: Mapping[object, object], header: _Header) -> model.Pod:
    metadata = header.metadata
    spec = r.mapping(document.get("spec"), "spec")
    security = r.mapping(spec.get("securityContext"), "spec.securityContext")
    volumes = parse_volumes(r, spec.get("volumes"))
    names = frozenset(volume.name for volume in volumes)
    uid = r.string(metadata.get("uid"), "metadata.uid") or str(
        uuid.uuid5(uuid.NAMESPACE_URL, f"fusevol:{header.namespace}/{header.name}")
    )
    return model.Pod(
        uid=model.PodUID(uid),
        namespace=header.namespace,
        name=header.name,
        resource_version=header.resource_version,
        node_name=r.string(spec.get("nodeName"), "spec.nodeName"),
        labels=r.string_map(metadata.get("labels"), "metadata.labels"),
        annotations=r.string_map(metadata.get("annotations"), "metadata.annotations"),
        volumes=volumes,
        containers=_containers(r, spec.get("containers"), path="spec.containers", volumes=names),
        init_containers=_containers(
            r, spec.get("initContainers"), path="spec.initContainers", volumes=names
        ),
        fs_group=r.user_id(security.get("fsGroup"), "spec.securityContext.fsGroup"),
        run_as_user=r.user_id(security.get("runAsUser"), "spec.securityContext.runAsUser"),
        service_account_name=r.string(spec.get("serviceAccountName"), "spec.serviceAccountName")
        or r.string(spec.get("serviceAccount"), "spec.serviceAccount")
        or "default",
        origin=r.origin,
    )


def _containers(
    r: Reader, value: object, *, path: str, volumes: frozenset[str]
) -> tuple[model.Container, ...]:
    containers: list[model.Container] = []
    for index, raw in enumerate(r.sequence(value, path)):
        at = f"{path}[{index}]"
        container = r.mapping(raw, at)
        mounts = r.sequence(container.get("volumeMounts"), f"{at}.volumeMounts")
        security = r.mapping(container.get("securityContext"), f"{at}.securityContext")
        resources = r.mapping(container.get("resources"), f"{at}.resources")
        containers.append(
            model.Container(
                name=r.string(container.get("name"), f"{at}.name", required=True),
                volume_mounts=tuple(
                    _mount(r, mount, path=f"{at}.volumeMounts[{i}]", volumes=volumes)
                    for i, mount in enumerate(mounts)
                ),
                run_as_user=r.user_id(security.get("runAsUser"), f"{at}.securityContext.runAsUser"),
                resources=model.ResourceRequirements(
                    limits=r.quantity_map(resources.get("limits"), f"{at}.resources.limits"),
                    requests=r.quantity_map(resources.get("requests"), f"{at}.resources.requests"),
                ),
            )
        )
    return tuple(containers)


def _mount(r: Reader, value: object, *, path: str, volumes: frozenset[str]) -> model.VolumeMount:
    mount = r.mapping(value, path)
    volume = r.string(mount.get("name"), f"{path}.name", required=True)
    if volume not in volumes:
        r.fail(f"{path}.name", f"Not found: {quote(volume)}")
    return model.VolumeMount(
        name=VolumeName(volume),
        mount_path=r.string(mount.get("mountPath"), f"{path}.mountPath", required=True),
        read_only=r.boolean(mount.get("readOnly"), f"{path}.readOnly"),
        sub_path=r.string(mount.get("subPath"), f"{path}.subPath"),
    )
