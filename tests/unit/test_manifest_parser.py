"""Bad input at the parser: `parse_manifest` returns objects or raises ManifestError, nothing else.

In-process and fast. Three parts:
- a table of bad inputs (keys, paths, modes, names, quantities), each with the field its error
  must name;
- inputs the parser must accept because kubelet rejects them later (when it writes the payload),
  checked one level down, at the projection;
- seeded random inputs (tests/fuzz.py): every outcome is a list of objects or a
  ManifestError whose message starts with the file name.
"""

from __future__ import annotations

import json
import random
from typing import TYPE_CHECKING

import pytest
import yaml

from fusevol.base.errors import InvalidPayload, ManifestError, VolumeSetupError
from fusevol.decode.manifest import parse_manifest
from fusevol.model import (
    ConfigMap,
    ConfigMapVolumeSource,
    CSIVolumeSource,
    FileProjection,
    InvalidVolumeSource,
    Pod,
    ResourceVersion,
    UnsupportedVolumeSource,
)
from fusevol.node.layout import plugin_for
from fusevol.projection import configmap
from tests import fuzz
from tests.decoding import manifest_error

if TYPE_CHECKING:
    from collections.abc import Callable

ORIGIN = "/manifests/bad.yaml"
JSON_ORIGIN = "/manifests/bad.json"

CONFIGMAP = "kind: ConfigMap\nmetadata: {{name: app}}\ndata: {data}\n"
SECRET = "kind: Secret\nmetadata: {{name: creds}}\n{body}\n"


def pod(volume: str) -> str:
    return (
        "kind: Pod\nmetadata: {name: web, uid: aaaaaaaa-0000-4000-8000-000000000001}\n"
        f"spec:\n  containers: [{{name: c}}]\n  volumes:\n  - {volume}\n"
    )


def configmap_volume(items: str, extra: str = "") -> str:
    return pod(f"{{name: v, configMap: {{name: app, items: {items}{extra}}}}}")


def fail(text: str | bytes, origin: str = ORIGIN) -> str:
    data = text.encode() if isinstance(text, str) else text
    message = manifest_error(data, origin=origin)
    assert message.startswith(origin + ": "), message
    return message


LONG_VALUE = "x" * (1024 * 1024)

REJECTED = [
    pytest.param("kind: ConfigMap\nmetadata: {name: x\n  data: [", "invalid YAML", id="yaml"),
    pytest.param("a: b\na: c\n", "found duplicate key 'a'", id="yaml-duplicate-key"),
    pytest.param("[" * 10_000, "nested too deeply", id="yaml-deep"),
    pytest.param(
        b"kind: ConfigMap\nmetadata: {name: \xff}\n", "not valid UTF-8 (byte 33)", id="utf8"
    ),
    pytest.param(b"kind: ConfigMap\x00\n", "unacceptable character #x0000", id="nul-yaml"),
    pytest.param(
        CONFIGMAP.format(data="{..data: x}"),
        "configmap default/app: data[\"..data\"]: must not start with '..'",
        id="key-dotdot-prefix",
    ),
    pytest.param(
        CONFIGMAP.format(data="{'..': x}"),
        "configmap default/app: data[\"..\"]: must not be '..'",
        id="key-dotdot",
    ),
    pytest.param(
        CONFIGMAP.format(data="{a/b: x}"),
        'configmap default/app: data["a/b"]: a valid config key',
        id="key-slash",
    ),
    pytest.param(
        CONFIGMAP.format(data="{/etc/passwd: x}"),
        'data["/etc/passwd"]: a valid config key',
        id="key-absolute",
    ),
    pytest.param(
        CONFIGMAP.format(data="{" + "k" * 254 + ": x}"),
        "must be no more than 253 bytes",
        id="key-254-bytes",
    ),
    pytest.param(
        CONFIGMAP.format(data='{"a\\0b": x}'),
        'data["a\\u0000b"]: a valid config key',
        id="key-nul",
    ),
    pytest.param(
        CONFIGMAP.format(data=f"{{a: {LONG_VALUE}}}"),
        "configmap default/app: data: Too long: must have at most 1048576 bytes (has 1048577)",
        id="configmap-over-1MiB",
    ),
    pytest.param(
        SECRET.format(body=f"stringData: {{a: {LONG_VALUE}}}"),
        "secret default/creds: data: Too long",
        id="secret-over-1MiB",
    ),
    pytest.param(
        CONFIGMAP.format(data="{a: x}") + "binaryData: {a: eA==}\n",
        'binaryData["a"]: duplicate of key present in data',
        id="key-in-data-and-binaryData",
    ),
    pytest.param(
        SECRET.format(body="data: {a: 'not base64!'}"),
        'secret default/creds: data["a"]: illegal base64 data',
        id="secret-not-base64",
    ),
    pytest.param(
        configmap_volume("[{key: a, path: /etc/passwd}]"),
        'pod default/web: spec.volumes[0].configMap.items[0].path: invalid value "/etc/passwd": '
        "must be a relative path",
        id="item-path-absolute",
    ),
    pytest.param(
        configmap_volume("[{key: a, path: a/../../x}]"),
        "spec.volumes[0].configMap.items[0].path: "
        "invalid value \"a/../../x\": must not contain '..'",
        id="item-path-dotdot",
    ),
    pytest.param(
        configmap_volume("[{key: a, path: ..data}]"),
        "items[0].path: invalid value \"..data\": must not start with '..'",
        id="item-path-reserved",
    ),
    pytest.param(
        configmap_volume("[]", ", defaultMode: 01000"),
        "spec.volumes[0].configMap.defaultMode: must be a number between 0 and 0777",
        id="defaultMode-512",
    ),
    pytest.param(
        configmap_volume("[{key: a, path: a, mode: -1}]"),
        "spec.volumes[0].configMap.items[0].mode: must be a number between 0 and 0777",
        id="mode-negative",
    ),
    pytest.param(
        configmap_volume("[{key: a, path: a, mode: '0644'}]"),
        "items[0].mode: must be an integer, not str",
        id="mode-string",
    ),
    pytest.param(
        configmap_volume("[{key: a, path: a, mode: true}]"),
        "items[0].mode: must be an integer, not bool",
        id="mode-bool",
    ),
    pytest.param(
        pod(
            "{name: v, projected: {sources: [{configMap: {name: a, items: [{key: k, path: p}]}},"
            " {secret: {name: b, items: [{key: k, path: p}]}}]}}"
        ),
        'spec.volumes[0].projected: invalid value "b": conflicting duplicate paths',
        id="projected-duplicate-paths",
    ),
    pytest.param(
        pod(
            "{name: v, projected: {sources: [{downwardAPI: {items: [{path: p, fieldRef: "
            "{fieldPath: metadata.name}}, {path: p, fieldRef: {fieldPath: metadata.uid}}]}}]}}"
        ),
        'spec.volumes[0].projected: invalid value "p": conflicting duplicate paths',
        id="projected-downward-duplicate-paths",
    ),
    pytest.param(
        pod("{name: v, hostPath: {path: /var/../etc}}"),
        "spec.volumes[0].hostPath.path: invalid value \"/var/../etc\": must not contain '..'",
        id="hostPath-dotdot",
    ),
    pytest.param(
        pod("{name: v, hostPath: {path: /var, type: Symlink}}"),
        'spec.volumes[0].hostPath.type: unsupported value "Symlink"',
        id="hostPath-unknown-type",
    ),
    pytest.param(
        "kind: PersistentVolume\nmetadata: {name: pv}\nspec: {local: {path: /mnt/../etc}}\n",
        "persistentvolume pv: spec.local.path: "
        "invalid value \"/mnt/../etc\": must not contain '..'",
        id="local-dotdot",
    ),
    pytest.param(
        pod("{name: v, nfs: {server: s, path: relative}}"),
        'spec.volumes[0].nfs.path: invalid value "relative": must be an absolute path',
        id="nfs-relative",
    ),
    pytest.param(
        pod("{name: v, emptyDir: {medium: HugePages}}"),
        'spec.volumes[0].emptyDir.medium: unsupported value "HugePages"',
        id="emptyDir-medium",
    ),
    pytest.param(
        pod("{name: v, emptyDir: {}, configMap: {name: app}}"),
        "spec.volumes[0]: may not specify more than 1 volume type",
        id="two-volume-types",
    ),
    pytest.param(
        CONFIGMAP.format(data="{a: x}") + "---\n" + CONFIGMAP.format(data="{a: y}"),
        "configmap default/app: defined twice (document 1, document 2)",
        id="defined-twice",
    ),
    pytest.param(
        pod("{name: v, emptyDir: {}}\n  - {name: v, emptyDir: {}}"),
        'spec.volumes[1].name: Duplicate value: "v"',
        id="duplicate-volume-name",
    ),
    pytest.param(
        pod("{name: v, emptyDir: {}}").replace(
            "[{name: c}]", "[{name: c, volumeMounts: [{name: w, mountPath: /w}]}]"
        ),
        'spec.containers[0].volumeMounts[0].name: Not found: "w"',
        id="mount-of-missing-volume",
    ),
    pytest.param("- a\n- b\n", "document 1: must be a mapping, not list", id="not-a-mapping"),
    pytest.param(
        "kind: List\nitems: [1]\n", "document 1: items[0]: must be a mapping", id="list-item"
    ),
]


@pytest.mark.parametrize(("text", "expected"), REJECTED)
def test_bad_input_is_a_manifest_error_naming_object_and_field(
    text: str | bytes, expected: str
) -> None:
    assert expected in fail(text)


JSON_REJECTED = [
    pytest.param(
        '{"kind": "ConfigMap",}',
        "line 1 column 22: invalid JSON: Expecting property name",
        id="trailing-comma",
    ),
    pytest.param("[" * 100_000, "invalid JSON: nested too deeply", id="deep"),
    pytest.param(
        '{"kind": "ConfigMap", "metadata": {"name": "a\\u0000b"}}',
        "configmap default/a\x00b: metadata.name: must be a lowercase RFC 1123 subdomain",
        id="nul-in-name",
    ),
    pytest.param(
        '{"kind": "ConfigMap", "metadata": {"name": "\\ud800"}}',
        "metadata.name: must be valid Unicode",
        id="lone-surrogate",
    ),
]


@pytest.mark.parametrize(("text", "expected"), JSON_REJECTED)
def test_bad_json_is_a_manifest_error(text: str, expected: str) -> None:
    assert expected in fail(text, JSON_ORIGIN)


def test_unknown_kinds_and_versions_are_skipped_not_errors() -> None:
    text = (
        "kind: Deployment\nmetadata: {name: d}\n---\n"
        "apiVersion: apps/v1\nkind: Pod\nmetadata: {name: p}\n---\n"
        "kind: ConfigMap\nmetadata: {name: kept}\n"
    )
    objects = parse_manifest(text.encode(), origin=ORIGIN)
    assert [obj.key.name for obj in objects] == ["kept"]


def test_ten_thousand_keys_are_accepted() -> None:
    data = ", ".join(f"k{i}: v{i}" for i in range(10_000))
    (obj,) = parse_manifest(CONFIGMAP.format(data="{" + data + "}").encode(), origin=ORIGIN)
    assert isinstance(obj, ConfigMap)
    assert len(obj.data) == 10_000
    assert obj.data["k9999"] == b"v9999"


def test_unknown_volume_type_is_parsed_as_unsupported() -> None:
    (obj,) = parse_manifest(pod("{name: v, cephfs: {monitors: [x]}}").encode(), origin=ORIGIN)
    assert isinstance(obj, Pod)
    assert obj.volumes[0].source == UnsupportedVolumeSource(type_name="cephfs")


def test_a_csi_volume_keeps_its_attributes_for_fusevol_io_only() -> None:
    """What the CSI node plugin prepares before kubelet publishes (`fusevol.csi.preparing`):
    a fusevol.io volume's attributes; another driver's are nothing fusevol reads. A malformed
    one fails alone, as any volume does."""
    volumes = (
        "{name: ours, csi: {driver: fusevol.io, volumeAttributes: {configMap: app}}}\n"
        "  - {name: theirs, csi: {driver: other.example.com, volumeAttributes: {k: v}}}\n"
        "  - {name: bare, csi: {driver: fusevol.io}}\n"
        "  - {name: broken, csi: {volumeAttributes: {k: v}}}"
    )
    (obj,) = parse_manifest(pod(volumes).encode(), origin=ORIGIN)
    assert isinstance(obj, Pod)
    ours, theirs, bare, broken = (volume.source for volume in obj.volumes)
    assert ours == CSIVolumeSource("fusevol.io", (("configMap", "app"),))
    assert theirs == CSIVolumeSource("other.example.com")
    assert bare == CSIVolumeSource("fusevol.io")
    assert broken == InvalidVolumeSource("csi", "spec.volumes[3].csi.driver: Required value")
    assert plugin_for(ours) is None  # served through kubelet's publish only


# -- accepted by the parser, refused when the payload is built (as kubelet does) ------------------


def _payload_of(volume_yaml: str, data: dict[str, bytes]) -> object:
    (obj,) = parse_manifest(configmap_volume(volume_yaml).encode(), origin=ORIGIN)
    assert isinstance(obj, Pod)
    source = obj.volumes[0].source
    assert isinstance(source, ConfigMapVolumeSource)
    return configmap.make_payload(
        source, ConfigMap("default", "app", ResourceVersion("1"), data=data)
    )


PAYLOAD_REJECTED = [
    pytest.param(
        "[{key: a, path: " + "n" * 256 + "}]",
        InvalidPayload,
        "file names must be no more than 255 bytes, not 256",
        id="name-256-bytes",
    ),
    pytest.param(
        "[{key: a, path: " + "/".join(["d" * 254] * 16) + "/" + "f" * 17 + "}]",
        InvalidPayload,
        "must be no more than 4096 bytes, not 4097",
        id="path-4097-bytes",
    ),
    pytest.param(
        '[{key: a, path: "a\\0b"}]', InvalidPayload, "must not contain NUL", id="path-nul"
    ),
    pytest.param(
        "[{key: nope, path: x}]",
        VolumeSetupError,
        "configmap references non-existent config key: nope",
        id="missing-key",
    ),
    pytest.param(
        "[{key: a, path: x}, {key: a, path: x/y}]",
        InvalidPayload,
        '"x" is a file, but "x/y" needs it to be a directory',
        id="file-and-directory",
    ),
]


@pytest.mark.parametrize(("items", "error", "expected"), PAYLOAD_REJECTED)
def test_parser_accepts_what_the_payload_builder_refuses(
    items: str, error: type[Exception], expected: str
) -> None:
    with pytest.raises(error, match=None) as raised:
        _payload_of(items, {"a": b"1"})
    assert expected in str(raised.value)


def test_path_of_exactly_4096_bytes_is_accepted() -> None:
    path = "/".join(["d" * 254] * 16) + "/" + "f" * 16
    assert len(path.encode()) == 4096
    payload = _payload_of("[{key: a, path: " + path + "}]", {"a": b"1"})
    assert list(payload) == [path]  # type: ignore[call-overload]


def test_duplicate_item_paths_in_one_configmap_volume_keep_the_last() -> None:
    """Not an API error for a configMap volume (only across projected sources); kubelet's map
    keeps the last item, and so must we."""
    payload = _payload_of(
        "[{key: a, path: x}, {key: b, path: x, mode: 0600}]", {"a": b"1", "b": b"2"}
    )
    assert dict(payload) == {"x": FileProjection(b"2", 0o600)}  # type: ignore[call-overload]


# -- known bugs, one reproducer each --------------------------------------------------------------


def _raises_only_manifest_error(text: bytes, origin: str) -> None:
    """`text` is refused with a ManifestError naming `origin`: not accepted, and not any other
    exception (which would propagate and fail the test)."""
    try:
        parsed = parse_manifest(text, origin=origin)
    except ManifestError as exc:
        message = str(exc)
    else:
        pytest.fail(f"accepted, not refused: {text[:60]!r} -> {parsed!r}")
    assert message.startswith(origin + ": ")


UNHASHABLE_KIND = [
    pytest.param(b"kind: [ConfigMap]\n", ORIGIN, id="yaml-list"),
    pytest.param(b"kind: {a: 1}\n", ORIGIN, id="yaml-mapping"),
    pytest.param(b"kind: !!omap [a: 1]\n", ORIGIN, id="yaml-omap"),
    pytest.param(b'{"kind": ["Pod"]}', JSON_ORIGIN, id="json-list"),
]


@pytest.mark.parametrize(("text", "origin"), UNHASHABLE_KIND)
def test_unhashable_kind(text: bytes, origin: str) -> None:
    _raises_only_manifest_error(text, origin)


BAD_TAGGED_SCALARS = [
    pytest.param(b"a: !!timestamp x\n", id="timestamp"),
    pytest.param(b"a: !!bool x\n", id="bool"),
    pytest.param(b"a: !!int ''\n", id="int-empty"),
    pytest.param(b"a: !!float ''\n", id="float-empty"),
    pytest.param(b"!<tag:yaml.org,2002:int> ''\n", id="int-verbatim-tag"),
]


@pytest.mark.parametrize("text", BAD_TAGGED_SCALARS)
def test_malformed_tagged_scalar(text: bytes) -> None:
    _raises_only_manifest_error(text, ORIGIN)


def test_json_integer_over_4300_digits() -> None:
    _raises_only_manifest_error(b'{"kind": "ConfigMap", "x": ' + b"1" * 4301 + b"}", JSON_ORIGIN)


MARKER = "zq7marker9x"  # lower case: float() error messages lower-case their input

SECRET_VALUE_ERRORS = [
    pytest.param(f"stringData: {{token: {MARKER}\n", id="unclosed-flow"),
    pytest.param(f'stringData: {{token: "{MARKER}\\q"}}', id="bad-escape"),
    pytest.param(f"stringData: {{token: '{MARKER}", id="unclosed-quote"),
    pytest.param(f"data: {{token: {MARKER}!}}", id="bad-base64"),
    pytest.param(f"data: {{token: {MARKER}é}}", id="non-ascii-base64"),
    pytest.param(f"stringData: {{token: !!binary {MARKER}}}", id="binary-tag"),
    pytest.param(f"stringData: {{token: [{MARKER}]}}", id="list"),
    pytest.param(f"stringData:\n  token: {MARKER}\n  token: {MARKER}", id="duplicate-key"),
    pytest.param(f"stringData:\n  token: |\n {MARKER}\n\tx", id="tab-indent"),
    pytest.param(f"stringData: {{token: {MARKER}\x00}}", id="nul"),
    pytest.param(f"stringData: {{token: !!int {MARKER}}}", id="int-tag"),
    pytest.param(f"stringData: {{token: !!float {MARKER}}}", id="float-tag"),
]


@pytest.mark.parametrize("body", SECRET_VALUE_ERRORS)
def test_error_messages_never_quote_secret_values(body: str) -> None:
    message = fail(SECRET.format(body=body))
    assert MARKER not in message.lower(), message


# -- seeded random inputs -------------------------------------------------------------------------


GENERATORS = [
    pytest.param(fuzz.random_bytes, 1500, id="random-bytes"),
    pytest.param(fuzz.mutated_manifest, 700, id="mutated-manifest"),
    pytest.param(fuzz.corrupted_manifest, 700, id="corrupted-manifest"),
    pytest.param(fuzz.token_soup, 1500, id="yaml-token-soup"),
]


@pytest.mark.parametrize(("generate", "count"), GENERATORS)
def test_random_input_gives_objects_or_a_manifest_error(
    generate: Callable[[random.Random], tuple[str, bytes]], count: int
) -> None:
    outcomes = {"objects": 0, "error": 0}
    for seed in range(count):
        name, data = generate(random.Random(f"{generate.__name__}-{seed}"))
        origin = f"/manifests/{name}"
        try:
            parse_manifest(data, origin=origin)
        except ManifestError as exc:
            outcomes["error"] += 1
            message = str(exc)
            if not message.startswith(origin + ": "):
                raise AssertionError(f"seed {seed}: {data!r}: {message}") from exc
        except Exception as exc:
            raise AssertionError(
                f"seed {seed} of {generate.__name__}: {data!r}\n{type(exc).__name__}: {exc}"
            ) from exc
        else:
            outcomes["objects"] += 1
    # Not vacuous: the generator reaches past the decoder, and most inputs are refused.
    assert outcomes["error"] > count // 4, outcomes
    if generate is not fuzz.random_bytes:
        assert outcomes["objects"] > 0 or generate is fuzz.token_soup, outcomes


def test_json_and_yaml_agree_on_mutated_manifests() -> None:
    """The same document as JSON and as YAML: both accepted with equal objects, or both refused."""
    compared = 0
    for seed in range(300):
        document = fuzz.mutated_document(random.Random(f"agree-{seed}"))
        if not fuzz.has_only_string_keys(document):
            continue  # JSON turns 1, null and true keys into strings; YAML keeps them
        try:
            as_yaml = yaml.safe_dump(document).encode()
        except yaml.YAMLError:
            continue
        results: list[object] = []
        for origin, data in (("/m/x.json", json.dumps(document).encode()), ("/m/x.yaml", as_yaml)):
            try:
                results.append(parse_manifest(data, origin=origin))
            except ManifestError as exc:
                results.append(str(exc).split(": ", 1)[1])
            except Exception as exc:
                results.append(type(exc).__name__)
        assert results[0] == results[1], (seed, document, results)
        compared += 1
    assert compared > 100
