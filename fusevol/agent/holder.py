"""`fusevol hold`: keeps a duplicate of the agent's FUSE connection outside the agent's pod, so
that a deleted, evicted or OOM-killed agent pod costs the node's readers a pause, never a frozen
or dead volume.

Within one `fusevol run` the launcher keeps the connection across the agent's death
(`fusevol.agent.launcher`); under systemd, the unit's file descriptor store keeps it across the
launcher's. In a cluster the launcher dies with its pod, so the holder is that file descriptor
store for a DaemonSet: a process in a pod of its own (the chart's `fusevol-holder`, updated only
when deleted: `updateStrategy: OnDelete`) that holds the two descriptors the launcher holds, the
`/dev/fuse` descriptor and the state memfd, and gives duplicates to the next agent's launcher. While
any process holds a `/dev/fuse` descriptor the connection lives: readers wait instead of failing,
and the next agent takes the connection over and answers them (FUSE_NOTIFY_RESEND).

The holder does nothing else: it never reads `/dev/fuse`, never mounts, imports nothing of the
agent but this module, the peers' check, the layout and the mount table's reader, and runs no
event loop but one epoll set. In the chart it also answers kubelet's plugin registration of the
CSI driver (`--csi-endpoint`): kubelet registers a driver again whenever its registration socket
is made anew, and the holder, unlike the agent, lives through rollouts (`fusevol.csi.registration`).

Protocol, on `layout.holder_socket(root)` (a unix stream socket, mode 0600 whatever the umask;
a client that is not root is refused, and the agent and the launcher talk to a holder run by root
only: `fusevol.agent.peers`):
- the agent sends `HOLD` with its two descriptors (SCM_RIGHTS) once it serves a connection, and
  again after every takeover; the holder keeps them, replacing what it held;
- a starting launcher sends `TAKE_OVER` (as to a lame duck) and receives `TAKE_OVER` with
  duplicates of the held descriptors, or a closed connection if it holds none;
- a holder that starts while an agent serves asks it on the hand-over socket (`HOLDER`), and the
  agent answers `HOLD` with its descriptors (`fusevol.agent.handover.hear_successors`).
The holder keeps a connection only while it is the agent's: mounted at the agent's FUSE
mountpoint (`layout.fuse_mountpoint`; the chart's holder container sees it there, HostToContainer)
and not ended by the kernel. It lets go once either stops: when the mount table changes
(/proc/self/mountinfo polls EPOLLPRI) and that mount is gone from the mountpoint (the agent tore
its volumes down), or when `/dev/fuse` polls EPOLLERR (the kernel ended the connection). A
tear-down is the first: the kernel ends a connection only once no mount namespace has a mount of
it left, and a process that copied the node's mount table into a namespace of its own (`unshare
--mount`, a build step, a container whose host path is private) keeps a copy of the FUSE mount
that no tear-down reaches. Held on for such a copy, the connection would be served by nobody, and
handed to the next agent, which would serve a connection mounted nowhere instead of mounting one.
"""

from __future__ import annotations

import array
import contextlib
import logging
import os
import select
import signal
import socket
from typing import TYPE_CHECKING, NoReturn

from fusevol.agent import peers
from fusevol.agent.launcher import TAKE_OVER
from fusevol.mount import mountinfo
from fusevol.node import layout

if TYPE_CHECKING:
    from pathlib import Path
    from types import FrameType

log = logging.getLogger(__name__)

HOLD = b"hold\n"
"""Sent with the two descriptors: keep these (the agent to the holder, and the agent's answer to
`HOLDER`)."""
HOLDER = b"holder\n"
"""What a starting holder sends the serving agent on the hand-over socket."""
CLIENT_TIMEOUT_S = 5.0
"""A client that connects and says nothing is dropped after this long (the socket is root's)."""


def offer(root: Path, fds: list[int]) -> bool:
    """The agent's side: give the holder, if one listens on `root`, duplicates of `fds` (the
    /dev/fuse descriptor, the state memfd). Never blocks for long: a unix socket's connect
    completes in the listener's backlog, and the message is a few bytes. False without a holder."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(str(layout.holder_socket(root)))
            if peers.refuse_unless_root(sock, who="the server of the holder socket"):
                return False
            send_fds(sock, HOLD, fds)
        except OSError:
            return False
    return True


def send_fds(sock: socket.socket, message: bytes, fds: list[int]) -> None:
    rights = array.array("i", fds).tobytes()
    sock.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])


class _Held:
    """The descriptors held while their connection is the agent's (`alive`), its /dev/fuse
    descriptor watched in the holder's epoll set for EPOLLERR (always reported)."""

    def __init__(self, ready: select.epoll, mountpoint: str) -> None:
        self.fds: list[int] = []
        self.device = ""
        """`major:minor` of the held connection's mount at the agent's mountpoint."""
        self._ready = ready
        self._mountpoint = mountpoint

    def replace(self, fds: list[int]) -> bool:
        """Hold `fds` (the agent's /dev/fuse descriptor and state memfd) instead of what we held;
        False, said in one line, if the agent's mountpoint shows no FUSE mount of fusevol (its
        tear-down came before its offer): they are closed then."""
        self.drop()
        self.device = _device_at(self._mountpoint)
        if not self.device:
            _close_all(fds)
            log.info("the agent's FUSE mount is gone from %s: not held", self._mountpoint)
            return False
        self.fds = fds
        self._ready.register(fds[0], 0)
        return True

    def alive(self) -> bool:
        """True while we hold a connection that is still the agent's; else let go of it."""
        if self.fds and (why := self._ended()):
            log.info("%s: no longer held", why)
            self.drop()
        return bool(self.fds)

    def _ended(self) -> str:
        if _polls_error(self.fds[0]):
            return "the FUSE connection ended (unmounted)"
        if _device_at(self._mountpoint) != self.device:
            return f"the agent's FUSE mount is gone from {self._mountpoint} (torn down)"
        return ""

    def drop(self) -> None:
        if self.fds:
            self._ready.unregister(self.fds[0])
        _close_all(self.fds)
        self.fds = []


def _device_at(mountpoint: str) -> str:
    """`major:minor` of the FUSE mount of fusevol on top at `mountpoint`, or "" if there is none:
    from the mount table, never from the mount itself (a stat waits for an answer, and nobody
    may be serving the connection)."""
    devices = [
        mount.device
        for mount in mountinfo.read()
        if mount.path == mountpoint and mount.fstype == layout.FUSE_FSTYPE
    ]
    return devices[-1] if devices else ""


def _polls_error(fd: int) -> bool:
    """True once the kernel has ended the FUSE connection of /dev/fuse descriptor `fd`."""
    check = select.poll()
    check.register(fd, 0)  # POLLERR is always reported
    return bool(check.poll(0))


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def hold(root: Path, *, csi_endpoint: str = "", kubelet_dir: Path | None = None) -> int:
    """Serve as the holder of `root` until SIGTERM or SIGINT (exit 0); with `csi_endpoint`,
    also answer kubelet's plugin registration of the CSI driver served there (in
    `kubelet_dir`'s plugins_registry), so that a rollout of the agent never has kubelet register
    the driver again (`fusevol.csi.registration`)."""
    registration = None
    if csi_endpoint:
        from fusevol.csi.registration import Registration, registration_socket
        from fusevol.csi.server import socket_path

        assert kubelet_dir is not None
        registration = Registration(
            registration_socket(kubelet_dir), endpoint=socket_path(csi_endpoint)
        )
        registration.start()
    try:
        return _hold(root)
    finally:
        if registration is not None:
            registration.stop(remove=True)  # kubelet forgets the driver (a next holder: anew)


def _hold(root: Path) -> int:
    path = layout.holder_socket(root)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    mountpoint = layout.fuse_mountpoint(root)  # as the mount table names it: canonical
    seen = os.path.join(os.path.realpath(mountpoint.parent), mountpoint.name)
    with select.epoll() as ready, open(mountinfo.PATH, "rb") as mount_table:
        held = _Held(ready, seen)
        ready.register(mount_table, select.EPOLLPRI)  # a mount or an unmount: is ours there still?
        try:
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, _stop)
            with peers.listening(path, backlog=8) as listener:
                log.info("holding FUSE connections for the agent of root=%s at %s", root, path)
                if (fds := _ask_serving_agent(root)) and held.replace(fds):
                    log.info("holding the serving agent's FUSE connection")
                _serve(listener, ready, held)
        except _Stopped as stopped:
            log.info("stopped by %s", stopped)
        finally:
            held.drop()
    return 0


def _serve(listener: socket.socket, ready: select.epoll, held: _Held) -> NoReturn:
    """Answer the clients of `listener`, and let go of what we hold once it is no longer the
    agent's connection (`_Held.alive`), until a signal stops us."""
    ready.register(listener, select.EPOLLIN)
    while True:
        for fd, _ in ready.poll():
            if fd == listener.fileno():
                connection, _ = listener.accept()
                with connection:
                    _answer(connection, held)
            else:  # the held /dev/fuse descriptor polls EPOLLERR, or the mount table changed
                held.alive()


def _stop(signum: int, _frame: FrameType | None) -> None:
    raise _Stopped(signal.Signals(signum).name)


class _Stopped(Exception):
    """SIGTERM or SIGINT: raised by the handler, since the selector would retry (PEP 475)."""


def _answer(connection: socket.socket, held: _Held) -> None:
    if peers.refuse_unless_root(connection, who="a client of the holder socket"):
        return
    connection.settimeout(CLIENT_TIMEOUT_S)
    try:
        message, fds, _, _ = socket.recv_fds(connection, 64, 2)
    except OSError as exc:
        log.warning("a client of the holder socket failed: %s", exc)
        return
    if message == HOLD and len(fds) == 2:
        if held.replace(fds):
            log.info("holding the agent's FUSE connection")
        return
    _close_all(fds)
    if message == TAKE_OVER:
        if not held.alive():
            log.info("the next agent asked for a FUSE connection: none held")
            return
        with contextlib.suppress(OSError):
            send_fds(connection, TAKE_OVER, held.fds)
            log.info("gave the held FUSE connection to the next agent")
        return
    log.warning("ignored a message of %d bytes on the holder socket", len(message))


def _ask_serving_agent(root: Path) -> list[int]:
    """The serving agent's descriptors (`HOLDER` on its hand-over socket), or [] if none
    answers: it then offers them itself once it serves."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(CLIENT_TIMEOUT_S)
        try:
            sock.connect(str(layout.handover_socket(root)))
            if peers.refuse_unless_root(sock, who="the server of the hand-over socket"):
                return []
            sock.sendall(HOLDER)
            message, fds, _, _ = socket.recv_fds(sock, 64, 2)
        except OSError:
            return []
    if message == HOLD and len(fds) == 2:
        return fds
    _close_all(fds)
    return []
