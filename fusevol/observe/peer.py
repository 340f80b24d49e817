"""Who is at the other end of a TCP connection made on this node: the uid owning the caller's
socket, as the kernel tells it (sock_diag, what `ss -e` shows), the TCP counterpart of a Unix
socket's SO_PEERCRED.

A connection made on the node (to loopback, or to one of the node's own addresses, where the
chart's agent listens) has both its sockets in the agent's network namespace, so the kernel can
look the caller's one up by its four addresses and ports (`SOCK_DIAG_BY_FAMILY`, one exact
lookup, not a dump). A caller elsewhere (another host, a pod with a network namespace of its
own) has no socket here: the lookup finds nothing, and it is nobody. The uid is that of the
process that made the socket (`sk_uid`), seen from the agent's user namespace; a socket only
changes hands if its owner passes it on.

Only a socket that is still open and connected counts: once its process closed it, the kernel
keeps what is left of it (FIN_WAIT2, TIME_WAIT) with no file and the uid 0 or the old one, which
vouches for no one. So the answer is None unless the socket found is exactly the caller's, has a
file (an inode), and is established or half-closed by its owner.

Excludes: what a uid may do (`fusevol.observe.auth`).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass
from typing import Any, Protocol

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLMSG_ERROR = 2
_NLM_F_REQUEST = 1
_NO_COOKIE = 0xFFFFFFFF
_ALL_STATES = 0xFFFFFFFF
_HEADER = struct.Struct("=IHHII")
"""`struct nlmsghdr`: length, type, flags, sequence, port id."""
_REPLY_AT = _HEADER.size
_OWNER = struct.Struct("=IIIII")
"""The tail of `struct inet_diag_msg`: expires, rqueue, wqueue, uid, inode."""
_OWNER_AT = _REPLY_AT + 4 + 48
_CONNECTED = frozenset({1, 4, 5})
"""TCP_ESTABLISHED, TCP_FIN_WAIT1, TCP_FIN_WAIT2 (the caller shut down its side, and waits)."""
TIMEOUT_S = 1.0


class _Named(Protocol):
    """A connected socket (the standard library's, or trio's)."""

    def getpeername(self) -> Any: ...
    def getsockname(self) -> Any: ...


@dataclass(frozen=True, slots=True)
class Connection:
    """An accepted TCP connection, from the agent's side: `getpeername()` and `getsockname()`."""

    peer_address: str
    peer_port: int
    local_address: str
    local_port: int

    @classmethod
    def of(cls, sock: _Named) -> Connection:
        peer, local = sock.getpeername(), sock.getsockname()
        return cls(str(peer[0]), int(peer[1]), str(local[0]), int(local[1]))


def _address(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`address` as an IP address (an IPv4 one mapped into IPv6 as itself), or None."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip


def caller_uid(connection: Connection) -> int | None:
    """The uid owning the caller's socket of `connection`, made on this node and still open;
    None for a caller elsewhere, or a socket closed or gone. OSError if the kernel cannot be
    asked (no sock_diag)."""
    peer, local = _address(connection.peer_address), _address(connection.local_address)
    if peer is None or local is None or peer.version != local.version:
        return None
    family = socket.AF_INET if peer.version == 4 else socket.AF_INET6
    wanted = (connection.peer_port, connection.local_port, peer.packed, local.packed)
    return _owner(_ask(family, *wanted), wanted)


def _ask(family: int, sport: int, dport: int, src: bytes, dst: bytes) -> bytes:
    """One `inet_diag_req_v2` for the TCP socket whose own end is src:sport and whose other
    end is dst:dport (the caller's socket); the kernel's reply."""
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, _ALL_STATES)
    request += struct.pack("!HH", sport, dport) + src.ljust(16, b"\0") + dst.ljust(16, b"\0")
    request += struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE)
    header = _HEADER.pack(_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as diag:
        diag.settimeout(TIMEOUT_S)
        diag.sendto(header + request, (0, 0))
        return diag.recv(8192)


def _owner(reply: bytes, wanted: tuple[int, int, bytes, bytes]) -> int | None:
    length, kind = struct.unpack_from("=IH", reply)
    if kind == _NLMSG_ERROR:
        code = -struct.unpack_from("=i", reply, _REPLY_AT)[0]
        if code == errno.ENOENT:
            return None  # no such socket: gone already
        raise OSError(code, f"sock_diag: {os.strerror(code)}")
    if length < _OWNER_AT + _OWNER.size or len(reply) < _OWNER_AT + _OWNER.size:
        raise OSError(errno.EPROTO, "sock_diag: a short reply")
    state = reply[_REPLY_AT + 1]
    sport, dport = struct.unpack_from("!HH", reply, _REPLY_AT + 4)
    src = reply[_REPLY_AT + 8 : _REPLY_AT + 8 + len(wanted[2])]
    dst = reply[_REPLY_AT + 24 : _REPLY_AT + 24 + len(wanted[3])]
    uid, inode = _OWNER.unpack_from(reply, _OWNER_AT)[3:]
    if (sport, dport, src, dst) != wanted or state not in _CONNECTED or inode == 0:
        return None  # another socket (a listener on that port), or one its process closed
    return int(uid)
