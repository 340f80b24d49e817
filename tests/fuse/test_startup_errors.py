"""Ordinary start-up mistakes through the real CLI: one line saying what is wrong and what to do,
exit 1, no traceback, nothing created below the root.

Each case runs `python -m fusevol ...` as a user would: a file as `--root`, a non-root user
(`setpriv`), no `/dev/fuse` (a mount namespace whose /dev is an empty tmpfs), an HTTP port in use
or an address not of this host, a kubeconfig missing, a directory or not a kubeconfig.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


def fusevol(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, sys.executable, "-m", "fusevol", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def one_line(result: subprocess.CompletedProcess[str], *expected: str) -> str:
    """The run failed with exit 1 and exactly one line on stderr, holding every `expected`."""
    assert result.returncode == 1, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("fusevol: "), lines
    for text in expected:
        assert text in lines[0]
    assert result.stdout == ""
    return lines[0]


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    path = tmp_path / "manifests"
    path.mkdir()
    return path


def test_a_file_as_root_is_one_line(tmp_path: Path, manifests: Path) -> None:
    file = tmp_path / "file"
    file.write_text("x")
    result = fusevol("run", "--root", str(file), "--manifests", str(manifests))
    one_line(result, f"--root {file}: it is not a directory", "give a directory")
    below = fusevol("run", "--root", str(file / "sub"), "--manifests", str(manifests))
    one_line(below, f"{file} is not a directory")
    teardown = fusevol("teardown", "--root", str(file))
    one_line(teardown, "not a directory")
    assert file.read_text() == "x"


def test_a_non_root_user_is_told_to_run_as_root(tmp_path: Path, manifests: Path) -> None:
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    # uid nobody, with only the capability to read the checkout and its virtualenv whatever
    # their modes (a CI clone in a 0700 temporary directory): not root, which is what is checked.
    nobody = (
        *("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"),
        *("--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"),
    )
    root = tmp_path / "root"
    for args in (["run", "--manifests", str(manifests)], ["teardown"]):
        result = fusevol(*args, "--root", str(root), prefix=nobody)
        one_line(result, "must run as root: it mounts FUSE and bind mounts")
    assert not root.exists()


def test_no_fuse_device_says_how_to_get_one(tmp_path: Path, manifests: Path) -> None:
    root = tmp_path / "root"
    script = 'mount -t tmpfs none /dev && exec "$@"'
    prefix = ("unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh")
    result = fusevol("run", "--root", str(root), "--manifests", str(manifests), prefix=prefix)
    one_line(result, "no /dev/fuse", "modprobe fuse")
    assert not root.exists()


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_an_http_port_in_use_or_a_foreign_address_is_one_line(
    tmp_path: Path, manifests: Path, busy_port: int
) -> None:
    root = tmp_path / "root"
    common = ("run", "--root", str(root), "--manifests", str(manifests))
    in_use = fusevol(*common, "--http-host", "127.0.0.1", "--http-port", str(busy_port))
    one_line(in_use, f"--http-port {busy_port}: cannot listen: Address already in use")
    foreign = fusevol(*common, "--http-host", "198.51.100.7", "--http-port", "9842")
    one_line(foreign, "--http-host 198.51.100.7", "Cannot assign requested address")
    assert not root.exists()


def test_an_unreadable_or_invalid_kubeconfig_is_one_line(tmp_path: Path) -> None:
    root = tmp_path / "root"
    missing = tmp_path / "missing"
    one_line(
        fusevol("run", "--root", str(root), "--kubeconfig", str(missing)),
        f"--kubeconfig {missing}: cannot read it: No such file or directory",
    )
    one_line(
        fusevol("run", "--root", str(root), "--kubeconfig", str(tmp_path)),
        "cannot read it: Is a directory",
    )
    garbage = tmp_path / "garbage"
    garbage.write_text("just: [a, list]\n")
    result = fusevol("run", "--root", str(root), "--kubeconfig", str(garbage), "--http-port", "-1")
    one_line(result, f"Kubernetes client configuration ({garbage})")
