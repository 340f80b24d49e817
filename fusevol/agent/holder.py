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
agent but this module and the layout, and runs no event loop but one `selectors` loop. In the
chart it also answers kubelet's plugin registration of the CSI driver (`--csi-endpoint`): kubelet
registers a driver again whenever its registration socket is made anew, and the holder, unlike
the agent, lives through rollouts (`fusevol.csi.registration`).

Protocol, on `layout.holder_socket(root)` (a unix stream socket, mode 0600 whatever the umask;
a client that is not root is refused, and the agent and the launcher talk to a holder run by root
only: `fusevol.agent.peers`):
- the agent sends `HOLD` with its two descriptors (SCM_RIGHTS) once it serves a connection, and
  again after every takeover; the holder keeps them, replacing what it held;
- a starting launcher sends `TAKE_OVER` (as to a lame duck) and receives `TAKE_OVER` with
  duplicates of the held descriptors, or a closed connection if it holds none;
- a holder that starts while an agent serves asks it on the hand-over socket (`HOLDER`), and the
  agent answers `HOLD` with its descriptors (`fusevol.agent.handover.hear_successors`).
The holder lets go of a connection the kernel has ended (the volumes torn down, the FUSE mount
unmounted): `/dev/fuse` then polls EPOLLERR, which it watches with an epoll set of its own.
"""

from __future__ import annotations

import array
import contextlib
import logging
import os
import select
import selectors
import signal
import socket
from typing import TYPE_CHECKING

from fusevol.agent import peers
from fusevol.agent.launcher import TAKE_OVER
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
    """The descriptors held, and an epoll set that reports the connection's end."""

    def __init__(self) -> None:
        self.fds: list[int] = []
        self.ended = select.epoll()
        """Watches the /dev/fuse descriptor for nothing but EPOLLERR (always reported)."""

    def replace(self, fds: list[int]) -> None:
        self.drop()
        self.fds = fds
        self.ended.register(fds[0], 0)

    def alive(self) -> bool:
        if self.fds and self.ended.poll(0):
            log.info("the FUSE connection ended (unmounted): no longer held")
            self.drop()
        return bool(self.fds)

    def drop(self) -> None:
        if self.fds:
            self.ended.unregister(self.fds[0])
        for fd in self.fds:
            os.close(fd)
        self.fds = []


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
    held = _Held()

    def stop(signum: int, _frame: FrameType | None) -> None:
        raise _Stopped(signal.Signals(signum).name)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    try:
        with (
            peers.listening(path, backlog=8) as listener,
            selectors.DefaultSelector() as selector,
        ):
            log.info("holding FUSE connections for the agent of root=%s at %s", root, path)
            if fds := _ask_serving_agent(root):
                held.replace(fds)
                log.info("holding the serving agent's FUSE connection")
            selector.register(listener, selectors.EVENT_READ)
            selector.register(held.ended, selectors.EVENT_READ)
            while True:
                for key, _ in selector.select():
                    if key.fileobj is held.ended:
                        held.alive()
                    else:
                        connection, _ = listener.accept()
                        with connection:
                            _answer(connection, held)
    except _Stopped as stopped:
        log.info("stopped by %s", stopped)
    finally:
        held.drop()
    return 0


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
        held.replace(fds)
        log.info("holding the agent's FUSE connection")
        return
    for fd in fds:
        os.close(fd)
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
    for fd in fds:
        os.close(fd)
    return []
