"""`fusevol run`'s main process: a thin launcher that runs the agent as its child.

Why: an upgrade-restart (SIGTERM, then a new start) must not fail a single read in a container,
so the stopping agent keeps answering FUSE until its successor has stacked its binds
(`fusevol.handover`). Whoever stops the service (systemd, a test) waits for the *main* process
to exit; the launcher is that process, and the agent that outlives it is its child.

- SIGTERM: forwarded; the child stops reconciling, releases the agent lock and writes `LAME_DUCK`
  on the launcher's pipe; the launcher exits 0 at once, the child serves on alone.
- SIGINT (Ctrl-C, the tear-down): forwarded; the launcher waits for the child and exits
  with its status. The child has a process group of its own, so a terminal's Ctrl-C reaches it
  once.
- SIGKILL of the launcher (a crash): the child asked for SIGKILL at its parent's death
  (PR_SET_PDEATHSIG), so the whole agent dies as before; it drops that request only when it
  becomes a lame duck.
- The child's exit (an error, a refused lock): the launcher exits with its status.

It imports nothing of the agent (no trio, no pyfuse3): a crash-restart waits for its start-up.
`Launcher` is the child's end of the link.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import FrameType

LAUNCHER_FD_ENV = "FUSEVOL_LAUNCHER_FD"
"""Set by the launcher in its child's environment: the pipe on which the child says `LAME_DUCK`."""
LAME_DUCK = b"L"
_PR_SET_PDEATHSIG = 1


class Launcher:
    """The child's side of the link to its launcher (`launch`)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @classmethod
    def from_environment(cls) -> Launcher | None:
        """The launcher of this process, if it was launched by one."""
        value = os.environ.pop(LAUNCHER_FD_ENV, "")
        if not value.isdigit():
            return None
        os.set_inheritable(int(value), False)  # not for mount helpers or publisher helpers
        return cls(int(value))

    def detach(self) -> None:
        """Outlive the launcher: drop the SIGKILL it asked for at its death (a kill -9 of the
        launcher is a crash of the agent), then tell it that it may exit."""
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, 0, 0, 0, 0)
        # Never again a notification to systemd from this process: the next agent is the service.
        os.environ.pop("NOTIFY_SOCKET", None)
        with contextlib.suppress(OSError):
            os.write(self._fd, LAME_DUCK)
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def launch() -> int | None:
    """Fork the agent. Returns None in the child, which goes on to run the agent (`fusevol.cli`),
    and the exit status for `fusevol run` in the launcher, once it may exit.

    A fork, not a new interpreter: a crash-restart waits for the agent's start-up, and the
    launcher has parsed the arguments and imported nothing heavy (no trio, no threads yet)."""
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        os.setpgid(0, 0)  # a terminal's Ctrl-C reaches the launcher, which forwards it once
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os._exit(1)
        os.environ[LAUNCHER_FD_ENV] = str(write_fd)
        # systemd's watchdog: the child pings (NotifyAccess=all); WATCHDOG_PID names the launcher.
        os.environ.pop("WATCHDOG_PID", None)
        return None
    os.close(write_fd)

    def forward(signum: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    while True:
        message = os.read(read_fd, 1)  # retried after a signal handler ran (PEP 475)
        if message == LAME_DUCK:
            return 0
        if not message:  # the child exited
            return _status(os.waitpid(pid, 0)[1])


def _status(wait_status: int) -> int:
    code = os.waitstatus_to_exitcode(wait_status)
    return 128 - code if code < 0 else code  # killed by signal N: 128 + N
