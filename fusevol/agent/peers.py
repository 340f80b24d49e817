"""Who may be at either end of a hand-over socket: root, and nobody else.

Whoever holds a `/dev/fuse` descriptor of the agent's connection serves it, every pod's reads
included, and the state memfd holds every served file in plain text (docs/architecture.md,
"Holder"). The two sockets that hand them over, the agent's hand-over socket
(`fusevol.agent.handover`) and the holder's (`fusevol.agent.holder`), are therefore made mode
0600 whatever the umask (`listening`), and each side checks the other's credentials
(SO_PEERCRED, as the kernel recorded them at `connect` and `listen`): a server refuses a client
whose uid is not 0, a client gives nothing to and takes nothing from a server not run by root
(`refuse_unless_root`). Either refusal is one log line naming the peer's pid and uid: an operator
sees who tried.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from fusevol.base.fsutil import unlink_if_same

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

log = logging.getLogger(__name__)

_UCRED = struct.Struct("3i")
"""`struct ucred`: pid, uid, gid."""


class _Socket(Protocol):
    """A connected unix socket: the standard library's or trio's."""

    def getsockopt(self, level: int, optname: int, buflen: int, /) -> bytes: ...


@dataclass(frozen=True)
class Peer:
    """The process at the other end of a unix socket, seen from ours (its PID namespace's pid is
    0 where it is not visible from ours; an id its user namespace does not map is 65534)."""

    pid: int
    uid: int
    gid: int


def peer(sock: _Socket) -> Peer:
    """The credentials of `sock`'s peer: of the process that connected, for a server; of the one
    that listened, for a client."""
    pid, uid, gid = _UCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    )
    return Peer(pid, uid, gid)


def refuse_unless_root(sock: _Socket, *, who: str) -> bool:
    """True, said in one log line, if `sock`'s peer (`who`, as the line calls it) is not root:
    the caller then closes `sock`, sending nothing and trusting nothing it received."""
    other = peer(sock)
    if other.uid == 0:
        return False
    log.warning(
        "refused %s pid=%d uid=%d: only root may hand over a FUSE connection",
        who,
        other.pid,
        other.uid,
    )
    return True


@contextlib.contextmanager
def listening(path: Path, *, backlog: int) -> Iterator[socket.socket]:
    """A unix stream socket listening at `path` with mode 0600, whatever the umask; closed and
    removed on exit, unless `path` is another listener's by then (a later process's).

    Bound at a name of its own beside `path`, its mode set, renamed over `path` (a stale socket
    there is replaced in one step), and only then listening: until `listen`, a `connect` is
    refused whatever the mode, so at no moment can anybody but root connect to it."""
    aside = path.with_name(f".{path.name}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        aside.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(aside))
        os.chmod(aside, 0o600)
        own = os.lstat(aside).st_ino
        os.replace(aside, path)
    except BaseException:
        listener.close()
        aside.unlink(missing_ok=True)
        raise
    try:
        listener.listen(backlog)
        yield listener
    finally:
        listener.close()
        unlink_if_same(path, own)
