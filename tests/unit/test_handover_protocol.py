"""The successor's side of a hand-over (`fusevol.agent.launcher.take_over_from`) against peers
that misbehave: one that answers garbage, one that ends halfway through the transfer, one that
never lets go, and the two that behave (this version's two phases, and one phase: the holder and
agents of versions that stop before they send)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from fusevol.agent import launcher
from fusevol.agent.launcher import GO, OFFER, ROLL_OVER, TAKE_OVER, TAKEN, HandOverStuck

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

Peer = Callable[[socket.socket], None]


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    """Two descriptors for a peer to send (which ones does not matter to the protocol)."""
    read, write = os.pipe()
    yield read, write
    os.close(read)
    os.close(write)


def serve_once(path: Path, peer: Peer) -> threading.Thread:
    """A peer listening at `path` that answers one connection with `peer`, after the request."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def run() -> None:
        with listener:
            connection, _ = listener.accept()
            with connection:
                assert connection.recv(64) == ROLL_OVER
                peer(connection)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def take(path: Path, peer: Peer) -> tuple[int, int] | None:
    thread = serve_once(path, peer)
    try:
        return launcher.take_over_from(path, ROLL_OVER, timeout_s=5.0)
    finally:
        thread.join(timeout=5)
        assert not thread.is_alive()


def same_file(fd: int, other: int) -> bool:
    a, b = os.fstat(fd), os.fstat(other)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def test_both_phases_then_the_descriptors(
    tmp_path: Path, pipe: tuple[int, int], capsys: pytest.CaptureFixture[str]
) -> None:
    said: list[bytes] = []

    def peer(connection: socket.socket) -> None:
        socket.send_fds(connection, [OFFER], list(pipe))
        said.append(connection.recv(64))
        connection.sendall(GO)

    fds = take(tmp_path / "s", peer)
    assert fds is not None
    assert said == [TAKEN]
    assert same_file(fds[0], pipe[0])
    assert same_file(fds[1], pipe[1])
    launcher._close_all(list(fds))
    assert capsys.readouterr().err == ""


def test_one_phase_from_the_holder_or_an_older_agent(tmp_path: Path, pipe: tuple[int, int]) -> None:
    def peer(connection: socket.socket) -> None:
        socket.send_fds(connection, [TAKE_OVER], list(pipe))

    fds = take(tmp_path / "s", peer)
    assert fds is not None
    launcher._close_all(list(fds))


def test_garbage_is_no_connection_and_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert take(tmp_path / "s", lambda c: c.sendall(b"HTTP/1.1 400 Bad Request\r\n")) is None
    [line] = capsys.readouterr().err.splitlines()
    assert line == f"fusevol: {tmp_path / 's'} answered 26 bytes that are no FUSE connection:" + (
        " starting without"
    )


def test_descriptors_with_garbage_are_closed(tmp_path: Path, pipe: tuple[int, int]) -> None:
    before = set(os.listdir("/proc/self/fd"))

    def peer(connection: socket.socket) -> None:
        socket.send_fds(connection, [b"what\n"], list(pipe))

    assert take(tmp_path / "s", peer) is None
    assert set(os.listdir("/proc/self/fd")) <= before


def test_a_peer_ending_after_the_offer_leaves_the_connection_to_us(
    tmp_path: Path, pipe: tuple[int, int], capsys: pytest.CaptureFixture[str]
) -> None:
    """It offered, we took, it ended without `GO`: an agent that ended reads /dev/fuse no more."""

    def peer(connection: socket.socket) -> None:
        socket.send_fds(connection, [OFFER], list(pipe))
        assert connection.recv(64) == TAKEN

    fds = take(tmp_path / "s", peer)
    assert fds is not None
    launcher._close_all(list(fds))
    [line] = capsys.readouterr().err.splitlines()
    assert "ended before it let go of the FUSE connection: taking it over" in line


def test_a_peer_that_never_lets_go_stops_the_start(
    tmp_path: Path, pipe: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It may still read /dev/fuse: nothing may be taken over, from it or from anyone else."""
    monkeypatch.setattr(launcher, "GO_TIMEOUT_S", 0.2)
    release = threading.Event()

    def peer(connection: socket.socket) -> None:
        socket.send_fds(connection, [OFFER], list(pipe))
        assert connection.recv(64) == TAKEN
        release.wait(5)

    thread = serve_once(tmp_path / "s", peer)
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(HandOverStuck, match="did not let go of it within 0 s"):
        launcher.take_over_from(tmp_path / "s", ROLL_OVER, timeout_s=5.0)
    release.set()
    thread.join(timeout=5)
    assert set(os.listdir("/proc/self/fd")) <= before


def test_nobody_there(tmp_path: Path) -> None:
    assert launcher.take_over_from(tmp_path / "absent", ROLL_OVER) is None
