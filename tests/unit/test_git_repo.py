"""gitRepo: kubelet's validation, the checkout directory, the ownership walk, and git's limits
(timeout, no credential prompt), with the real git against real local servers."""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import stat
import threading
from typing import TYPE_CHECKING

import pytest

from fusevol.base.errors import VolumeSetupError
from fusevol.model import GitRepoVolumeSource
from fusevol.mount import gitrepo
from tests.gitrepo import make_repository

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@pytest.mark.parametrize(
    ("source", "error"),
    [
        pytest.param(GitRepoVolumeSource("https://x/y"), "", id="plain"),
        pytest.param(GitRepoVolumeSource("https://x/y", "v1", "app/"), "", id="dir-trailing-slash"),
        pytest.param(GitRepoVolumeSource("https://x/y", "v1", "./app"), "", id="dir-dot-slash"),
        pytest.param(GitRepoVolumeSource("https://x/y", "", "a/b"), "", id="deep-without-revision"),
        pytest.param(
            GitRepoVolumeSource("-u evil"),
            '"-u evil" is an invalid value for repository',
            id="repository-flag",
        ),
        pytest.param(
            GitRepoVolumeSource("https://x/y", "--orphan"),
            '"--orphan" is an invalid value for revision',
            id="revision-flag",
        ),
        pytest.param(
            GitRepoVolumeSource("https://x/y", "", "-x"),
            '"-x" is an invalid value for directory',
            id="directory-flag",
        ),
        pytest.param(
            GitRepoVolumeSource("https://x/y", "v1", "a/b"),
            '"a/b" is not a valid directory, it must not contain a directory separator',
            id="deep-with-revision",
        ),
    ],
)
def test_kubelet_validation(source: GitRepoVolumeSource, error: str) -> None:
    if not error:
        gitrepo.validate(source)
        return
    with pytest.raises(VolumeSetupError) as caught:
        gitrepo.validate(source)
    assert str(caught.value) == error


def test_the_checkout_directory_must_be_the_only_entry(tmp_path: Path) -> None:
    (tmp_path / "one").mkdir()
    assert gitrepo._checkout_dir(tmp_path, "") == tmp_path / "one"
    assert gitrepo._checkout_dir(tmp_path, ".") == tmp_path
    (tmp_path / "two").mkdir()
    with pytest.raises(VolumeSetupError, match=r"unexpected directory contents: \['one', 'two'\]"):
        gitrepo._checkout_dir(tmp_path, "")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to change groups")
def test_ownership_walk(tmp_path: Path) -> None:
    root = tmp_path / "vol"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_text("x")
    os.chmod(root / "d" / "f", 0o600)
    os.symlink("d/f", root / "link")
    gitrepo.set_ownership(root, 4242)
    for path in (root, root / "d"):
        info = os.stat(path)
        assert info.st_gid == 4242
        assert info.st_mode & (stat.S_ISGID | 0o770) == stat.S_ISGID | 0o770
    info = os.stat(root / "d" / "f")
    assert (info.st_gid, stat.S_IMODE(info.st_mode)) == (4242, 0o660)
    assert os.lstat(root / "link").st_gid == 4242


# -- git against servers that never answer, or ask for credentials --------------------------------


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A git:// address whose server accepts connections and never says a word."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield f"git://127.0.0.1:{server.getsockname()[1]}/repo"


class _AskForPassword(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="git"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def password_server() -> Iterator[str]:
    """An http:// repository that wants a user name and password."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AskForPassword)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/repo.git"
    finally:
        server.shutdown()
        server.server_close()


def volume_dirs(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "pods" / "u" / "volumes" / "v", tmp_path / "pods" / "u" / "plugins" / "v"


async def test_a_hung_git_times_out_and_leaves_nothing(tmp_path: Path, silent_server: str) -> None:
    target, meta = volume_dirs(tmp_path)
    with pytest.raises(VolumeSetupError) as caught:
        await gitrepo.GitRepo(timeout_s=0.5).set_up(
            target, meta, GitRepoVolumeSource(silent_server), fs_group=None
        )
    expected = f"failed to exec 'git clone -- {silent_server}': timed out after 0.5s"
    assert str(caught.value) == expected
    assert not target.exists()
    assert not meta.exists()


async def test_credentials_are_never_prompted_for(tmp_path: Path, password_server: str) -> None:
    target, meta = volume_dirs(tmp_path)
    with pytest.raises(VolumeSetupError) as caught:
        await gitrepo.GitRepo(timeout_s=10).set_up(
            target, meta, GitRepoVolumeSource(password_server), fs_group=None
        )
    assert "terminal prompts disabled" in str(caught.value)
    assert not target.exists()


async def test_set_up_is_done_once(tmp_path: Path) -> None:
    (first,) = make_repository(tmp_path / "repo", [{"a": "1"}])
    target, meta = volume_dirs(tmp_path)
    plugin = gitrepo.GitRepo(timeout_s=10)
    source = GitRepoVolumeSource(str(tmp_path / "repo"), first, ".")
    await plugin.set_up(target, meta, source, fs_group=None)
    assert (meta / "ready").is_file()
    (target / "a").write_text("changed by the pod")
    await plugin.set_up(target, meta, source, fs_group=None)
    assert (target / "a").read_text() == "changed by the pod"
    gitrepo.remove(target, meta)
    assert not target.exists()
    assert not meta.exists()


@pytest.mark.parametrize("directory", [".", "app"])
async def test_the_volume_appears_only_once_its_revision_is_checked_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, directory: str
) -> None:
    """A reader looking while git runs (a `git` first in PATH records what the volume directory
    holds at each of git's steps, then runs the real git) sees no volume, then the requested
    revision: never the clone's newest commit."""
    first, _ = make_repository(tmp_path / "repo", [{"f": "old"}, {"f": "newest"}])
    target, meta = volume_dirs(tmp_path)
    shim = tmp_path / "bin"
    shim.mkdir()
    seen = tmp_path / "seen"
    real_git = shutil.which("git")
    assert real_git is not None
    (shim / "git").write_text(
        "#!/bin/sh\n"
        f'{{ printf "%s: " "$1"; ls -A "{target}" 2>/dev/null | tr "\\n" " " || true; echo; }}'
        f' >> "{seen}"\n'
        f'exec "{real_git}" "$@"\n'
    )
    os.chmod(shim / "git", 0o755)
    monkeypatch.setenv("PATH", f"{shim}:{os.environ['PATH']}")
    source = GitRepoVolumeSource(str(tmp_path / "repo"), first, directory)
    await gitrepo.GitRepo(timeout_s=30).set_up(target, meta, source, fs_group=None)
    assert seen.read_text().splitlines() == ["clone: ", "checkout: ", "reset: "]
    checked_out = target if directory == "." else target / directory
    assert (checked_out / "f").read_text() == "old"
    assert sorted(os.listdir(meta)) == ["ready"]  # nothing left aside
