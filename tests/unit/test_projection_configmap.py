"""configMap payloads: kubelet's `configmap.MakePayload` and its not-found rule.

docs/kubelet.md fact 3.
"""

from __future__ import annotations

import re

import pytest

from fusevol.base.errors import InvalidPayload, VolumeSetupError
from fusevol.model import (
    ConfigMap,
    ConfigMapVolumeSource,
    FileProjection,
    KeyToPath,
    ResourceVersion,
)
from fusevol.projection.configmap import make_payload

CM = ConfigMap(
    namespace="ns",
    name="cm",
    resource_version=ResourceVersion("1"),
    data={"app.conf": b"listen 80\n", "greeting": "héllo".encode(), ".hidden": b"dot"},
    binary_data={"logo.png": b"\x89PNG\x00\xff"},
)


def f(data: bytes, mode: int = 0o644) -> FileProjection:
    return FileProjection(data=data, mode=mode)


def source(*items: KeyToPath, default_mode: int = 0o644, optional: bool = False):
    return ConfigMapVolumeSource(
        name="cm", items=items, default_mode=default_mode, optional=optional
    )


BUILDS = [
    pytest.param(
        source(),
        CM,
        {
            "app.conf": f(b"listen 80\n"),
            "greeting": f("héllo".encode()),
            ".hidden": f(b"dot"),
            "logo.png": f(b"\x89PNG\x00\xff"),
        },
        id="all-keys-with-binary-data-and-dotfile",
    ),
    pytest.param(
        source(default_mode=0o400),
        CM,
        {
            "app.conf": f(b"listen 80\n", 0o400),
            "greeting": f(b"h\xc3\xa9llo", 0o400),
            ".hidden": f(b"dot", 0o400),
            "logo.png": f(b"\x89PNG\x00\xff", 0o400),
        },
        id="all-keys-default-mode-utf8",
    ),
    pytest.param(
        source(),
        ConfigMap(namespace="ns", name="cm", resource_version=ResourceVersion("1")),
        {},
        id="empty-configmap",
    ),
    pytest.param(
        source(KeyToPath(key="app.conf", path="conf/nginx/app.conf")),
        CM,
        {"conf/nginx/app.conf": f(b"listen 80\n")},
        id="item-nested-path-only-listed-keys",
    ),
    pytest.param(
        source(
            KeyToPath(key="app.conf", path="a", mode=0o600),
            KeyToPath(key="greeting", path="b"),
            default_mode=0o444,
        ),
        CM,
        {"a": f(b"listen 80\n", 0o600), "b": f(b"h\xc3\xa9llo", 0o444)},
        id="item-mode-overrides-default",
    ),
    pytest.param(
        source(KeyToPath(key="app.conf", path="zero", mode=0)),
        CM,
        {"zero": f(b"listen 80\n", 0)},
        id="item-mode-zero-is-not-default",
    ),
    pytest.param(
        source(KeyToPath(key="logo.png", path="img/logo")),
        CM,
        {"img/logo": f(b"\x89PNG\x00\xff")},
        id="item-from-binary-data",
    ),
    pytest.param(
        source(KeyToPath(key="greeting", path=".config/greeting")),
        CM,
        {".config/greeting": f(b"h\xc3\xa9llo")},
        id="item-dotfile-directory",
    ),
    pytest.param(
        source(KeyToPath(key="greeting", path="one"), KeyToPath(key="greeting", path="x/two")),
        CM,
        {"one": f(b"h\xc3\xa9llo"), "x/two": f(b"h\xc3\xa9llo")},
        id="one-key-two-paths",
    ),
    pytest.param(
        source(KeyToPath(key="greeting", path="./dir//file/")),
        CM,
        {"dir/file": f(b"h\xc3\xa9llo")},
        id="item-path-cleaned",
    ),
    pytest.param(
        source(KeyToPath(key="nope", path="n"), KeyToPath(key="greeting", path="g"), optional=True),
        CM,
        {"g": f(b"h\xc3\xa9llo")},
        id="optional-skips-missing-key",
    ),
    pytest.param(source(optional=True), None, {}, id="optional-missing-configmap"),
    pytest.param(
        source(KeyToPath(key="greeting", path="g"), optional=True),
        None,
        {},
        id="optional-missing-configmap-with-items",
    ),
]


@pytest.mark.parametrize(("src", "configmap", "expected"), BUILDS)
def test_make_payload(
    src: ConfigMapVolumeSource, configmap: ConfigMap | None, expected: dict[str, FileProjection]
) -> None:
    assert make_payload(src, configmap) == expected


# The API forbids a key in both maps; a manifest source may not have checked. Kubelet lets
# binaryData win without items (written last) and data win with items (looked up first).
BOTH = ConfigMap(
    namespace="ns",
    name="cm",
    resource_version=ResourceVersion("1"),
    data={"k": b"text"},
    binary_data={"k": b"binary"},
)


@pytest.mark.parametrize(
    ("src", "expected"),
    [
        pytest.param(source(), {"k": f(b"binary")}, id="no-items-binary-wins"),
        pytest.param(source(KeyToPath(key="k", path="k")), {"k": f(b"text")}, id="items-data-wins"),
    ],
)
def test_key_in_both_maps(src: ConfigMapVolumeSource, expected: dict[str, FileProjection]) -> None:
    assert make_payload(src, BOTH) == expected


FAILURES = [
    pytest.param(
        source(),
        None,
        VolumeSetupError,
        'configmap "cm" not found',
        id="missing-configmap",
    ),
    pytest.param(
        source(KeyToPath(key="greeting", path="g"), KeyToPath(key="nope", path="n")),
        CM,
        VolumeSetupError,
        "configmap references non-existent config key: nope",
        id="missing-key",
    ),
    pytest.param(
        source(KeyToPath(key="greeting", path="../escape")),
        CM,
        InvalidPayload,
        "items[0].path: invalid path \"../escape\": must not contain '..'",
        id="item-path-escapes",
    ),
    pytest.param(
        source(KeyToPath(key="greeting", path="..data"), optional=True),
        CM,
        InvalidPayload,
        "items[0].path: invalid path \"..data\": must not start with '..'",
        id="optional-does-not-excuse-reserved-path",
    ),
    pytest.param(
        source(KeyToPath(key="greeting", path="/etc/passwd")),
        CM,
        InvalidPayload,
        'items[0].path: invalid path "/etc/passwd": must be a relative path',
        id="item-path-absolute",
    ),
    pytest.param(
        source(KeyToPath(key="greeting", path="a"), KeyToPath(key="app.conf", path="a/b")),
        CM,
        InvalidPayload,
        'invalid payload: "a" is a file, but "a/b" needs it to be a directory',
        id="file-and-directory",
    ),
]


@pytest.mark.parametrize(("src", "configmap", "error", "message"), FAILURES)
def test_make_payload_fails(
    src: ConfigMapVolumeSource,
    configmap: ConfigMap | None,
    error: type[Exception],
    message: str,
) -> None:
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        make_payload(src, configmap)


def test_every_volume_shares_the_objects_bytes() -> None:
    # One copy of an object in memory however many volumes project it: payloads hold the very
    # bytes objects the store holds, never copies.
    all_keys = make_payload(ConfigMapVolumeSource(name="cm"), CM)
    mapped = make_payload(
        ConfigMapVolumeSource(name="cm", items=(KeyToPath("app.conf", "x/y.conf"),)), CM
    )
    assert all_keys["app.conf"].data is CM.data["app.conf"]
    assert mapped["x/y.conf"].data is CM.data["app.conf"]
    assert all_keys["logo.png"].data is CM.binary_data["logo.png"]
