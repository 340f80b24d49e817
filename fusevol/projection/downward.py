"""The payload of a downwardAPI volume: kubelet's `downwardapi.CollectData`.

docs/kubelet.md facts 3, 6.

Owns:
- `extract_field_path`: `fieldpath.ExtractFieldPathAsString` for the fields a pod volume may name
  (name, namespace, uid raw; labels and annotations through `FormatMap`; one label or annotation by
  subscript, its key checked as kubelet checks it, an absent key giving an empty file);
- `extract_resource`: `ExtractResourceValueByContainerNameAndNodeAllocatable` (a container's limit
  or request divided by the divisor, rounded up; a missing or zero cpu, memory or
  ephemeral-storage limit replaced by the node's allocatable);
- `collect` and `make_payload`: `CollectData` over a volume's items, every item's error kept and
  reported together the way `utilerrors.NewAggregate` prints them (the first
  `AGGREGATED_AT_MOST` of them: a tenant decides how many there are); the items that read the
  same field share its bytes, so that many items of one pod's annotations (256 KiB) cost one copy;
- `NodeAllocatable` and `host_allocatable`: what stands in for the node's allocatable.

Kubelet computes `int64(math.Ceil(float64(a) / float64(b)))`; so does `_ceil_div`, float rounding
and amd64's out-of-range conversion included, so that even absurd values print the same digits.

Excludes: the API server's checks (which paths and resources a volume may name, allowed divisors:
`fusevol.decode.volume_sources`), Go's quoting (`goquote`), quantities (`quantity`), path rules
(`paths`), and merging several sources into one projected volume.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

from fusevol.base import quantity
from fusevol.base.errors import VolumeSetupError
from fusevol.model import FileProjection
from fusevol.projection.goquote import format_map, go_quote, to_go_bytes
from fusevol.projection.paths import clean_path, validate_field, validate_payload

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from fusevol.model import Container, DownwardAPIVolumeFile, Pod, ResourceFieldSelector


@dataclass(frozen=True, slots=True)
class NodeAllocatable:
    """The node's allocatable resources, used for a container that sets no (or a zero) limit.

    Kubelet takes them from the Node's `status.allocatable` (capacity minus reservations); fusevol
    has no Node object, so its caller decides: `host_allocatable()` reads the host's capacity.
    """

    cpu_millis: int
    """CPU in thousandths of a core (`limits.cpu` defaults to this)."""
    memory_bytes: int
    """Memory (`limits.memory` defaults to this)."""
    ephemeral_storage_bytes: int
    """Local ephemeral storage (`limits.ephemeral-storage` defaults to this)."""


def host_allocatable(
    *, meminfo: Path = Path("/proc/meminfo"), root_fs: str = "/"
) -> NodeAllocatable:
    """This host's capacity: every CPU, `MemTotal`, and the size of the filesystem at `root_fs`."""
    memory = None
    for line in meminfo.read_text().splitlines():
        name, _, rest = line.partition(":")
        if name == "MemTotal":
            number, _, unit = rest.strip().partition(" ")
            memory = int(number) * (1024 if unit == "kB" else 1)
    if memory is None:
        raise ValueError(f"{meminfo}: no MemTotal line")
    stat = os.statvfs(root_fs)
    return NodeAllocatable(
        cpu_millis=(os.cpu_count() or 1) * 1000,
        memory_bytes=memory,
        ephemeral_storage_bytes=stat.f_blocks * stat.f_frsize,
    )


def node_allocatable(configured: Mapping[str, str]) -> NodeAllocatable:
    """The host's capacity, with the resources given in `configured` (`{"cpu": "3500m",
    "memory": "6Gi", "ephemeral-storage": "100Gi"}`) taking their place. ValueError names a bad
    resource name or quantity."""
    unknown = set(configured) - {"cpu", "memory", "ephemeral-storage"}
    if unknown:
        raise ValueError(f"unknown allocatable resource(s): {', '.join(sorted(unknown))}")
    host = host_allocatable()
    parsed = {name: quantity.parse_quantity(text) for name, text in configured.items()}
    return NodeAllocatable(
        cpu_millis=quantity.milli_value(parsed["cpu"]) if "cpu" in parsed else host.cpu_millis,
        memory_bytes=quantity.value(parsed["memory"]) if "memory" in parsed else host.memory_bytes,
        ephemeral_storage_bytes=(
            quantity.value(parsed["ephemeral-storage"])
            if "ephemeral-storage" in parsed
            else host.ephemeral_storage_bytes
        ),
    )


# -- fieldRef --------------------------------------------------------------------------------------


def extract_field_path(pod: Pod, field_path: str) -> str:
    """The text kubelet writes for `fieldRef.fieldPath`; `VolumeSetupError` with its message."""
    subscripted = split_maybe_subscripted_path(field_path)
    if subscripted is not None:
        path, key = subscripted
        if path == "metadata.annotations":
            _check_key(field_path, _go_lower(key))
            return pod.annotations.get(key, "")
        if path == "metadata.labels":
            _check_key(field_path, key)
            return pod.labels.get(key, "")
        raise VolumeSetupError(f"fieldPath {go_quote(field_path)} does not support subscript")
    match field_path:
        case "metadata.annotations":
            return format_map(pod.annotations)
        case "metadata.labels":
            return format_map(pod.labels)
        case "metadata.name":
            return pod.name
        case "metadata.namespace":
            return pod.namespace
        case "metadata.uid":
            return pod.uid
    raise VolumeSetupError(f"unsupported fieldPath: {field_path}")


def split_maybe_subscripted_path(field_path: str) -> tuple[str, str] | None:
    """`SplitMaybeSubscriptedPath`: `a['k']` -> ("a", "k"); None when not subscripted.

    The path must end with `']` and split at its first `['` with something before it, so
    `x['a[b']c']` has key `a[b']c` and `x[ 'k' ]` is no subscript at all.
    """
    if not field_path.endswith("']"):
        return None
    path, bracket, key = field_path[:-2].partition("['")
    if not bracket or not path:
        return None
    return path, key


def _check_key(field_path: str, key: str) -> None:
    errors = qualified_name_errors(key)
    if errors:
        raise VolumeSetupError(f"invalid key subscript in {field_path}: {';'.join(errors)}")


def _go_lower(text: str) -> str:
    """Go's `strings.ToLower`, as far as a qualified name can tell: U+0130 lowers to a plain `i`."""
    return text.replace("\u0130", "i").lower()


_QUALIFIED_NAME_FORMAT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_QUALIFIED_NAME = re.compile(_QUALIFIED_NAME_FORMAT)
_QUALIFIED_NAME_MESSAGE = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    f"alphanumeric character (e.g. 'MyName' or 'my.name' or '123-abc', regex used for validation "
    f"is '{_QUALIFIED_NAME_FORMAT}')"
)
_DNS_LABEL_FORMAT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN_FORMAT = rf"{_DNS_LABEL_FORMAT}(\.{_DNS_LABEL_FORMAT})*"
_SUBDOMAIN = re.compile(_SUBDOMAIN_FORMAT)
_SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    f"for validation is '{_SUBDOMAIN_FORMAT}')"
)


def qualified_name_errors(value: str) -> list[str]:
    """apimachinery's `IsQualifiedName`: its messages, empty when `value` is valid."""
    parts = value.split("/")
    if len(parts) > 2:
        return [
            f"a qualified name {_QUALIFIED_NAME_MESSAGE} with an optional DNS subdomain prefix "
            "and '/' (e.g. 'example.com/MyName')"
        ]
    errors: list[str] = []
    name = parts[-1]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            if len(to_go_bytes(prefix)) > 253:
                errors.append("prefix part must be no more than 253 characters")
            if not _SUBDOMAIN.fullmatch(prefix):
                errors.append(f"prefix part {_SUBDOMAIN_MESSAGE}")
    if not name:
        errors.append("name part must be non-empty")
    elif len(to_go_bytes(name)) > 63:
        errors.append("name part must be no more than 63 characters")
    if not _QUALIFIED_NAME.fullmatch(name):
        errors.append(f"name part {_QUALIFIED_NAME_MESSAGE}")
    return errors


# -- resourceFieldRef ------------------------------------------------------------------------------

_DEFAULTED = ("cpu", "memory", "ephemeral-storage")
"""The limits `MergeContainerResourceLimits` fills from node allocatable (never hugepages)."""


def extract_resource(
    pod: Pod, selector: ResourceFieldSelector, *, allocatable: NodeAllocatable
) -> str:
    """The text kubelet writes for `resourceFieldRef`; `VolumeSetupError` with its message."""
    container = _find_container(pod, selector.container_name)
    kind, _, name = selector.resource.partition(".")
    if kind not in ("limits", "requests") or not (
        name in _DEFAULTED or name.startswith("hugepages-")
    ):
        raise VolumeSetupError(f"unsupported container resource : {selector.resource}")
    divisor = _quantity(selector.divisor, where="divisor") if selector.divisor else Fraction(0)
    if divisor == 0:  # unset (or zero) means 1
        divisor = Fraction(1)
    amount = _amount(container, kind=kind, name=name)
    if kind == "limits" and name in _DEFAULTED and amount == 0:
        amount = _allocatable(allocatable, name)
    if name == "cpu":
        result = _ceil_div(quantity.milli_value(amount), quantity.milli_value(divisor))
    else:
        result = _ceil_div(quantity.value(amount), quantity.value(divisor))
    return str(result)


def _find_container(pod: Pod, name: str) -> Container:
    for container in (*pod.containers, *pod.init_containers):
        if container.name == name:
            return container
    raise VolumeSetupError(f"container {name} not found")


def _amount(container: Container, *, kind: str, name: str) -> Fraction:
    resources = container.resources.limits if kind == "limits" else container.resources.requests
    text = resources.get(name)
    if text is None:
        return Fraction(0)
    return _quantity(text, where=f"container {container.name} resources.{kind}[{name}]")


def _quantity(text: str, *, where: str) -> Fraction:
    try:
        return quantity.parse_quantity(text)
    except ValueError as exc:
        raise VolumeSetupError(f"{where}: {exc}") from None


def _allocatable(allocatable: NodeAllocatable, name: str) -> Fraction:
    if name == "cpu":
        return Fraction(allocatable.cpu_millis, 1000)
    if name == "memory":
        return Fraction(allocatable.memory_bytes)
    return Fraction(allocatable.ephemeral_storage_bytes)


def _ceil_div(numerator: int, denominator: int) -> int:
    """`int64(math.Ceil(float64(numerator) / float64(denominator)))` on amd64.

    Both int64 -> float64 conversions round to nearest even, as Python's do. A result outside
    int64 (or a NaN) converts to -2^63 on amd64 (CVTTSD2SQ's "integer indefinite"; arm64 would
    saturate instead); only a limit near 2^63 gets there. A zero denominator cannot occur, since
    `value` and `milli_value` of a positive divisor are >= 1.
    """
    if denominator == 0:
        return -(2**63)
    result = float(numerator) / float(denominator)
    if math.isnan(result) or math.isinf(result):
        return -(2**63)
    rounded = math.ceil(result)
    return rounded if -(2**63) <= rounded < 2**63 else -(2**63)


# -- the volume ------------------------------------------------------------------------------------


def collect(
    items: Sequence[DownwardAPIVolumeFile],
    pod: Pod,
    *,
    default_mode: int,
    allocatable: NodeAllocatable,
    fs_user: int | None = None,
) -> tuple[dict[str, FileProjection], list[str]]:
    """`CollectData`: (payload by cleaned path, not yet validated; every item's error message).

    An item that fails still gets its (empty) file, as in kubelet; the errors decide. An item with
    neither reference is an empty file. Later items win over earlier ones at the same path.
    """
    payload: dict[str, FileProjection] = {}
    errors: list[str] = []
    fields: dict[str, bytes] = {}
    for item in items:
        data = b""
        try:
            if item.field_ref is not None:
                data = _field_bytes(pod, item.field_ref.field_path, fields)
            elif item.resource_field_ref is not None:
                text = extract_resource(pod, item.resource_field_ref, allocatable=allocatable)
                data = text.encode()
        except VolumeSetupError as exc:
            errors.append(str(exc))
        mode = default_mode if item.mode is None else item.mode
        payload[clean_path(item.path)] = FileProjection(data=data, mode=mode, fs_user=fs_user)
    return payload, errors


def _field_bytes(pod: Pod, field_path: str, known: dict[str, bytes]) -> bytes:
    """What `field_path` reads, once per volume: the bytes of `known` if an item read it before."""
    data = known.get(field_path)
    if data is None:
        data = known[field_path] = to_go_bytes(extract_field_path(pod, field_path))
    return data


def check_paths(items: Sequence[DownwardAPIVolumeFile], field: str = "items") -> None:
    """`InvalidPayload` naming the item (`items[3].path: ...`) whose path AtomicWriter refuses
    (cleaned first, as `CollectData` cleans it)."""
    for index, item in enumerate(items):
        validate_field(clean_path(item.path), f"{field}[{index}].path")


def make_payload(
    items: Sequence[DownwardAPIVolumeFile],
    pod: Pod,
    *,
    default_mode: int,
    allocatable: NodeAllocatable,
    fs_user: int | None = None,
) -> dict[str, FileProjection]:
    """The validated payload of a downwardAPI volume (or of a projected downwardAPI source).

    Raises `VolumeSetupError` with every item's error (`aggregate_message`), and `InvalidPayload`
    for a path AtomicWriter would reject. `fs_user` is None for kubelet's downwardAPI files.
    """
    payload, errors = collect(
        items, pod, default_mode=default_mode, allocatable=allocatable, fs_user=fs_user
    )
    if errors:
        raise VolumeSetupError(aggregate_message(errors))
    check_paths(items)
    return validate_payload(payload)


AGGREGATED_AT_MOST = 10
"""Distinct errors `aggregate_message` prints; it counts the others. kubelet prints them all, but
a tenant decides how many there are (one per item), and the message is a log line, an event and
a status field."""


def aggregate_message(messages: Sequence[str]) -> str:
    """`utilerrors.NewAggregate(errs).Error()`: one message as is, several as `[a, b]`.

    Repeated messages are printed once; if only one distinct message remains it has no brackets.
    Beyond `AGGREGATED_AT_MOST` distinct ones, the last is `and N more`.
    """
    distinct = list(dict.fromkeys(messages))
    if len(distinct) <= 1:
        return "".join(distinct)
    if len(distinct) > AGGREGATED_AT_MOST:
        more = len(distinct) - AGGREGATED_AT_MOST
        distinct = [*distinct[:AGGREGATED_AT_MOST], f"and {more} more"]
    return "[" + ", ".join(distinct) + "]"
