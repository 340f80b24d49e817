"""Who is at the other end of a TCP connection (`fusevol.observe.peer`), with real sockets and a
real other user: root's socket on the node is root's, on loopback or at the node's own address;
another user's is that user's; a caller with no socket on the node is nobody."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from fusevol.observe import peer

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (another user's socket)")


def _own_address() -> str | None:
    """An IPv4 address of this node's that is not loopback, if it has one."""
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        address = line.split()[3].split("/")[0]
        if not address.startswith("127."):
            return address
    return None


def _caller(server: socket.socket, address: str, *as_user: str) -> tuple[int | None, str]:
    """Connect to `server` at `address` from a process (as `as_user`, a setpriv prefix) that
    holds its socket open; the caller's uid as `caller_uid` tells it."""
    port = server.getsockname()[1]
    hold = f"import socket,sys; s=socket.create_connection(('{address}',{port})); sys.stdin.read()"
    client = subprocess.Popen([*as_user, sys.executable, "-c", hold], stdin=subprocess.PIPE)
    try:
        accepted, _ = server.accept()
        with accepted:
            connection = peer.Connection.of(accepted)
            return peer.caller_uid(connection), connection.peer_address
    finally:
        client.communicate(b"")


@pytest.fixture
def server() -> Iterator[socket.socket]:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        sock.settimeout(10)
        yield sock


def test_roots_socket_on_loopback_is_roots(server: socket.socket) -> None:
    assert _caller(server, "127.0.0.1")[0] == 0


def test_roots_socket_at_the_nodes_own_address_is_roots(server: socket.socket) -> None:
    address = _own_address()
    if address is None:
        pytest.skip("this node has no address but loopback")
    uid, seen_from = _caller(server, address)
    assert seen_from == address  # not loopback: what the chart's agent sees on the node's IP
    assert uid == 0


def test_another_users_socket_is_that_users(server: socket.socket) -> None:
    nobody = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    assert _caller(server, "127.0.0.1", *nobody)[0] == 65534
    address = _own_address()
    if address is not None:
        assert _caller(server, address, *nobody)[0] == 65534


def test_a_caller_with_no_socket_on_the_node_is_nobody() -> None:
    elsewhere = peer.Connection("192.0.2.250", 40000, "127.0.0.1", 9842)
    assert peer.caller_uid(elsewhere) is None
    garbage = peer.Connection("not an address", 1, "127.0.0.1", 2)
    assert peer.caller_uid(garbage) is None
