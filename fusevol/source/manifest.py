"""Manifest text -> fusevol model objects, validated the way the API server would validate them.

Owns: decoding one manifest file (`*.json`: one JSON value; anything else: multi-document YAML),
picking out the core/v1 kinds fusevol acts on (Pod, ConfigMap, Secret; also inside `kind: List`),
the API defaulting fusevol relies on (namespace `default`, `defaultMode` 0644, `stringData` merged
over `data`, a volume without a type is an `emptyDir`, a stable uid for pods that carry none) and
the subset of `pkg/apis/core/validation` that shapes what fusevol serves (KUBELET.md A4).

Shaped as one pure function over bytes so that tests and the watcher (`fusevol.source.local`) feed
it alike. One bad object rejects the whole file with a `ManifestError` naming the file, the object
and the field: the watcher then keeps the file's previous objects, so a half-finished edit never
tears anything down. Error messages carry keys and paths, never values (Secret data stays out of
logs, and so do YAML snippets).

Excludes: file I/O and watching (`fusevol.source.local`), resourceVersion assignment (the watcher
numbers what it delivers), validation of fields fusevol does not read (label syntax, images,
resources, Secret type-specific keys, required containers), and the payload path rules applied
when a volume is rendered (`fusevol.projection.paths`).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, cast

import yaml

from fusevol import model
from fusevol.errors import ManifestError
from fusevol.model import KeyToPath, KubeObject, ObjectKey, ResourceVersion, VolumeName

if TYPE_CHECKING:
    from collections.abc import Hashable, Iterator, Mapping

try:
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]

log = logging.getLogger(__name__)

MAX_DATA_BYTES = 1024 * 1024
"""`MaxConfigMapSize` and `MaxSecretSize`: the sum of the lengths of every key and value."""

_MAX_ID = 2**31 - 1
_MAX_DEPTH = 500  # Kubernetes objects need a few dozen levels
_CONFIG_KEY = re.compile(r"[-._a-zA-Z0-9]+")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL.pattern}(\.{_DNS_LABEL.pattern})*")
_KEY_MESSAGE = "a valid config key must consist of alphanumeric characters, '-', '_' or '.'"
_TYPE_NAMES = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}
_MERGE_TAG = "tag:yaml.org,2002:merge"
_T = TypeVar("_T")


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


# -- decoding --------------------------------------------------------------------------------------


class _StrictLoader(_SafeLoader):
    """The safe loader, refusing duplicate mapping keys as kubectl does ("already set in map")."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
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
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: a timestamp such as 2024-13-01
        raise ManifestError(f"{origin}: invalid YAML: {exc}") from None


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
            raise ManifestError(f"{origin}: {where}: must be a mapping, not {_type(document)}")
        if document.get("kind") != "List":
            yield where, document
            continue
        for item_index, item in enumerate(_Reader(origin, where).sequence(document.get("items"))):
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
    kind = document.get("kind")
    api_version = document.get("apiVersion", "v1")
    if kind not in ("Pod", "ConfigMap", "Secret") or api_version != "v1":
        log.debug("%s: %s: skipped kind=%r apiVersion=%r", origin, where, kind, api_version)
        return None
    label = str(kind).lower()
    unnamed = _Reader(origin, f"{where} ({label})")
    metadata = unnamed.mapping(document.get("metadata"), "metadata")
    name = unnamed.string(metadata.get("name"), "metadata.name", required=True)
    namespace = unnamed.string(metadata.get("namespace"), "metadata.namespace") or "default"
    r = _Reader(origin, f"{label} {namespace}/{name}")
    r.dns_name(name, "metadata.name", subdomain=True)
    r.dns_name(namespace, "metadata.namespace", subdomain=False)
    version = r.string(metadata.get("resourceVersion"), "metadata.resourceVersion")
    header = _Header(namespace, name, ResourceVersion(version), metadata)
    if kind == "ConfigMap":
        return _config_map(r, document=document, header=header)
    if kind == "Secret":
        return _secret(r, document=document, header=header)
    return _pod(r, document=document, header=header)


def _config_map(
    r: _Reader, *, document: Mapping[object, object], header: _Header
) -> model.ConfigMap:
    data = r.string_map(document.get("data"), "data")
    binary_data: dict[str, bytes] = {}
    for key in data:
        r.config_key(key, f"data[{_quote(key)}]")
    for key, text in r.string_map(document.get("binaryData"), "binaryData").items():
        path = f"binaryData[{_quote(key)}]"
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


def _secret(r: _Reader, *, document: Mapping[object, object], header: _Header) -> model.Secret:
    data: dict[str, bytes] = {}
    for key, text in r.string_map(document.get("data"), "data").items():
        path = f"data[{_quote(key)}]"
        r.config_key(key, path)
        data[key] = r.decode_base64(text, path)
    for key, text in r.string_map(document.get("stringData"), "stringData").items():
        r.config_key(key, f"stringData[{_quote(key)}]")
        data[key] = text.encode()  # stringData wins over data, as in the API server
    r.total_size(sum(len(k) + len(v) for k, v in data.items()))
    return model.Secret(
        *header.identity,
        data=data,
        type=r.string(document.get("type"), "type") or "Opaque",
        immutable=r.boolean(document.get("immutable"), "immutable"),
    )


def _pod(r: _Reader, *, document: Mapping[object, object], header: _Header) -> model.Pod:
    metadata = header.metadata
    spec = r.mapping(document.get("spec"), "spec")
    security = r.mapping(spec.get("securityContext"), "spec.securityContext")
    volumes = _volumes(r, spec.get("volumes"))
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
    )


def _volumes(r: _Reader, value: object) -> tuple[model.Volume, ...]:
    volumes: list[model.Volume] = []
    for index, raw in enumerate(r.sequence(value, "spec.volumes")):
        path = f"spec.volumes[{index}]"
        entry = r.mapping(raw, path)
        name = r.string(entry.get("name"), f"{path}.name", required=True)
        r.dns_name(name, f"{path}.name", subdomain=False)
        if any(volume.name == name for volume in volumes):
            r.fail(f"{path}.name", f"Duplicate value: {_quote(name)}")
        # A key set to null is no volume type; no type at all is defaulted to emptyDir.
        types = [key for key, item in entry.items() if key != "name" and item is not None]
        if len(types) > 1:
            r.fail(path, "may not specify more than 1 volume type")
        type_name = types[0] if types else "emptyDir"
        if not isinstance(type_name, str):
            r.fail(path, f"volume type {type_name!r} must be a string")
        source = _volume_source(
            r, type_name=type_name, value=entry.get(type_name), path=f"{path}.{type_name}"
        )
        volumes.append(model.Volume(VolumeName(name), source))
    return tuple(volumes)


def _volume_source(r: _Reader, *, type_name: str, value: object, path: str) -> model.VolumeSource:
    if type_name not in ("configMap", "secret"):
        return model.UnsupportedVolumeSource(type_name=type_name)
    source = r.mapping(value, path)
    name_field = "name" if type_name == "configMap" else "secretName"
    name = r.string(source.get(name_field), f"{path}.{name_field}", required=True)
    items = r.items(source.get("items"), f"{path}.items")
    mode = r.mode(source.get("defaultMode"), f"{path}.defaultMode")
    default_mode = model.DEFAULT_MODE if mode is None else mode
    optional = r.boolean(source.get("optional"), f"{path}.optional")
    if type_name == "configMap":
        return model.ConfigMapVolumeSource(name, items, default_mode, optional)
    return model.SecretVolumeSource(name, items, default_mode, optional)


def _containers(
    r: _Reader, value: object, *, path: str, volumes: frozenset[str]
) -> tuple[model.Container, ...]:
    containers: list[model.Container] = []
    for index, raw in enumerate(r.sequence(value, path)):
        at = f"{path}[{index}]"
        container = r.mapping(raw, at)
        mounts = r.sequence(container.get("volumeMounts"), f"{at}.volumeMounts")
        security = r.mapping(container.get("securityContext"), f"{at}.securityContext")
        containers.append(
            model.Container(
                name=r.string(container.get("name"), f"{at}.name", required=True),
                volume_mounts=tuple(
                    _mount(r, mount, path=f"{at}.volumeMounts[{i}]", volumes=volumes)
                    for i, mount in enumerate(mounts)
                ),
                run_as_user=r.user_id(security.get("runAsUser"), f"{at}.securityContext.runAsUser"),
            )
        )
    return tuple(containers)


def _mount(r: _Reader, value: object, *, path: str, volumes: frozenset[str]) -> model.VolumeMount:
    mount = r.mapping(value, path)
    volume = r.string(mount.get("name"), f"{path}.name", required=True)
    if volume not in volumes:
        r.fail(f"{path}.name", f"Not found: {_quote(volume)}")
    return model.VolumeMount(
        name=VolumeName(volume),
        mount_path=r.string(mount.get("mountPath"), f"{path}.mountPath", required=True),
        read_only=r.boolean(mount.get("readOnly"), f"{path}.readOnly"),
        sub_path=r.string(mount.get("subPath"), f"{path}.subPath"),
    )


# -- field readers ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Reader:
    """Reads typed fields of one object; every failure names the file, the object and the field."""

    origin: str
    subject: str

    def fail(self, path: str, message: str) -> NoReturn:
        raise ManifestError(f"{self.origin}: {self.subject}: {path}: {message}")

    def expect(self, value: object, path: str, default: _T) -> _T:
        """`value` if it has the type of `default`; `default` if it is null, as Go decodes null."""
        if value is None:
            return default
        if not isinstance(value, type(default)):
            self.fail(path, f"must be {_TYPE_NAMES[type(default)]}, not {_type(value)}")
        return value

    def mapping(self, value: object, path: str) -> Mapping[object, object]:
        return self.expect(value, path, cast("dict[object, object]", {}))

    def sequence(self, value: object, path: str = "items") -> list[object]:
        return self.expect(value, path, cast("list[object]", []))

    def string(self, value: object, path: str, *, required: bool = False) -> str:
        value = self.expect(value, path, "")
        if required and not value:
            self.fail(path, "Required value")
        if not value.isascii() and value.encode(errors="replace").decode() != value:
            self.fail(path, "must be valid Unicode (a lone surrogate escape)")  # JSON's "\\ud800"
        return value

    def boolean(self, value: object, path: str) -> bool:
        return self.expect(value, path, False)

    def integer(self, value: object, path: str, *, maximum: int, message: str) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"must be an integer, not {_type(value)}")
        if not 0 <= value <= maximum:
            self.fail(path, message)
        return value

    def mode(self, value: object, path: str) -> int | None:
        message = "must be a number between 0 and 0777 (octal), both inclusive"
        return self.integer(value, path, maximum=0o777, message=message)

    def user_id(self, value: object, path: str) -> int | None:
        message = f"must be between 0 and {_MAX_ID}, inclusive"
        return self.integer(value, path, maximum=_MAX_ID, message=message)

    def string_map(self, value: object, path: str) -> dict[str, str]:
        result: dict[str, str] = {}
        for key, item in self.mapping(value, path).items():
            if not isinstance(key, str):
                self.fail(path, f"key {key!r} must be a string")
            result[key] = self.string(item, f"{path}[{_quote(key)}]")
        return result

    def decode_base64(self, text: str, path: str) -> bytes:
        # Go's StdEncoding skips CR and LF (folded YAML) but is otherwise strict and padded.
        try:
            return base64.b64decode(text.replace("\n", "").replace("\r", ""), validate=True)
        except (binascii.Error, ValueError) as exc:
            self.fail(path, f"illegal base64 data: {exc}")

    def config_key(self, key: str, path: str) -> None:
        """`IsConfigMapKey`; keys pass the regex first, so their length in bytes is `len()`."""
        if not _CONFIG_KEY.fullmatch(key):
            self.fail(path, _KEY_MESSAGE)
        if len(key) > 253:
            self.fail(path, "must be no more than 253 bytes")
        if key in (".", ".."):
            self.fail(path, f"must not be '{key}'")
        if key.startswith(".."):
            self.fail(path, "must not start with '..'")

    def total_size(self, size: int) -> None:
        if size > MAX_DATA_BYTES:
            self.fail("data", f"Too long: must have at most {MAX_DATA_BYTES} bytes (has {size})")

    def dns_name(self, name: str, path: str, *, subdomain: bool) -> None:
        pattern, limit = (_DNS_SUBDOMAIN, 253) if subdomain else (_DNS_LABEL, 63)
        if len(name) > limit:
            self.fail(path, f"must be no more than {limit} characters")
        if not pattern.fullmatch(name):
            kind = "subdomain" if subdomain else "label"
            self.fail(path, f"must be a lowercase RFC 1123 {kind} (regex {pattern.pattern!r})")

    def items(self, value: object, path: str) -> tuple[KeyToPath, ...]:
        items: list[KeyToPath] = []
        for index, raw in enumerate(self.sequence(value, path)):
            item_path = f"{path}[{index}]"
            item = self.mapping(raw, item_path)
            key = self.string(item.get("key"), f"{item_path}.key", required=True)
            target = self.string(item.get("path"), f"{item_path}.path", required=True)
            self.local_path(target, f"{item_path}.path")
            items.append(KeyToPath(key, target, self.mode(item.get("mode"), f"{item_path}.mode")))
        return tuple(items)

    def local_path(self, target: str, path: str) -> None:
        """`ValidateLocalNonReservedPath`: relative, no `..` element, not starting with `..`."""
        if target.startswith("/"):
            self.fail(path, f"invalid value {_quote(target)}: must be a relative path")
        if ".." in target.split("/"):
            self.fail(path, f"invalid value {_quote(target)}: must not contain '..'")
        if target.startswith(".."):
            self.fail(path, f"invalid value {_quote(target)}: must not start with '..'")


def _quote(key: str) -> str:
    return json.dumps(key)


def _type(value: object) -> str:
    return "null" if value is None else type(value).__name__
