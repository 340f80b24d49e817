"""The hand-over of an upgrade-restart: a stopping agent keeps answering FUSE until its successor
has stacked its binds, so that a container reading its volume never sees a failed read.

The pod volume binds of a served volume all show subtrees of the agent's one FUSE mount: they work
exactly as long as its process answers. On SIGTERM a launched agent (`fusevol.agent.launcher`)
becomes a *lame duck*: it stops reconciling and watching its source, detaches its own FUSE
mountpoint (the superblock lives on through the pod binds), releases the agent lock, tells its
launcher, which exits (the stop systemd or a test waits for is over), and goes on answering FUSE
requests for what it served. The successor takes the lock, mounts a FUSE file system of its own,
stacks a fresh bind on each old one (`fusevol.volumemanager.reconciler.reconstruct`), and then says
so on the lame duck's unix socket (`layout.handover_socket`); the lame duck exits without unmounting
anything. Its binds, covered, turn dead and go when their volume is torn down.

Exactly one agent reconciles at a time: the lock. A lame duck holds no lock and changes nothing;
it only answers reads. It gives up after `LAME_DUCK_S` without a successor (a plain stop): its
binds then turn dead as after a crash, and the next agent recovers them the same way.

Protocol (on a socket of mode 0600 whatever the umask, between processes of root only, each side
checking the other: `fusevol.agent.peers`): the successor connects and keeps the connection while
it sets up; once every volume it found on the node is set up again (or torn down), it sends
`STACKED` and closes. A lame duck that loses the connection without `STACKED` (its successor
crashed) waits for the next one.

Taking over (a lame duck whose connection can be taken over, `fusevol.fuse.snapshot`): its FUSE
mountpoint stays attached, and the successor's launcher (`fusevol.agent.launcher.take_over_from`)
sends `TAKE_OVER` instead. The transfer has two phases, so that a successor dying halfway costs
nothing: the lame duck answers with `OFFER` and duplicates of its `/dev/fuse` and state
descriptors (SCM_RIGHTS) while it still serves; once the successor says `TAKEN`, it stops reading
`/dev/fuse` (the requests it read but did not answer are sent again to the successor:
FUSE_NOTIFY_RESEND), says `GO`, and exits. A successor that leaves before `TAKEN` changes nothing:
the lame duck serves on and waits for the next. Readers wait meanwhile; none fails, whatever
their mount propagation, and no bind is stacked.

A rollout (two generations overlapping, as a DaemonSet's `maxSurge` starts them): the successor
starts while its predecessor still serves. A serving agent that can be taken over listens on the
same socket (`hear_successors`); a successor started with `--replace` sends `ROLL_OVER`. The
serving agent offers its descriptors as above, and once they are `TAKEN` stops as on SIGTERM,
then lets go (`give_connection`: `GO`) instead of waiting for a successor; its launcher then
*retires*: it stays, doing nothing, until it is stopped (the old pod deleted), so that nothing
restarts an agent in the old generation. A plain `TAKE_OVER` to a serving agent (a second agent
started by mistake) is ignored: that one is refused by the lock, as before.
"""

from __future__ import annotations

import array
import contextlib
import errno
import logging
import socket
from typing import TYPE_CHECKING, Protocol

import trio

from fusevol.agent import peers
from fusevol.agent.holder import HOLD, HOLDER
from fusevol.agent.launcher import GO, OFFER, ROLL_OVER, TAKE_OVER, TAKEN
from fusevol.node import layout

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterable
    from pathlib import Path

    from fusevol.model import UniqueVolumeName
    from fusevol.volumemanager.cache.actual import ActualState

log = logging.getLogger(__name__)

STACKED = b"stacked\n"
LAME_DUCK_S = 60.0
"""How long a lame duck waits for a successor to stack its binds before it exits anyway."""
LINGER_S = 1.0
"""How long a released lame duck still answers: a reader that resolved a path on an old bind just
before the new one was stacked on it still reaches us (seen under load: 1 failed read in 71)."""
TAKEN_TIMEOUT_S = 10.0
"""How long an agent that offered its connection waits for the successor to say it took it."""
RELEASE_WAIT_S = 30.0
"""How long a new agent waits for its reconstructed volumes before it releases a lame duck."""


class Transferable(Protocol):
    """The FUSE connection an agent can hand to a successor (`fusevol.agent.app`)."""

    def descriptors(self) -> list[int]:
        """The /dev/fuse descriptor and the state memfd, still ours (duplicates are sent)."""
        ...

    async def stop_reading(self) -> None:
        """Stop reading /dev/fuse: what was read but not answered, the successor gets again."""
        ...


async def be_lame_duck(
    root: Path,
    *,
    let_go: Callable[[], None],
    connection: Transferable | None = None,
) -> bool:
    """A launched agent's handing-over stop, once it has stopped reconciling: keep answering
    FUSE (the caller's server goes on) for the pod binds until the next agent has taken our
    `connection` over, or stacked its own binds. Returns True if a successor did, False after
    LAME_DUCK_S without one.

    (1) listen on the hand-over socket; (2) unless we can be taken over (`connection`), detach
    our FUSE mountpoint lazily (no abort: the pod binds keep the connection), so the successor
    mounts afresh at the same place; (3) `let_go()`: the caller releases the agent lock and its
    launcher, which exits; (4) wait, and after a stacking successor answer LINGER_S more for the
    readers already on their way to an old bind."""
    async with trio.open_nursery() as nursery:
        outcome: list[str] = []

        async def listen(*, task_status: trio.TaskStatus[None]) -> None:
            path = layout.handover_socket(root)
            outcome.append(
                await serve_as_lame_duck(path, connection=connection, task_status=task_status)
            )

        await nursery.start(listen)  # (1)
        if connection is None:
            mountpoint = layout.fuse_mountpoint(root)
            await trio.run_process(["umount", "--lazy", str(mountpoint)], check=False)  # (2)
        let_go()  # (3)
        log.info(
            "lame duck: serving pod volumes until the next agent %s",
            "takes the connection over" if connection else "has stacked its binds",
        )
    [how] = outcome  # (4)
    if how == STACKED_ITS_BINDS:
        await trio.sleep(LINGER_S)
    log.info("lame duck done: %s", how)
    return how != NO_SUCCESSOR


TOOK_OVER = "the next agent took the connection over"
STACKED_ITS_BINDS = "the next agent has stacked its binds"
NO_SUCCESSOR = "no successor"


async def serve_as_lame_duck(
    path: Path,
    *,
    timeout_s: float = LAME_DUCK_S,
    connection: Transferable | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> str:
    """Listen at `path` until a successor sends `STACKED` or takes our `connection` over, or
    `timeout_s` passes; returns which (`STACKED_ITS_BINDS`, `TOOK_OVER`, `NO_SUCCESSOR`).

    Without `connection` we cannot be taken over, and such a request is refused by closing.
    Reports started once listening: the caller releases the agent lock only then, so a successor
    that holds the lock always finds the socket. The caller's FUSE server answers meanwhile, and
    goes on if a successor leaves halfway."""
    async with _listening(path) as listener:
        task_status.started()
        with trio.move_on_after(timeout_s):
            while True:
                successor = await _accept_root(listener)
                with successor:
                    received = await _request(successor)
                    if received in (TAKE_OVER, ROLL_OVER) and connection is not None:
                        if await offer_connection(successor, connection):
                            await give_connection(successor, connection)
                            return TOOK_OVER
                        continue
                if received.startswith(STACKED):
                    return STACKED_ITS_BINDS
                log.info("the successor left without stacking its binds: waiting for the next")
        return NO_SUCCESSOR


async def hear_successors(
    path: Path,
    *,
    connection: Transferable,
    on_request: Callable[[trio.socket.SocketType], None],
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """A serving agent's side of a rollout: listen at `path` until a successor asks for our FUSE
    `connection` (`ROLL_OVER`) and takes the duplicates we offer; then give `on_request` the
    socket to that successor, still open, and return. The caller stops as on SIGTERM and lets go
    on it (`give_connection`). A successor that leaves before it took them changes nothing. A
    holder that starts (`HOLDER`, `fusevol.agent.holder`) gets duplicates, and we go on.
    Anything else is ignored: a probe, a second agent started without `--replace`."""
    async with _listening(path) as listener:
        task_status.started()
        while True:
            successor = await _accept_root(listener)
            received = await _request(successor)
            if received == ROLL_OVER:
                log.info("the next agent asks for the FUSE connection")
                if await offer_connection(successor, connection):
                    on_request(successor)
                    return
            with successor:
                if received == HOLDER:
                    with contextlib.suppress(OSError):
                        await _send_fds(successor, HOLD, connection.descriptors())
                        log.info("gave the holder a duplicate of the FUSE connection")


async def _request(sock: trio.socket.SocketType) -> bytes:
    """One line from a peer of the hand-over socket (within 5 s), or what came before it ended."""
    received = b""
    with trio.move_on_after(5.0):
        while b"\n" not in received and (chunk := await sock.recv(64)):
            received += chunk
    return received


async def offer_connection(successor: trio.socket.SocketType, connection: Transferable) -> bool:
    """The first phase of a transfer (`fusevol.agent.launcher.OFFER`): send duplicates of our
    descriptors while we still serve, and wait for the successor's `TAKEN`. False, in one log
    line saying why, if it leaves, says something else or nothing: we serve on."""
    why = "it said nothing"
    try:
        await _send_fds(successor, OFFER, connection.descriptors())
        with trio.move_on_after(TAKEN_TIMEOUT_S):
            answer = await successor.recv(64)
            if answer == TAKEN:
                return True
            why = f"it answered {len(answer)} bytes" if answer else "it left"
    except OSError as exc:
        why = f"{exc.strerror or exc}"
    log.warning("the next agent did not take the FUSE connection (%s): serving on", why)
    return False


async def give_connection(successor: trio.socket.SocketType, connection: Transferable) -> None:
    """The second phase: stop reading /dev/fuse and say `GO` to the successor that took our
    descriptors (`offer_connection`). If it died meanwhile, the connection lives on in its
    launcher's hands or the holder's (`fusevol.agent.holder`): nothing to undo."""
    with successor:
        await connection.stop_reading()
        log.info("handing the FUSE connection over to the next agent")
        try:
            await successor.send(GO)
        except OSError as exc:
            log.warning("the next agent left after it took the FUSE connection: %s", exc)
            return


async def _send_fds(sock: trio.socket.SocketType, message: bytes, fds: list[int]) -> None:
    rights = array.array("i", fds).tobytes()
    await sock.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])


@contextlib.asynccontextmanager
async def _listening(path: Path) -> AsyncIterator[trio.socket.SocketType]:
    """A unix socket listening at `path`, root's only (`fusevol.agent.peers.listening`: mode
    0600, a stale one there replaced), closed and removed on exit, unless `path` is another
    listener's by then (a later agent's)."""
    with (
        peers.listening(path, backlog=4) as listening,
        trio.socket.from_stdlib_socket(listening) as listener,
    ):
        yield listener


async def _accept_root(listener: trio.socket.SocketType) -> trio.socket.SocketType:
    """The next peer of `listener` that is root; any other is refused (closed, one log line)."""
    while True:
        peer, _ = await listener.accept()
        if not peers.refuse_unless_root(peer, who="a client of the hand-over socket"):
            return peer
        peer.close()


class Predecessor:
    """A connection to a lame duck, found by `find_predecessor`."""

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self._sock = sock

    async def release(self) -> None:
        """Tell the lame duck our binds are stacked on its (or that its are gone): it may exit.
        Idempotent."""
        if self._sock.fileno() == -1:
            return
        with self._sock, contextlib.suppress(OSError):
            await self._sock.send(STACKED)


async def release_once_set_up(
    predecessor: Predecessor, *, actual: ActualState, found: Iterable[UniqueVolumeName]
) -> None:
    """Tell the lame duck we hold every volume we `found` on the node (set up again, or torn
    down), or that we gave up waiting after RELEASE_WAIT_S: it may exit."""
    names = list(found)
    with trio.move_on_after(RELEASE_WAIT_S):
        await actual.wait_certain(names)
    if left := actual.uncertain(names):
        log.warning("releasing the previous agent with %d volumes not set up", left)
    await predecessor.release()
    log.info("previous agent released: our binds are stacked on its")


async def find_predecessor(path: Path) -> Predecessor | None:
    """The lame duck serving at `path`, or None if there is none (no socket, nobody listening)."""
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await sock.connect(str(path))
    except OSError as exc:
        sock.close()
        if exc.errno not in (errno.ENOENT, errno.ECONNREFUSED):
            log.warning("cannot reach a previous agent at %s: %s", path, exc)
        return None
    if peers.refuse_unless_root(sock, who="the server of the hand-over socket"):
        sock.close()
        return None
    return Predecessor(sock)
