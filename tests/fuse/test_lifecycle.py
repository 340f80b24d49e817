"""Stopping and restarting the agent."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING

from tests.agent import AgentProcess, mounts_below, running_agent, wait_for
from tests.fuse.conftest import POD_UID

if TYPE_CHECKING:
    from pathlib import Path


def test_sigint_unmounts_everything(agent: AgentProcess) -> None:
    assert len(mounts_below(agent.root)) == 3  # the FUSE mount and two pod volumes
    agent.stop()
    assert mounts_below(agent.root) == []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        assert str(agent.root) not in f.read()
    assert not (agent.root / "pods" / POD_UID).exists()


def test_restart_after_kill_serves_again(manifests: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    with running_agent(manifests, root) as first:
        volume = first.wait_mounted(first.volume(POD_UID, "configmap", "config"))
        first.kill()
        assert mounts_below(root)  # dead mounts stay behind a kill -9
        with running_agent(manifests, root) as second:
            wait_for(lambda: (volume / "a").read_text() == "1")
            second.stop()


def test_sigterm_hands_over_and_the_next_agent_stacks_on_the_old_binds(
    manifests: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    with running_agent(manifests, root) as first:
        volume = first.wait_mounted(first.volume(POD_UID, "configmap", "config"))
        secret = first.wait_mounted(first.volume(POD_UID, "secret", "creds"))
        first.hand_over()
        # The pod volumes stay (dead now: their server is gone); the agent's own mount does not.
        assert sorted(mounts_below(root)) == sorted([str(volume), str(secret)])
        with running_agent(manifests, root) as second:
            wait_for(lambda: (volume / "a").read_text() == "1")
            wait_for(lambda: len(os.listdir(secret)) == 3)  # ..data, ..<version>, token
            # One new bind on each old one, and the new FUSE mount.
            assert sorted(mounts_below(root)) == sorted(
                [str(second.fuse_mountpoint()), *[str(volume)] * 2, *[str(secret)] * 2]
            )
            second.stop()  # tears the whole stack down
        assert mounts_below(root) == []


def test_second_agent_on_the_same_root_is_refused(agent: AgentProcess) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fusevol",
            "run",
            "--manifests",
            str(agent.manifests),
            "--root",
            str(agent.root),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert "another fusevol agent is using" in result.stderr
    assert (agent.volume(POD_UID, "configmap", "config") / "a").read_text() == "1"


def test_status_lists_pods_and_volumes(agent: AgentProcess) -> None:
    text = agent.status()
    assert f"pod default/web uid={POD_UID}" in text
    assert "config" in text
    assert "configmap" in text
    assert "mounted" in text
    assert "creds" in text
    assert "secret" in text
    assert "configmap default/app@" in text
    assert "secret default/creds@" in text
    assert "updated " in text
    volume = agent.volume_status(POD_UID, "config")
    assert list(volume["objects"]) == ["configmap default/app"]  # type: ignore[call-overload]
    assert isinstance(volume["updated_at"], float)
