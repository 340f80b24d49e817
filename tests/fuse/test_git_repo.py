"""gitRepo volumes through the real agent and the real git, from local repositories."""

from __future__ import annotations

import os
import re
import stat
from typing import TYPE_CHECKING

import pytest

from tests.agent import running_agent, wait_for
from tests.fuse.test_volume_manager import pod, uid
from tests.gitrepo import git, head, make_repository

if TYPE_CHECKING:
    from pathlib import Path

    from tests.agent import AgentProcess

PLUGIN = "git-repo"


@pytest.fixture
def repository(tmp_path: Path) -> tuple[Path, list[str]]:
    """`repos/app`: commit 0 has a.txt "v0"; commit 1 has a.txt "v1" and sub/b.txt."""
    path = tmp_path / "repos" / "app"
    hashes = make_repository(path, [{"a.txt": "v0"}, {"a.txt": "v1", "sub/b.txt": "b"}])
    return path, hashes


def git_volume(name: str, repository: str, revision: str = "", directory: str = "") -> str:
    fields = [f"repository: '{repository}'"]
    if revision:
        fields.append(f"revision: '{revision}'")
    if directory:
        fields.append(f"directory: '{directory}'")
    return f"    - {{name: {name}, gitRepo: {{{', '.join(fields)}}}}}"


def meta_dir(agent: AgentProcess, i: int, name: str) -> Path:
    return agent.root / "pods" / uid(i) / "plugins" / "kubernetes.io~git-repo" / name


def test_clone_with_and_without_revision_and_directory(
    tmp_path: Path, repository: tuple[Path, list[str]]
) -> None:
    repo, (first, second) = repository
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    volumes = [
        git_volume("plain", str(repo)),
        git_volume("named", f"file://{repo}", directory="code"),
        git_volume("pinned-root", f"file://{repo}", revision=first, directory="."),
        git_volume("pinned-dir", str(repo), revision=first, directory="code"),
        git_volume("pinned-default", str(repo), revision=first),
    ]
    (manifests / "pod.yaml").write_text(pod(1, "\n".join(volumes)))
    with running_agent(manifests, tmp_path / "root") as agent:
        for name in ("plain", "named", "pinned-root", "pinned-dir", "pinned-default"):
            agent.wait_state(uid(1), name, "mounted", timeout_s=30)
        plain = agent.volume(uid(1), PLUGIN, "plain")
        assert sorted(os.listdir(plain)) == ["app"]
        assert (plain / "app" / "a.txt").read_text() == "v1"
        assert head(plain / "app") == second
        named = agent.volume(uid(1), PLUGIN, "named")
        assert sorted(os.listdir(named)) == ["code"]
        assert (named / "code" / "sub" / "b.txt").read_text() == "b"
        root = agent.volume(uid(1), PLUGIN, "pinned-root")
        assert sorted(os.listdir(root)) == [".git", "a.txt"]
        assert (root / "a.txt").read_text() == "v0"
        assert head(root) == first
        for name, directory in (("pinned-dir", "code"), ("pinned-default", "app")):
            volume = agent.volume(uid(1), PLUGIN, name)
            assert sorted(os.listdir(volume)) == [directory]
            assert (volume / directory / "a.txt").read_text() == "v0"
            assert not (volume / directory / "sub").exists()
            assert head(volume / directory) == first
            assert git(volume / directory, "status", "--porcelain") == ""
        for name in ("plain", "named", "pinned-root", "pinned-dir", "pinned-default"):
            volume = agent.volume(uid(1), PLUGIN, name)
            assert stat.S_IMODE(os.stat(volume).st_mode) == 0o777  # the wrapped emptyDir
            assert (meta_dir(agent, 1, name) / "ready").is_file()
        assert agent.volume_status(uid(1), "plain")["type"] == PLUGIN

        # Torn down with the pod: the clones, the markers, the pod directory.
        (manifests / "pod.yaml").unlink()
        wait_for(lambda: not (agent.root / "pods" / uid(1)).exists(), timeout_s=10)
        assert (repo / "a.txt").read_text() == "v1"  # the source repository is untouched
        agent.stop()


_FAILED = re.compile(r"mount failed volume=kubernetes.io/git-repo/\S+-(\S+) .*retry_in=(\S+)s")


def failures(agent: AgentProcess, name: str) -> list[float]:
    """The retry delays logged for volume `name`'s failed set-ups."""
    found = [m for m in _FAILED.finditer(agent.log_text()) if m[1] == name]
    return [float(m[2]) for m in found]


def assert_nothing_left(agent: AgentProcess, name: str) -> None:
    assert not agent.volume(uid(1), PLUGIN, name).exists()
    assert not meta_dir(agent, 1, name).exists()


def test_failures_carry_gits_message_leave_nothing_and_are_retried(
    tmp_path: Path, repository: tuple[Path, list[str]]
) -> None:
    repo, (first, _) = repository
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    volumes = [
        git_volume("later", str(repo), revision="later"),
        git_volume("missing", str(tmp_path / "nowhere")),
        git_volume("dash", f"--upload-pack=touch {tmp_path}/pwned"),
        git_volume("dash-revision", str(repo), revision="-b"),
        git_volume("deep", str(repo), revision=first, directory="a/b"),
    ]
    (manifests / "pod.yaml").write_text(pod(1, "\n".join(volumes)))
    with running_agent(manifests, tmp_path / "root", expect_log=(" mount failed ",)) as agent:
        wait_for(lambda: failures(agent, "later")[:2] == [0.5, 1.0], timeout_s=10)
        error = str(agent.volume_status(uid(1), "later")["last_error"])
        assert error.startswith("failed to exec 'git checkout later': ")
        assert "error: pathspec 'later' did not match any file(s) known to git" in error
        assert error.endswith("exit status 1")
        for name in ("missing", "dash", "dash-revision", "deep"):
            agent.wait_state(uid(1), name, "failed")
        expected = {
            "missing": f"failed to exec 'git clone -- {tmp_path}/nowhere': fatal: repository "
            f"'{tmp_path}/nowhere' does not exist: exit status 128",
            "dash": f'"--upload-pack=touch {tmp_path}/pwned" is an invalid value for repository',
            "dash-revision": '"-b" is an invalid value for revision',
            "deep": '"a/b" is not a valid directory, it must not contain a directory separator',
        }
        for name, message in expected.items():
            assert agent.volume_status(uid(1), name)["last_error"] == message
        for name in ("later", "missing", "dash", "dash-revision", "deep"):
            assert_nothing_left(agent, name)
        assert not (tmp_path / "pwned").exists()

        # The revision appears: the next retry (kubelet's backoff) clones and checks it out.
        git(repo, "tag", "later", first)
        agent.wait_state(uid(1), "later", "mounted", timeout_s=10)
        assert head(agent.volume(uid(1), PLUGIN, "later") / "app") == first
        agent.stop()


def test_set_up_once_per_pod_and_adopted_after_kill_9(
    tmp_path: Path, repository: tuple[Path, list[str]]
) -> None:
    repo, (_, second) = repository
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    volumes = [git_volume("code", str(repo), directory="."), git_volume("fresh", str(repo))]
    (manifests / "pod.yaml").write_text(pod(1, "\n".join(volumes)))
    root = tmp_path / "root"
    # What an agent killed in the middle of a clone leaves: a directory without `ready`.
    half_done = root / "pods" / uid(1) / "volumes" / "kubernetes.io~git-repo" / "fresh"
    half_done.mkdir(parents=True)
    (half_done / "partial").write_text("")
    with running_agent(manifests, root) as first_agent:
        first_agent.wait_state(uid(1), "code", "mounted", timeout_s=30)
        first_agent.wait_state(uid(1), "fresh", "mounted", timeout_s=30)
        assert sorted(os.listdir(half_done)) == ["app"]  # started over
        code = first_agent.volume(uid(1), PLUGIN, "code")
        (code / "written-by-the-pod").write_text("kept")
        # A change upstream is not pulled: the volume was set up once.
        git(repo, "commit", "-q", "--allow-empty", "-m", "later")
        first_agent.kill()

        with running_agent(manifests, root) as second_agent:
            second_agent.wait_state(uid(1), "code", "mounted", timeout_s=30)
            assert (code / "written-by-the-pod").read_text() == "kept"
            assert head(code) == second
            # Adopted volumes are torn down with their pod like any other.
            (manifests / "pod.yaml").unlink()
            wait_for(lambda: not (root / "pods" / uid(1)).exists(), timeout_s=10)
            second_agent.stop()


def test_fs_group(tmp_path: Path, repository: tuple[Path, list[str]]) -> None:
    repo, (first, _) = repository
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    volumes = [git_volume("pinned", str(repo), revision=first), git_volume("head", str(repo))]
    text = pod(1, "\n".join(volumes))
    text = text.replace("spec:\n", "spec:\n  securityContext: {fsGroup: 4321}\n")
    (manifests / "pod.yaml").write_text(text)
    with running_agent(manifests, tmp_path / "root") as agent:
        agent.wait_state(uid(1), "pinned", "mounted", timeout_s=30)
        agent.wait_state(uid(1), "head", "mounted", timeout_s=30)
        # With a revision: kubelet's ownership walk over everything.
        pinned = agent.volume(uid(1), PLUGIN, "pinned")
        for path in (pinned, pinned / "app", pinned / "app" / ".git"):
            info = os.stat(path)
            assert info.st_gid == 4321
            assert info.st_mode & (stat.S_ISGID | 0o770) == stat.S_ISGID | 0o770, path
        info = os.stat(pinned / "app" / "a.txt")
        assert (info.st_gid, stat.S_IMODE(info.st_mode)) == (4321, 0o664)
        # Without one: only the wrapped emptyDir's root (group, setgid); files inherit the group.
        plain = agent.volume(uid(1), PLUGIN, "head")
        info = os.stat(plain)
        assert (info.st_gid, stat.S_IMODE(info.st_mode)) == (4321, 0o2777)
        info = os.stat(plain / "app" / "a.txt")
        assert (info.st_gid, stat.S_IMODE(info.st_mode)) == (4321, 0o644)
        agent.stop()
