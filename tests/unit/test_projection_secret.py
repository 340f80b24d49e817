"""secret payloads: kubelet's `secret.MakePayload` and its not-found rule.

docs/kubelet.md fact 3.
"""

from __future__ import annotations

import re

import pytest

from fusevol.base.errors import FusevolError, InvalidPayload, VolumeSetupError
from fusevol.model import FileProjection, KeyToPath, ResourceVersion, Secret, SecretVolumeSource
from fusevol.projection.secret import make_payload

PASSWORD = b"hunter2-\x00\xff-very-secret"
TOKEN = b"tok-s3cr3t"

SECRET = Secret(
    namespace="ns",
    name="creds",
    resource_version=ResourceVersion("7"),
    data={"password": PASSWORD, "token": TOKEN, ".dockerconfigjson": b"{}"},
)


def f(data: bytes, mode: int = 0o644) -> FileProjection:
    return FileProjection(data=data, mode=mode)


def source(*items: KeyToPath, default_mode: int = 0o644, optional: bool = False):
    return SecretVolumeSource(
        secret_name="creds", items=items, default_mode=default_mode, optional=optional
    )


BUILDS = [
    pytest.param(
        source(),
        SECRET,
        {"password": f(PASSWORD), "token": f(TOKEN), ".dockerconfigjson": f(b"{}")},
        id="all-keys-and-dotfile",
    ),
    pytest.param(
        source(default_mode=0o400),
        SECRET,
        {
            "password": f(PASSWORD, 0o400),
            "token": f(TOKEN, 0o400),
            ".dockerconfigjson": f(b"{}", 0o400),
        },
        id="all-keys-default-mode",
    ),
    pytest.param(
        source(),
        Secret(namespace="ns", name="creds", resource_version=ResourceVersion("7")),
        {},
        id="empty-secret",
    ),
    pytest.param(
        source(KeyToPath(key="token", path="auth/service/token")),
        SECRET,
        {"auth/service/token": f(TOKEN)},
        id="item-nested-path-only-listed-keys",
    ),
    pytest.param(
        source(
            KeyToPath(key="password", path="pw", mode=0o400),
            KeyToPath(key="token", path="tk"),
            default_mode=0o440,
        ),
        SECRET,
        {"pw": f(PASSWORD, 0o400), "tk": f(TOKEN, 0o440)},
        id="item-mode-overrides-default",
    ),
    pytest.param(
        source(KeyToPath(key="token", path="a//b/./c")),
        SECRET,
        {"a/b/c": f(TOKEN)},
        id="item-path-cleaned",
    ),
    pytest.param(
        source(KeyToPath(key="nope", path="n"), KeyToPath(key="token", path="t"), optional=True),
        SECRET,
        {"t": f(TOKEN)},
        id="optional-skips-missing-key",
    ),
    pytest.param(source(optional=True), None, {}, id="optional-missing-secret"),
    pytest.param(
        source(KeyToPath(key="token", path="t"), optional=True),
        None,
        {},
        id="optional-missing-secret-with-items",
    ),
]


@pytest.mark.parametrize(("src", "secret", "expected"), BUILDS)
def test_make_payload(
    src: SecretVolumeSource, secret: Secret | None, expected: dict[str, FileProjection]
) -> None:
    assert make_payload(src, secret) == expected


FAILURES = [
    pytest.param(
        source(),
        None,
        VolumeSetupError,
        'secret "creds" not found',
        id="missing-secret",
    ),
    pytest.param(
        source(KeyToPath(key="token", path="t"), KeyToPath(key="nope", path="n")),
        SECRET,
        VolumeSetupError,
        "references non-existent secret key: nope",
        id="missing-key",
    ),
    pytest.param(
        source(KeyToPath(key="password", path="x/../../password")),
        SECRET,
        InvalidPayload,
        "items[0].path: invalid path \"x/../../password\": must not contain '..'",
        id="item-path-escapes",
    ),
    pytest.param(
        source(KeyToPath(key="password", path="..2024_01_01")),
        SECRET,
        InvalidPayload,
        "items[0].path: invalid path \"..2024_01_01\": must not start with '..'",
        id="item-path-reserved",
    ),
    pytest.param(
        source(KeyToPath(key="password", path="p/q"), KeyToPath(key="token", path="p")),
        SECRET,
        InvalidPayload,
        'invalid payload: "p" is a file, but "p/q" needs it to be a directory',
        id="file-and-directory",
    ),
    pytest.param(
        source(),
        Secret(
            namespace="ns",
            name="creds",
            resource_version=ResourceVersion("7"),
            data={"..data": PASSWORD},  # API validation would refuse the key; a manifest may not
        ),
        InvalidPayload,
        "invalid path \"..data\": must not start with '..'",
        id="unvalidated-reserved-key",
    ),
]


@pytest.mark.parametrize(("src", "secret", "error", "message"), FAILURES)
def test_make_payload_fails(
    src: SecretVolumeSource, secret: Secret | None, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        make_payload(src, secret)


@pytest.mark.parametrize(("src", "secret"), [p.values[:2] for p in FAILURES])
def test_secret_bytes_never_in_errors(src: SecretVolumeSource, secret: Secret | None) -> None:
    with pytest.raises(FusevolError) as info:
        make_payload(src, secret)
    for text in (str(info.value), repr(info.value)):
        for value in (PASSWORD, TOKEN):
            assert value.decode("latin-1") not in text
            assert repr(value) not in text


def test_secret_bytes_never_in_payload_repr() -> None:
    text = repr(make_payload(source(), SECRET))
    assert "password" in text  # the keys show ...
    assert "hunter2" not in text  # ... the bytes do not
    assert "s3cr3t" not in text
