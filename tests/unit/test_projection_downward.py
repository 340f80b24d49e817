"""downwardAPI payloads: kubelet's `CollectData`, `ExtractFieldPathAsString` and resource values."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from fusevol.base.errors import InvalidPayload, VolumeSetupError
from fusevol.model import (
    Container,
    DownwardAPIVolumeFile,
    FileProjection,
    ObjectFieldSelector,
    Pod,
    PodUID,
    ResourceFieldSelector,
    ResourceRequirements,
    ResourceVersion,
)
from fusevol.projection.downward import (
    NodeAllocatable,
    aggregate_message,
    extract_field_path,
    extract_resource,
    host_allocatable,
    make_payload,
    qualified_name_errors,
    split_maybe_subscripted_path,
)

if TYPE_CHECKING:
    from pathlib import Path

GI = 2**30
ALLOCATABLE = NodeAllocatable(
    cpu_millis=4000, memory_bytes=8 * GI, ephemeral_storage_bytes=100 * GI
)

POD = Pod(
    uid=PodUID("0b7a6c1e-0000-4000-8000-000000000001"),
    namespace="shop",
    name="web",
    resource_version=ResourceVersion("1"),
    labels={"app": "web", "tier": "front end", "Www.k8s.io/test": "label"},
    annotations={"note": 'say "hi"\n', "Www.k8s.io/test": "cased", "a[b']c": "odd"},
    containers=(
        Container(
            "main",
            resources=ResourceRequirements(
                limits={
                    "cpu": "500m",
                    "memory": "1.5Mi",
                    "ephemeral-storage": "2Gi",
                    "hugepages-2Mi": "4Mi",
                },
                requests={
                    "cpu": "250m",
                    "memory": "1Mi",
                    "ephemeral-storage": "1Gi",
                    "hugepages-2Mi": "4Mi",
                },
            ),
        ),
        Container("unlimited"),
        Container(
            "zero",
            resources=ResourceRequirements(
                limits={"cpu": "0", "memory": "0m", "ephemeral-storage": "0", "hugepages-1Gi": "0"}
            ),
        ),
        Container("tiny", resources=ResourceRequirements(limits={"memory": "1"})),
        Container("huge", resources=ResourceRequirements(limits={"memory": "9007199254740993"})),
        Container("max", resources=ResourceRequirements(limits={"memory": "9223372036854775807"})),
        Container("broken", resources=ResourceRequirements(limits={"memory": "1i"})),
    ),
    init_containers=(
        Container("init", resources=ResourceRequirements(limits={"memory": "64Mi"})),
        Container("main", resources=ResourceRequirements(limits={"memory": "1Gi"})),
    ),
)

# -- fieldRef --------------------------------------------------------------------------------------

FIELDS = [
    pytest.param("metadata.name", "web", id="name"),
    pytest.param("metadata.namespace", "shop", id="namespace"),
    pytest.param("metadata.uid", "0b7a6c1e-0000-4000-8000-000000000001", id="uid"),
    pytest.param(
        "metadata.labels", 'Www.k8s.io/test="label"\napp="web"\ntier="front end"', id="labels"
    ),
    pytest.param(
        "metadata.annotations",
        'Www.k8s.io/test="cased"\na[b\']c="odd"\nnote="say \\"hi\\"\\n"',
        id="annotations",
    ),
    pytest.param("metadata.labels['app']", "web", id="label-subscript"),
    pytest.param("metadata.labels['absent']", "", id="label-absent-is-empty"),
    pytest.param("metadata.annotations['note']", 'say "hi"\n', id="annotation-raw-value"),
    pytest.param(
        "metadata.annotations['Www.k8s.io/test']", "cased", id="annotation-key-lowered-to-validate"
    ),
    pytest.param("metadata.annotations['example.com/x']", "", id="annotation-prefixed-absent"),
    pytest.param("metadata.annotations['\u0130']", "", id="annotation-dotted-capital-i-lowers"),
]


@pytest.mark.parametrize(("field_path", "expected"), FIELDS)
def test_extract_field_path(field_path: str, expected: str) -> None:
    assert extract_field_path(POD, field_path) == expected


def test_empty_maps_are_empty_files() -> None:
    bare = Pod(PodUID("u"), "ns", "p", ResourceVersion("1"))
    assert extract_field_path(bare, "metadata.labels") == ""
    assert extract_field_path(bare, "metadata.annotations") == ""


NAME_REGEX = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName' or 'my.name' or '123-abc', regex used for validation "
    "is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
PREFIX_REGEX = (
    "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
    "characters, '-' or '.', and must start and end with an alphanumeric character (e.g. "
    "'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)

FIELD_ERRORS = [
    pytest.param(
        "metadata.labels['Www.k8s.io/test']",
        f"invalid key subscript in metadata.labels['Www.k8s.io/test']: {PREFIX_REGEX}",
        id="label-key-not-lowered",
    ),
    pytest.param(
        "metadata.annotations['a[b']c']",
        f"invalid key subscript in metadata.annotations['a[b']c']: name part {NAME_REGEX}",
        id="subscript-splits-at-first-bracket",
    ),
    pytest.param(
        "metadata.labels['']",
        "invalid key subscript in metadata.labels['']: "
        f"name part must be non-empty;name part {NAME_REGEX}",
        id="empty-key",
    ),
    pytest.param(
        "metadata.labels['/a']",
        "invalid key subscript in metadata.labels['/a']: prefix part must be non-empty",
        id="empty-prefix",
    ),
    pytest.param(
        f"metadata.labels['{'k' * 64}']",
        f"invalid key subscript in metadata.labels['{'k' * 64}']: "
        "name part must be no more than 63 characters",
        id="name-too-long",
    ),
    pytest.param(
        "metadata.labels['a/b/c']",
        f"invalid key subscript in metadata.labels['a/b/c']: a qualified name {NAME_REGEX} "
        "with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
        id="two-slashes",
    ),
    pytest.param(
        "metadata.labels[ 'key' ]",
        "unsupported fieldPath: metadata.labels[ 'key' ]",
        id="spaced-subscript-is-not-one",
    ),
    pytest.param(
        "metadata.name['x']",
        "fieldPath \"metadata.name['x']\" does not support subscript",
        id="subscript-on-name",
    ),
    pytest.param("spec.nodeName", "unsupported fieldPath: spec.nodeName", id="env-only-field"),
    pytest.param("metadata.labels[']", "unsupported fieldPath: metadata.labels[']", id="no-key"),
]


@pytest.mark.parametrize(("field_path", "message"), FIELD_ERRORS)
def test_extract_field_path_error(field_path: str, message: str) -> None:
    with pytest.raises(VolumeSetupError) as info:
        extract_field_path(POD, field_path)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("field_path", "expected"),
    [
        pytest.param("metadata.labels['k']", ("metadata.labels", "k"), id="simple"),
        pytest.param(
            "metadata.annotations['a[b']c']", ("metadata.annotations", "a[b']c"), id="odd"
        ),
        pytest.param("metadata.labels['']", ("metadata.labels", ""), id="empty-key"),
        pytest.param("metadata.labels[ 'key' ]", None, id="spaces"),
        pytest.param("['k']", None, id="no-path"),
        pytest.param("metadata.labels", None, id="plain"),
    ],
)
def test_split_maybe_subscripted_path(field_path: str, expected: tuple[str, str] | None) -> None:
    assert split_maybe_subscripted_path(field_path) == expected


@pytest.mark.parametrize(
    ("key", "valid"),
    [
        pytest.param("app", True, id="name"),
        pytest.param("example.com/My_Name-1.x", True, id="prefixed"),
        pytest.param("www.k8s.io/test", True, id="lowercase-prefix"),
        pytest.param("Www.k8s.io/test", False, id="uppercase-prefix"),
        pytest.param("-a", False, id="leading-dash"),
        pytest.param("k" * 63, True, id="63-characters"),
        pytest.param("é", False, id="non-ascii"),
    ],
)
def test_qualified_name(key: str, valid: bool) -> None:
    assert (qualified_name_errors(key) == []) is valid


# -- resourceFieldRef ------------------------------------------------------------------------------

MEMORY_DIVISORS = [
    ("1", "1572864"),
    ("1k", "1573"),
    ("1M", "2"),
    ("1G", "1"),
    ("1T", "1"),
    ("1P", "1"),
    ("1E", "1"),
    ("1Ki", "1536"),
    ("1Mi", "2"),
    ("1Gi", "1"),
    ("1Ti", "1"),
    ("1Pi", "1"),
    ("1Ei", "1"),
]
STORAGE_DIVISORS = [
    ("1", "2147483648"),
    ("1k", "2147484"),
    ("1M", "2148"),
    ("1G", "3"),
    ("1T", "1"),
    ("1P", "1"),
    ("1E", "1"),
    ("1Ki", "2097152"),
    ("1Mi", "2048"),
    ("1Gi", "2"),
    ("1Ti", "1"),
    ("1Pi", "1"),
    ("1Ei", "1"),
]

RESOURCES = [
    pytest.param("main", "limits.cpu", "", "1", id="cpu-500m-rounds-up-to-1"),
    pytest.param("main", "limits.cpu", "1", "1", id="cpu-divisor-1"),
    pytest.param("main", "limits.cpu", "1m", "500", id="cpu-divisor-1m"),
    pytest.param("main", "requests.cpu", "1", "1", id="cpu-request-250m-divisor-1"),
    pytest.param("main", "requests.cpu", "1m", "250", id="cpu-request-divisor-1m"),
    *(
        pytest.param("main", "limits.memory", d, out, id=f"memory-1.5Mi-divisor-{d}")
        for d, out in MEMORY_DIVISORS
    ),
    *(
        pytest.param("main", "limits.ephemeral-storage", d, out, id=f"storage-2Gi-divisor-{d}")
        for d, out in STORAGE_DIVISORS
    ),
    pytest.param("main", "requests.memory", "1Mi", "1", id="memory-request-exact"),
    pytest.param("tiny", "limits.memory", "1Mi", "1", id="one-byte-divisor-1Mi-rounds-up"),
    pytest.param("main", "requests.ephemeral-storage", "1Gi", "1", id="storage-request"),
    pytest.param("main", "limits.hugepages-2Mi", "1Mi", "4", id="hugepages-limit"),
    pytest.param("main", "requests.hugepages-2Mi", "", "4194304", id="hugepages-request"),
    pytest.param("main", "limits.memory", "0", "1572864", id="zero-divisor-means-1"),
    pytest.param("unlimited", "limits.cpu", "", "4", id="missing-cpu-limit-is-allocatable"),
    pytest.param("unlimited", "limits.cpu", "1m", "4000", id="allocatable-cpu-millis"),
    pytest.param("unlimited", "limits.memory", "", str(8 * GI), id="missing-memory-limit"),
    pytest.param("unlimited", "limits.ephemeral-storage", "1Gi", "100", id="missing-storage"),
    pytest.param("unlimited", "requests.cpu", "1m", "0", id="missing-request-is-zero"),
    pytest.param("unlimited", "requests.memory", "", "0", id="missing-memory-request"),
    pytest.param("unlimited", "limits.hugepages-2Mi", "", "0", id="hugepages-never-defaulted"),
    pytest.param("zero", "limits.cpu", "1m", "4000", id="zero-cpu-limit-is-allocatable"),
    pytest.param("zero", "limits.memory", "1Gi", "8", id="zero-memory-limit-is-allocatable"),
    pytest.param("zero", "limits.ephemeral-storage", "1Gi", "100", id="zero-storage-limit"),
    pytest.param("zero", "limits.hugepages-1Gi", "", "0", id="zero-hugepages-stays-zero"),
    pytest.param("init", "limits.memory", "1Mi", "64", id="init-container"),
    pytest.param("huge", "limits.memory", "", "9007199254740992", id="float64-rounding"),
    pytest.param("max", "limits.memory", "", "-9223372036854775808", id="amd64-overflow"),
]


@pytest.mark.parametrize(("container", "resource", "divisor", "expected"), RESOURCES)
def test_extract_resource(container: str, resource: str, divisor: str, expected: str) -> None:
    selector = ResourceFieldSelector(resource=resource, container_name=container, divisor=divisor)
    assert extract_resource(POD, selector, allocatable=ALLOCATABLE) == expected


def test_containers_win_over_init_containers_of_the_same_name() -> None:
    selector = ResourceFieldSelector("limits.memory", container_name="main", divisor="1Mi")
    assert extract_resource(POD, selector, allocatable=ALLOCATABLE) == "2"


RESOURCE_ERRORS = [
    pytest.param("nope", "limits.cpu", "", "container nope not found", id="unknown-container"),
    pytest.param(
        "main",
        "limits.nvidia.com/gpu",
        "",
        "unsupported container resource : limits.nvidia.com/gpu",
        id="extended-resource",
    ),
    pytest.param(
        "main", "cpu", "", "unsupported container resource : cpu", id="no-limits-or-requests"
    ),
    pytest.param(
        "nope",
        "limits.gpu",
        "",
        "container nope not found",
        id="container-checked-before-resource",
    ),
    pytest.param(
        "broken",
        "limits.memory",
        "",
        'container broken resources.limits[memory]: invalid quantity "1i": '
        "unable to parse quantity's suffix",
        id="bad-quantity",
    ),
    pytest.param(
        "main",
        "limits.memory",
        "1Q",
        'divisor: invalid quantity "1Q": quantities must match the regular expression',
        id="bad-divisor",
    ),
]


@pytest.mark.parametrize(("container", "resource", "divisor", "message"), RESOURCE_ERRORS)
def test_extract_resource_error(container: str, resource: str, divisor: str, message: str) -> None:
    selector = ResourceFieldSelector(resource=resource, container_name=container, divisor=divisor)
    with pytest.raises(VolumeSetupError) as info:
        extract_resource(POD, selector, allocatable=ALLOCATABLE)
    assert str(info.value).startswith(message)


# -- the volume ------------------------------------------------------------------------------------


def field(path: str, field_path: str, mode: int | None = None) -> DownwardAPIVolumeFile:
    return DownwardAPIVolumeFile(path=path, field_ref=ObjectFieldSelector(field_path), mode=mode)


def resource(path: str, name: str, divisor: str = "") -> DownwardAPIVolumeFile:
    ref = ResourceFieldSelector(resource=name, container_name="main", divisor=divisor)
    return DownwardAPIVolumeFile(path=path, resource_field_ref=ref)


PAYLOADS = [
    pytest.param(
        (
            field("podname", "metadata.name"),
            field("labels", "metadata.labels", mode=0o400),
            resource("cpu_limit", "limits.cpu", "1m"),
        ),
        {
            "podname": FileProjection(b"web", 0o644),
            "labels": FileProjection(
                b'Www.k8s.io/test="label"\napp="web"\ntier="front end"', 0o400
            ),
            "cpu_limit": FileProjection(b"500", 0o644),
        },
        id="field-and-resource",
    ),
    pytest.param(
        (field("a//b/./c", "metadata.uid"), field("./d", "metadata.namespace")),
        {
            "a/b/c": FileProjection(b"0b7a6c1e-0000-4000-8000-000000000001", 0o644),
            "d": FileProjection(b"shop", 0o644),
        },
        id="paths-cleaned",
    ),
    pytest.param(
        (field("x", "metadata.name"), field("./x", "metadata.namespace")),
        {"x": FileProjection(b"shop", 0o644)},
        id="later-item-wins",
    ),
    pytest.param(
        (DownwardAPIVolumeFile(path="empty", mode=0),),
        {"empty": FileProjection(b"", 0)},
        id="no-reference-empty-file-mode-zero",
    ),
    pytest.param(
        (field("note", "metadata.annotations['note']"),),
        {"note": FileProjection(b'say "hi"\n', 0o644)},
        id="annotation-value-raw",
    ),
    pytest.param((), {}, id="no-items"),
]


@pytest.mark.parametrize(("items", "expected"), PAYLOADS)
def test_make_payload(
    items: tuple[DownwardAPIVolumeFile, ...], expected: dict[str, FileProjection]
) -> None:
    assert make_payload(items, POD, default_mode=0o644, allocatable=ALLOCATABLE) == expected


def test_make_payload_passes_fs_user() -> None:
    payload = make_payload(
        (field("n", "metadata.name"),),
        POD,
        default_mode=0o600,
        allocatable=ALLOCATABLE,
        fs_user=1000,
    )
    assert payload == {"n": FileProjection(b"web", 0o600, fs_user=1000)}


PAYLOAD_ERRORS = [
    pytest.param(
        (field("a", "spec.nodeName"),),
        "unsupported fieldPath: spec.nodeName",
        id="single-error-no-brackets",
    ),
    pytest.param(
        (
            field("a", "spec.nodeName"),
            field("ok", "metadata.name"),
            DownwardAPIVolumeFile("b", resource_field_ref=ResourceFieldSelector("limits.cpu", "x")),
        ),
        "[unsupported fieldPath: spec.nodeName, container x not found]",
        id="errors-aggregated-in-order",
    ),
    pytest.param(
        (field("a", "spec.nodeName"), field("b", "spec.nodeName")),
        "unsupported fieldPath: spec.nodeName",
        id="repeated-error-printed-once",
    ),
]


@pytest.mark.parametrize(("items", "message"), PAYLOAD_ERRORS)
def test_make_payload_error(items: tuple[DownwardAPIVolumeFile, ...], message: str) -> None:
    with pytest.raises(VolumeSetupError) as info:
        make_payload(items, POD, default_mode=0o644, allocatable=ALLOCATABLE)
    assert str(info.value) == message


def test_make_payload_rejects_a_reserved_path() -> None:
    with pytest.raises(InvalidPayload, match=r"\.\.data"):
        make_payload(
            (field("..data/x", "metadata.name"),),
            POD,
            default_mode=0o644,
            allocatable=ALLOCATABLE,
        )


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        pytest.param([], "", id="none"),
        pytest.param(["a"], "a", id="one"),
        pytest.param(["a", "b"], "[a, b]", id="two"),
        pytest.param(["a", "b", "a"], "[a, b]", id="duplicates-once"),
        pytest.param(["a", "a"], "a", id="one-distinct"),
    ],
)
def test_aggregate_message(messages: list[str], expected: str) -> None:
    assert aggregate_message(messages) == expected


def test_host_allocatable(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemFree:  1 kB\nMemTotal:       16318508 kB\n")
    stat = os.statvfs(tmp_path)
    allocatable = host_allocatable(meminfo=meminfo, root_fs=str(tmp_path))
    assert allocatable == NodeAllocatable(
        cpu_millis=(os.cpu_count() or 1) * 1000,
        memory_bytes=16318508 * 1024,
        ephemeral_storage_bytes=stat.f_blocks * stat.f_frsize,
    )


def test_host_allocatable_needs_mem_total(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemFree: 1 kB\n")
    with pytest.raises(ValueError, match="no MemTotal"):
        host_allocatable(meminfo=meminfo, root_fs=str(tmp_path))


def test_configured_node_allocatable_overrides_the_host() -> None:
    from fusevol.projection.downward import host_allocatable, node_allocatable

    host = host_allocatable()
    configured = node_allocatable({"cpu": "3500m", "memory": "6Gi"})
    assert configured.cpu_millis == 3500
    assert configured.memory_bytes == 6 << 30
    assert configured.ephemeral_storage_bytes == host.ephemeral_storage_bytes
    assert node_allocatable({}) == host
    with pytest.raises(ValueError, match="unknown allocatable resource"):
        node_allocatable({"gpu": "1"})
