"""Stopping and restarting the agent."""

from __future__ import annotations

import fcntl
import os
import pty
import socket
import struct
import subprocess
import sys
import termios
from typing import TYPE_CHECKING

import pytest

from tests.agent import AgentProcess, mounts_below, running_agent, wait_for
from tests.manifests import POD_UID

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
            wait_for(lambda: (volume / "a").read_text() == "alpha")
            second.stop()


def test_sigterm_hands_over_and_the_next_agent_takes_the_connection_over(
    manifests: Path, tmp_path: Path
) -> None:
    """SIGTERM: `fusevol run` exits at once, its agent serves on as a lame duck (its mount and the
    pod binds answering) until the next agent takes its FUSE connection over: the same mounts
    throughout, nothing stacked (tests/fuse/test_takeover.py has the readers)."""
    root = tmp_path / "root"
    with running_agent(manifests, root) as first:
        volume = first.wait_mounted(first.volume(POD_UID, "configmap", "config"))
        secret = first.wait_mounted(first.volume(POD_UID, "secret", "creds"))
        mounts = sorted(mounts_below(root))
        assert mounts == sorted([str(first.fuse_mountpoint()), str(volume), str(secret)])
        first.hand_over()
        assert sorted(mounts_below(root)) == mounts
        assert first.agent_alive()
        assert (volume / "a").read_text() == "alpha"
        assert len(os.listdir(secret)) == 3  # ..data, ..<version>, token
        with running_agent(manifests, root) as second:
            first.wait_agent_gone(10)
            assert "lame duck done: the next agent took the connection over" in first.log_text()
            assert "FUSE taken over" in second.log_text()
            assert sorted(mounts_below(root)) == mounts
            assert (volume / "a").read_text() == "alpha"
            assert len(os.listdir(secret)) == 3
            second.stop()
        assert mounts_below(root) == []


def test_reads_never_fail_through_a_hand_over(manifests: Path, tmp_path: Path) -> None:
    """A reader in a mount namespace of its own whose copy of the pod volume is a slave (as a
    container's rslave bind) reads in a loop through SIGTERM + start: not one read fails, before
    the lame duck exits or after (through the second agent's bind)."""
    root = tmp_path / "root"
    reads = tmp_path / "reads"
    with running_agent(manifests, root) as first:
        first.wait_state(POD_UID, "config", "mounted")  # its bind made shared: propagation
        volume = first.volume(POD_UID, "configmap", "config")
        # `ls` always reaches the FUSE server (opendir); `cat` may be served from the caches.
        loop = (
            f"while :; do if cat {volume}/a >/dev/null && ls {volume} >/dev/null;"
            f" then echo ok; else echo fail; fi; done >> {reads} 2>> {reads}.errors"
        )
        unshare = ["unshare", "--mount", "--propagation", "slave"]
        reader = subprocess.Popen([*unshare, "sh", "-c", loop])
        try:
            wait_for(lambda: reads.exists() and reads.stat().st_size > 0)
            first.hand_over()
            with running_agent(manifests, root) as second:
                first.wait_agent_gone(5)  # released: the second agent's binds are on top
                released = reads.stat().st_size
                wait_for(lambda: reads.stat().st_size > released + 60)  # 20 reads more
                reader.kill()
                reader.wait(timeout=10)
                second.stop()
        finally:
            reader.kill()
            reader.wait(timeout=10)
    lines = reads.read_text().split()
    after = reads.read_text()[released:].split()
    failed = lines.count("fail")
    assert failed == 0, (
        f"{failed} failed reads of {len(lines)}: " + (tmp_path / "reads.errors").read_text()[:500]
    )
    assert len(after) >= 20


def _teardown(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fusevol", "teardown", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_teardown_after_a_hand_over_and_after_a_crash(manifests: Path, tmp_path: Path) -> None:
    """`fusevol teardown` does what SIGINT's stop does, on a root no agent runs on: after a
    hand-over (the lame duck's binds, live; the lame duck exits) and after a crash (dead binds,
    a dead FUSE mount)."""
    root = tmp_path / "root"
    for stop in ("hand_over", "kill"):
        with running_agent(manifests, root) as agent:
            agent.wait_state(POD_UID, "config", "mounted")
            agent.wait_state(POD_UID, "creds", "mounted")
            getattr(agent, stop)()
            assert mounts_below(root)
            result = _teardown(root)
            assert result.returncode == 0, result.stderr
            assert mounts_below(root) == [], stop
            assert not (root / "pods" / POD_UID).exists()
            agent.wait_agent_gone(5)  # a lame duck is let go


def test_teardown_is_refused_while_an_agent_runs(agent: AgentProcess) -> None:
    result = _teardown(agent.root)
    assert result.returncode == 1
    assert "another fusevol agent is using" in result.stderr
    assert (agent.volume(POD_UID, "configmap", "config") / "a").read_text() == "alpha"


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


def test_systemd_hears_the_agent_and_never_the_lame_duck(manifests: Path, tmp_path: Path) -> None:
    """Under systemd (NotifyAccess=all, a watchdog) the agent, the launcher's child, sends READY=1
    and WATCHDOG=1; once it has handed over, nothing more comes from it, although it still runs:
    a lame duck must not feed the next agent's watchdog."""
    address = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(address)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        sock.settimeout(5)
        env = {"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "100000", "WATCHDOG_PID": "1"}
        with running_agent(manifests, tmp_path / "root", env=env) as first:
            heard = _messages_until(sock, b"READY=1")
            assert {pid for pid, _ in heard} == {first.pid}  # not the launcher's
            assert (first.pid, b"WATCHDOG=1") in _messages_until(sock, b"WATCHDOG=1")
            first.hand_over()
            assert (first.pid, b"STOPPING=1") in _messages_until(sock, b"STOPPING=1")
            assert first.agent_alive()
            sock.settimeout(0.5)  # five watchdog periods
            with pytest.raises(TimeoutError):
                _messages_until(sock, b"never")
            assert first.agent_alive()


def _messages_until(sock: socket.socket, last: bytes) -> list[tuple[int, bytes]]:
    """(sender pid, message) of the datagrams received up to one equal to `last`."""
    heard = []
    size = socket.CMSG_SPACE(struct.calcsize("3i"))
    while True:
        message, ancillary, _, _ = sock.recvmsg(256, size)
        pid = next(
            struct.unpack("3i", data)[0]
            for level, kind, data in ancillary
            if (level, kind) == (socket.SOL_SOCKET, socket.SCM_CREDENTIALS)
        )
        heard.append((pid, message))
        if message == last:
            return heard


def test_ctrl_c_on_a_terminal_tears_down_once(manifests: Path, tmp_path: Path) -> None:
    """The demo's Ctrl-C: the terminal sends SIGINT to its foreground process group, the
    launcher's, which forwards it to the agent (its child, in a group of its own); the agent
    tears everything down and `fusevol run` exits 0."""
    root = tmp_path / "root"
    log_path = tmp_path / "agent.log"
    master, slave = pty.openpty()

    def controlling_terminal() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    argv = [sys.executable, "-m", "fusevol", "run", "--manifests", str(manifests)]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [*argv, "--root", str(root), "--node-name", "test-node", "--http-port", "-1"],
            stdin=slave,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=controlling_terminal,
        )
    os.close(slave)
    try:
        volume = root / "pods" / POD_UID / "volumes" / "kubernetes.io~configmap" / "config"
        wait_for(lambda: (volume / "a").read_text() == "alpha", timeout_s=20)
        os.write(master, b"\x03")  # Ctrl-C
        assert process.wait(timeout=60) == 0, log_path.read_text()
    finally:
        if process.poll() is None:
            process.kill()
        os.close(master)
    text = log_path.read_text()
    assert text.count("stopping on SIGINT: tear down") == 1, text
    assert "SIGINT: no more waiting" not in text  # not a second SIGINT
    assert mounts_below(root) == []
    assert not (root / "pods" / POD_UID).exists()
