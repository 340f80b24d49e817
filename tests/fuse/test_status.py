"""`fusevol status` tells whether an agent runs, and without one shows the mount table, not the
last agent's snapshot. Through the real CLI, on real agents."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TYPE_CHECKING, Any

from tests.agent import running_agent
from tests.manifests import POD_UID

if TYPE_CHECKING:
    from pathlib import Path

    from tests.agent import AgentProcess

CONFIG = f"pods/{POD_UID}/volumes/kubernetes.io~configmap/config"
CREDS = f"pods/{POD_UID}/volumes/kubernetes.io~secret/creds"


def status(root: Path, *args: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "fusevol", "status", "--root", str(root), *args],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout


def status_json(root: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(status(root, "--json"))
    return data


def test_a_running_agent_is_named_and_its_snapshot_shown(agent: AgentProcess) -> None:
    text = status(agent.root)
    assert text.startswith(f"agent running pid={agent.pid} ")
    assert f"pod default/web uid={POD_UID}" in text
    data = status_json(agent.root)
    assert data["agent"] == {"running": True, "pid": agent.pid, "lame_duck": False}
    assert [pod["uid"] for pod in data["pods"]] == [POD_UID]
    assert {m["path"] for m in data["mounts"]} >= {CONFIG, CREDS, "fusevol/mnt"}


def test_after_a_crash_no_agent_runs_and_the_mount_table_is_shown(
    manifests: Path, tmp_path: Path
) -> None:
    with running_agent(manifests, tmp_path / "root") as agent:
        agent.wait_state(POD_UID, "config", "mounted")
        agent.wait_state(POD_UID, "creds", "mounted")
        agent.kill()
        text = status(agent.root)
        lines = text.splitlines()
        assert lines[0].startswith(f"no agent runs on {agent.root} (the last agent's status")
        assert not any(line.split()[:1] in (["config"], ["creds"]) for line in lines)  # stale
        assert "pod default/web" not in text
        assert f"still mounted below {agent.root} (from /proc/self/mountinfo):" in lines
        shown = {line.split()[0] for line in lines if line.startswith("  ")}
        assert shown == {"fusevol/mnt", CONFIG, CREDS}
        assert f"`fusevol teardown --root {agent.root}`" in lines[-1]
        data = status_json(agent.root)
        assert data["agent"] == {"running": False, "pid": None, "lame_duck": False}
        assert data["pods"] == []
        assert {m["path"] for m in data["mounts"]} == {"fusevol/mnt", CONFIG, CREDS}


def test_a_lame_duck_is_named_and_a_clean_stop_leaves_nothing_mounted(
    manifests: Path, tmp_path: Path
) -> None:
    with running_agent(manifests, tmp_path / "root") as agent:
        agent.wait_state(POD_UID, "config", "mounted")
        agent.hand_over()
        text = status(agent.root)
        assert text.startswith(f"no agent runs on {agent.root}")
        assert f"a lame duck (pid {agent.pid}) still serves" in text
        assert CONFIG in text
        assert "fusevol teardown" not in text
    with running_agent(manifests, tmp_path / "root") as agent:
        agent.wait_state(POD_UID, "config", "mounted")
        agent.stop()
        text = status(agent.root)
        assert f"nothing is mounted below {agent.root}" in text.splitlines()


def test_a_closed_pipe_ends_status_quietly(agent: AgentProcess) -> None:
    """`fusevol status --json | head -1`: the reader is gone before the first write."""
    process = subprocess.Popen(
        [sys.executable, "-m", "fusevol", "status", "--json", "--root", str(agent.root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    process.stdout.close()
    _, stderr = process.communicate(timeout=30)
    assert stderr == b""
    assert process.returncode == -13  # SIGPIPE, as for a C tool


def test_a_root_that_does_not_exist_is_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fusevol", "status", "--root", str(tmp_path / "nothing")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr == f"fusevol: --root {tmp_path / 'nothing'}: no such directory " + (
        "(is this the agent's root?)\n"
    )
