"""The agent lock (`fusevol.agent.lock.AgentLock`): exactly one agent per root, and a successor
waits for an agent that is handing over instead of being refused."""

from __future__ import annotations

import fcntl
import os
import threading
from typing import TYPE_CHECKING

import pytest

from fusevol.agent.lock import AgentAlreadyRunning, AgentLock
from fusevol.mount.linux import LinuxMountBackend

if TYPE_CHECKING:
    from pathlib import Path


def _hold(path: Path, content: str) -> int:
    """Lock `path` on an open file of our own (flock conflicts between open files, even in one
    process) and write `content` in it, as a running agent does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.pwrite(fd, content.encode(), 0)
    return fd


async def test_a_live_agent_is_refused_at_once(tmp_path: Path) -> None:
    path = tmp_path / "fusevol" / "lock"
    fd = _hold(path, f"{os.getpid()}\n")
    try:
        backend = LinuxMountBackend(command_timeout_s=5, systemd_run=False)
        with pytest.raises(AgentAlreadyRunning, match=f"pid {os.getpid()}"):
            await AgentLock.acquire(tmp_path, backend)
    finally:
        os.close(fd)


async def test_an_agent_handing_over_is_waited_for(tmp_path: Path) -> None:
    path = tmp_path / "fusevol" / "lock"
    fd = _hold(path, f"{os.getpid()} handing-over\n")
    timer = threading.Timer(0.2, os.close, [fd])  # the lame duck lets go
    timer.start()
    try:
        backend = LinuxMountBackend(command_timeout_s=5, systemd_run=False)
        lock = await AgentLock.acquire(tmp_path, backend)
        assert path.read_text() == f"{os.getpid()}\n"
        lock.mark_handing_over()
        assert path.read_text() == f"{os.getpid()} handing-over\n"
        lock.release()
        lock.release()
    finally:
        timer.join()
