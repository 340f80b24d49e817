"""`fusevol run`'s main process: a thin launcher that runs the agent as its child, and keeps the
agent's FUSE connection alive across the agent's death.

Why: no read in a container may fail when the agent restarts. A FUSE connection lives as long as
some process holds a descriptor of `/dev/fuse`; while it lives, readers wait instead of failing.
So once the kernel's INIT has been answered, the agent sends the launcher a duplicate of that
descriptor and of the memfd holding its served tree (`fusevol.fuse.snapshot`), over their
socketpair (SCM_RIGHTS). Whoever stops the service (systemd, a test) waits for the *main*
process to exit; the launcher is that process.

- The child killed (kill -9, OOM, a fatal signal) while the launcher holds its connection: the
  launcher forks a new child at once, which takes the connection over (`FUSEVOL_TAKE_OVER`: the
  two descriptors it inherits) and answers for everything its predecessor served; readers pause,
  none fails. A child that dies before it has taken the connection over (sent it back) is a
  failed restart: after `RESTARTS` failed restarts in a row, the launcher exits as below.
- SIGTERM: forwarded; the child stops reconciling, releases the agent lock and writes `LAME_DUCK`
  on the launcher's socket; the launcher exits 0 at once, the child serves on alone
  (`fusevol.agent.handover`).
- A successor asks the child for its connection (a rollout: `fusevol.agent.handover`): the
  child hands it over and writes `RETIRED`; the launcher stays, doing nothing, until it is
  stopped (SIGTERM or SIGINT, then exit 0), so that nothing restarts an agent in the old
  generation (a container whose main process exits is restarted).
- SIGINT (Ctrl-C, the tear-down): forwarded; the launcher waits for the child and exits
  with its status. The child has a process group of its own, so a terminal's Ctrl-C reaches it
  once.
- SIGKILL of the launcher (a crash): the child asked for SIGKILL at its parent's death
  (PR_SET_PDEATHSIG), so the whole agent dies as before, and the connection with it, unless
  systemd keeps it: the agent also puts both descriptors in the unit's file descriptor store
  (`fusevol.agent.sdnotify.store_fds`, names `FDNAME_FUSE`, `FDNAME_STATE`), and systemd hands them
  to the next start (`$LISTEN_FDS`), whose first child takes them over. The child drops its
  SIGKILL request only when it becomes a lame duck.
- The child's exit (an error, a refused lock): the launcher exits with its status.

It runs nothing of the agent (no trio loop, no threads), but `fusevol.cli` has imported the
agent's modules before the first fork, so that a child forked after a crash serves again within
a fraction of a second instead of spending one or two seconds on imports first (readers wait
meanwhile). `Launcher` is the child's end of the link.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sys
from typing import TYPE_CHECKING

from fusevol.agent import peers

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path
    from types import FrameType

LAUNCHER_FD_ENV = "FUSEVOL_LAUNCHER_FD"
"""Set by the launcher in its child's environment: the socket on which the child says `LAME_DUCK`
or sends `CONNECTION` with its descriptors."""
TAKE_OVER_ENV = "FUSEVOL_TAKE_OVER"
"""`<fuse fd>,<state fd>`: the connection a restarted child takes over (descriptors it inherits)."""
FDNAME_FUSE = "fusevol-fuse"
FDNAME_STATE = "fusevol-state"
"""Names of the two descriptors in systemd's file descriptor store."""
LAME_DUCK = b"L"
RETIRED = b"R"
"""The child handed its connection to a successor that asked for it (a rollout): the launcher
stays, doing nothing, until it is stopped."""
TAKE_OVER = b"take-over\n"
"""What the next launcher sends a lame duck to take its connection over
(`fusevol.agent.handover`); also the answer, with the descriptors, of `fusevol hold` and of an
agent of a version that stops before it sends them."""
ROLL_OVER = b"roll-over\n"
"""What `fusevol run --replace` sends instead: a serving agent hands over only on this (a
rollout), a lame duck on either."""
OFFER = b"offer\n"
TAKEN = b"taken\n"
GO = b"go\n"
"""The transfer, in two phases, so that a successor that dies halfway costs nothing: the agent
answers the request with `OFFER` and duplicates of its descriptors while it still serves; the
successor, holding them, says `TAKEN`; only then does the agent stop reading `/dev/fuse`, and
says `GO`. An agent that gets no `TAKEN` serves on. (A successor of an older version, which
knows no `OFFER`, takes nothing: it closes what it got.)"""
GO_TIMEOUT_S = 60.0
"""How long a successor waits for `GO` after `TAKEN`: the serving agent's whole stop (the
reconciler's operations in flight) comes first."""
CONNECTION = b"C"
RESTARTS = 5
_PR_SET_PDEATHSIG = 1


class Launcher:
    """The child's side of the link to its launcher (`launch`)."""

    def __init__(self, fd: int, *, take_over: tuple[int, int] | None = None) -> None:
        self._fd = fd
        self.take_over = take_over
        """(fuse fd, state memfd) of the connection to take over, if the launcher restarted us."""

    @classmethod
    def from_environment(cls) -> Launcher | None:
        """The launcher of this process, if it was launched by one."""
        value = os.environ.pop(LAUNCHER_FD_ENV, "")
        take_over = os.environ.pop(TAKE_OVER_ENV, "")
        if not value.isdigit():
            return None
        os.set_inheritable(int(value), False)  # not for mount helpers or publisher helpers
        fds = tuple(int(fd) for fd in take_over.split(",") if fd.isdigit())
        for fd in fds:
            os.set_inheritable(fd, False)
        return cls(int(value), take_over=(fds[0], fds[1]) if len(fds) == 2 else None)

    def hold(self, fuse_fd: int, state_fd: int) -> None:
        """Have the launcher keep duplicates of our FUSE connection and state memfd: they then
        outlive us, and a restarted agent takes them over."""
        with contextlib.suppress(OSError), socket.socket(fileno=os.dup(self._fd)) as sock:
            socket.send_fds(sock, [CONNECTION], [fuse_fd, state_fd])

    def detach(self, *, retire: bool = False) -> None:
        """Outlive the launcher: drop the SIGKILL it asked for at its death (a kill -9 of the
        launcher is a crash of the agent), then tell it that it may exit, or with `retire` (our
        successor asked for the connection: a rollout) that it stays until it is stopped."""
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, 0, 0, 0, 0)
        # Never again a notification to systemd from this process: the next agent is the service.
        os.environ.pop("NOTIFY_SOCKET", None)
        with contextlib.suppress(OSError):
            os.write(self._fd, RETIRED if retire else LAME_DUCK)
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


class _Held:
    """The connection the launcher keeps for the next child: (fuse fd, state fd), or none."""

    def __init__(self) -> None:
        self.fds: tuple[int, int] | None = None
        self.fresh = False
        """Sent by the current child: it serves the connection (a restart that worked)."""

    def replace(self, fds: list[int]) -> None:
        self.close()
        if len(fds) == 2:
            self.fds = (fds[0], fds[1])
            self.fresh = True
        else:
            for fd in fds:
                os.close(fd)

    def close(self) -> None:
        for fd in self.fds or ():
            os.close(fd)
        self.fds = None


def launch(
    handover_socket: Path | None = None,
    *,
    holder_socket: Path | None = None,
    replace: bool = False,
) -> int | None:
    """Fork the agent. Returns None in the child, which goes on to run the agent (`fusevol.cli`),
    and the exit status for `fusevol run` in the launcher, once it may exit.

    A lame duck listening at `handover_socket` (an upgrade-restart), or with `replace` an agent
    serving there (a rollout), is asked for its connection first (whoever still serves must stop
    before anyone else serves); else the connection systemd kept in its file descriptor store, if
    any (`$LISTEN_FDS`); else the one `fusevol hold` keeps at `holder_socket`, if any (the
    previous agent's pod is gone: `fusevol.agent.holder`). The first child then takes it over as
    after a crash.

    A fork, not a new interpreter: a crash-restart waits for the agent's start-up, and the
    launcher has parsed the arguments and imported the agent, but started nothing of it."""
    held = _Held()
    try:
        _find_connection(held, handover_socket, holder_socket, replace=replace)
    except HandOverStuck as exc:
        _say(str(exc))
        return 1
    held.fresh = False  # until our first child has taken it over
    stopping = False
    failed_restarts = 0
    child = 0

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    while True:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        child = _fork(theirs, held.fds)
        if child == 0:
            ours.close()
            return None
        theirs.close()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, forward)
        with ours:
            status = _wait(ours, child, held)
        if status is None:  # a lame duck serves on alone
            held.close()
            return 0
        if status == _RETIRED:
            held.close()
            return _retire(lambda: stopping)
        failed_restarts = 0 if held.fresh else failed_restarts + 1
        held.fresh = False
        killed = os.WIFSIGNALED(status)
        if stopping or not killed or held.fds is None or failed_restarts >= RESTARTS:
            held.close()
            return _status(status)
        print(
            f"fusevol: the agent was killed by {signal.Signals(os.WTERMSIG(status)).name}:"
            " a new one takes its FUSE connection over",
            file=sys.stderr,
            flush=True,
        )


class HandOverStuck(Exception):
    """The agent we asked took `TAKEN` but never said `GO`, nor ended: it may still read
    `/dev/fuse`, so nothing else (systemd's store, the holder) may be taken over either."""


def _find_connection(
    held: _Held, handover_socket: Path | None, holder_socket: Path | None, *, replace: bool
) -> None:
    """The connection to take over, in `held`, if anybody keeps one (`launch`)."""
    request = ROLL_OVER if replace else TAKE_OVER
    if handover_socket is not None and (fds := take_over_from(handover_socket, request)):
        held.replace(list(fds))
        _close_all(_listen_fds())  # the same connection: the lame duck's is the one to take
        return
    held.replace(_listen_fds())
    if held.fds is not None or holder_socket is None:
        return
    if fds := take_over_from(holder_socket, timeout_s=5.0):
        held.replace(list(fds))
        _say("taking over the FUSE connection that fusevol hold kept")


def take_over_from(
    path: Path, request: bytes = TAKE_OVER, *, timeout_s: float = 20.0
) -> tuple[int, int] | None:
    """Ask the agent, lame duck or holder at `path` for its FUSE connection: (fuse fd, state fd),
    or None if there is nobody there or nothing to take (said in one line on stderr when the
    peer answered something else). A lame duck of a version without takeover does not answer:
    `timeout_s` later the next agent stacks its binds, the old way."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(str(path))
            if peers.refuse_unless_root(sock, who=f"the server of {path}"):
                return None
            sock.sendall(request)
            message, fds, _, _ = socket.recv_fds(sock, 64, 2)
        except OSError:
            return None
        if len(fds) == 2 and message == TAKE_OVER:  # one phase: the peer does not read it
            return fds[0], fds[1]
        if len(fds) == 2 and message == OFFER:
            return _take_offered(sock, path, (fds[0], fds[1]))
    _close_all(fds)
    if message:
        _say(f"{path} answered {len(message)} bytes that are no FUSE connection: starting without")
    return None


def _take_offered(sock: socket.socket, path: Path, fds: tuple[int, int]) -> tuple[int, int]:
    """Say `TAKEN` for the descriptors offered, and wait for `GO`: the agent stopped reading
    `/dev/fuse`. One that ends instead (its connection closed without `GO`) cannot read it any
    more either: the connection is ours, and the line on stderr says why."""
    try:
        sock.sendall(TAKEN)
        sock.settimeout(GO_TIMEOUT_S)
        answer = sock.recv(64)
    except TimeoutError:
        _close_all(list(fds))
        raise HandOverStuck(
            f"the agent at {path} offered its FUSE connection but did not let go of it within"
            f" {GO_TIMEOUT_S:.0f} s"
        ) from None
    except OSError:
        answer = b""
    if answer != GO:
        _say(f"the agent at {path} ended before it let go of the FUSE connection: taking it over")
    return fds


def _say(line: str) -> None:
    print(f"fusevol: {line}", file=sys.stderr, flush=True)


def _listen_fds() -> list[int]:
    """(fuse fd, state fd) from systemd's file descriptor store, given to this process at start
    (sd_listen_fds_with_names: `$LISTEN_PID`, `$LISTEN_FDS` from fd 3, `$LISTEN_FDNAMES`), or []."""
    pid = os.environ.pop("LISTEN_PID", "")
    count = os.environ.pop("LISTEN_FDS", "")
    names = os.environ.pop("LISTEN_FDNAMES", "").split(":")
    if pid != str(os.getpid()) or not count.isdigit():
        return []
    named = dict(zip(names, range(3, 3 + int(count)), strict=False))
    for fd in range(3, 3 + int(count)):
        os.set_inheritable(fd, False)  # for our children only through FUSEVOL_TAKE_OVER
    wanted = [named.get(FDNAME_FUSE), named.get(FDNAME_STATE)]
    _close_all([fd for fd in range(3, 3 + int(count)) if fd not in wanted])
    return [fd for fd in wanted if fd is not None] if None not in wanted else []


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _fork(theirs: socket.socket, held: tuple[int, int] | None) -> int:
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    os.setpgid(0, 0)  # a terminal's Ctrl-C reaches the launcher, which forwards it once
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the launcher died before prctl took effect
        os._exit(1)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_DFL)
    os.environ[LAUNCHER_FD_ENV] = str(theirs.detach())
    if held is not None:
        os.environ[TAKE_OVER_ENV] = f"{held[0]},{held[1]}"
    # systemd's watchdog: the child pings (NotifyAccess=all); WATCHDOG_PID names the launcher.
    os.environ.pop("WATCHDOG_PID", None)
    return 0


_RETIRED = -1
"""`_wait`'s answer for a child that handed its connection to a successor that asked for it."""


def _retire(stopped: Callable[[], bool]) -> int:
    """Stay until stopped (SIGTERM, SIGINT): a rollout's old generation, whose successor serves
    now. Exiting would have its pod's container restarted, and that new agent would take the
    connection back. Its child exits by itself once the successor holds the connection."""
    print(
        "fusevol: the next agent took the FUSE connection over; this one is retired and waits to"
        " be stopped",
        file=sys.stderr,
        flush=True,
    )
    while not stopped():
        signal.pause()
    return 0


def _wait(sock: socket.socket, child: int, held: _Held) -> int | None:
    """Serve the child's messages until it exits (its wait status), becomes a lame duck (None)
    or retires (`_RETIRED`)."""
    while True:
        message, fds, _, _ = socket.recv_fds(sock, 16, 2)  # retried after a signal (PEP 475)
        if message == LAME_DUCK:
            return None
        if message == RETIRED:
            return _RETIRED
        if message == CONNECTION:
            held.replace(fds)
            continue
        for fd in fds:
            os.close(fd)
        if not message:  # the child exited
            return os.waitpid(child, 0)[1]


def _status(wait_status: int) -> int:
    code = os.waitstatus_to_exitcode(wait_status)
    return 128 - code if code < 0 else code  # killed by signal N: 128 + N
