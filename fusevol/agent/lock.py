"""The agent lock, `<root>/fusevol/lock`: exactly one agent reconciles a root at a time.

The lock is an flock on the file, which holds the holder's pid, and `<pid> handing-over` while
the holder lets go (`AgentLock.mark_handing_over`). A successor started meanwhile waits for it
instead of being refused; so does one whose predecessor was killed and is still dying. A live
agent that is not letting go is refused at once (`AgentAlreadyRunning`, naming its pid).
A lame duck (fusevol.agent.handover) holds no lock: it changes nothing, it only answers reads.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import time
from typing import TYPE_CHECKING

import trio

from fusevol.base.errors import FusevolError
from fusevol.node import layout

if TYPE_CHECKING:
    from pathlib import Path

    from fusevol.mount.backend import MountBackend

log = logging.getLogger(__name__)

HANDING_OVER = "handing-over"
LOCK_WAIT_S = 10.0
"""How long a new agent waits for a dying predecessor (killed, not yet gone) to release the lock."""


class AgentAlreadyRunning(FusevolError):
    """Another agent holds the lock on the same root."""


class AgentLock:
    """An exclusive lock on `<root>/fusevol/lock` with our pid written in it.

    A predecessor that was killed may still hold it for a moment while it dies; one stuck on a
    request to its own FUSE mount would hold it forever, so its connection is aborted (which
    frees it) and the lock waited for, up to LOCK_WAIT_S, as it is for an agent that is handing
    over. A live agent is refused at once."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    @classmethod
    async def acquire(cls, root: Path, backend: MountBackend) -> AgentLock:
        """Take the lock of `root`, waiting for a predecessor that is letting go or dying."""
        path = layout.lock_file(root)
        layout.make_root(root)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            deadline = time.monotonic() + LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    holder, handing_over = read_holder(fd)
                    waiting = handing_over or _is_dying(holder)
                    if not waiting or time.monotonic() > deadline:
                        raise AgentAlreadyRunning(
                            f"another fusevol agent is using {path}"
                            + (f" (pid {holder})" if holder else "")
                        ) from None
                    log.info("waiting for the previous agent to let go pid=%s", holder)
                    if not handing_over:  # killed: free it if it is stuck on its own mount
                        await backend.unmount(layout.fuse_mountpoint(root), force=True)
                    # Polled: the kernel tells no one when an flock is released, and a blocking
                    # flock(2) in a worker thread could not be cancelled at the deadline.
                    await trio.sleep(0.05)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd)

    def mark_handing_over(self) -> None:
        """Say in the lock file that we are letting go: a successor started meanwhile waits for
        the lock instead of being refused."""
        if self._fd is not None:
            os.pwrite(self._fd, f"{os.getpid()} {HANDING_OVER}\n".encode(), 0)

    def release(self) -> None:
        """Release the lock (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_holder(fd: int) -> tuple[int | None, bool]:
    """(the lock holder's pid, whether it is handing over) from the open lock file `fd`."""
    pid, _, state = os.pread(fd, 64, 0).decode(errors="replace").strip().partition(" ")
    return (int(pid) if pid.isdigit() else None), state == HANDING_OVER


def _is_dying(pid: int | None) -> bool:
    """True if process `pid` is gone, a zombie, or has SIGKILL pending (/proc/PID/status)."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":\t", 1) for line in f if ":\t" in line)
    except (FileNotFoundError, ProcessLookupError):
        return True
    if fields.get("State", "").startswith(("Z", "X")):
        return True
    sigkill = 1 << (signal.SIGKILL - 1)
    return any(int(fields.get(k, "0"), 16) & sigkill for k in ("SigPnd", "ShdPnd"))
