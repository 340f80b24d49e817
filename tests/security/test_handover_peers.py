"""Both hand-over sockets are root's only (fusevol.agent.peers): whoever gets the `/dev/fuse`
descriptor serves every pod's reads, and the state memfd holds every served file.

A host user (`nobody`) connecting to the agent's hand-over socket or to the holder's gets no
descriptor and a closed connection: EACCES while the socket has the mode the agent gives it (0600,
whatever the umask it was started with), and the peer check alone when the test opens the mode to
everyone. The agent serves on meanwhile, and a root successor still takes its connection over. The
other way round, nothing of fusevol gives its descriptors to, or takes any from, a socket that a
user other than root listens on: the agent offering to a holder, the launcher and the holder asking.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from fusevol.agent import handover, holder, launcher, peers
from fusevol.agent.holder import HOLD, HOLDER
from fusevol.agent.launcher import ROLL_OVER, TAKE_OVER
from fusevol.fuse.session import can_take_over
from fusevol.node import layout
from tests.agent import HAS_FUSE, AgentProcess, Holder, running_agent, wait_for, write_atomically
from tests.manifests import POD_UID, configmap, write_pod_set

if TYPE_CHECKING:
    from collections.abc import Iterator

NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")

_CLIENT = r"""
import errno, json, os, socket, sys
path, request, with_fds = sys.argv[1], sys.argv[2].encode(), sys.argv[3] == "with-fds"
seen = {}
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
    sock.settimeout(20)
    try:
        sock.connect(path)
    except OSError as exc:
        print(json.dumps({"connect": errno.errorcode[exc.errno]}))
        sys.exit()
    try:
        if with_fds:  # as the agent offers: a holder must not keep these
            socket.send_fds(sock, [request], list(os.pipe()))
        else:
            sock.sendall(request)
        message, fds, _, _ = socket.recv_fds(sock, 64, 2)
        seen.update(message=message.decode(errors="replace"), fds=len(fds))
    except OSError as exc:
        seen["error"] = errno.errorcode[exc.errno]
print(json.dumps(seen))
"""
"""A client run as `nobody`: what it got from the socket at argv[1] after sending argv[2]."""

_SERVER = r"""
import contextlib, json, os, socket, sys
path = sys.argv[1]
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
    listener.bind(path)
    os.chmod(path, 0o777)
    listener.listen(1)
    print("listening", flush=True)
    connection, _ = listener.accept()
    with connection:
        connection.settimeout(10)
        # a lame duck's or a holder's answer, offered before anything is asked
        with contextlib.suppress(OSError):
            socket.send_fds(connection, [b"offer\n"], list(os.pipe()))
        try:
            message, fds, _, _ = socket.recv_fds(connection, 64, 2)
        except OSError:
            message, fds = b"", []
print(json.dumps({"message": message.decode(errors="replace"), "fds": len(fds)}))
"""
"""A server run as `nobody` at argv[1]: offers descriptors to its one client, and says what that
client sent it."""


@pytest.fixture
def root() -> Iterator[Path]:
    """An agent root whose parents any user may traverse (pytest's base directory is 0700):
    only what fusevol makes may stand between a host user and the sockets."""
    parent = Path(tempfile.mkdtemp(prefix="fusevol-peers-"))
    parent.chmod(0o755)
    yield parent / "root"
    shutil.rmtree(parent, ignore_errors=True)


def as_nobody(path: Path, request: bytes, *, with_fds: bool = False) -> dict[str, Any]:
    """What a host user (`nobody`) gets from the socket at `path` when it sends `request`."""
    argv = [*NOBODY, sys.executable, "-c", _CLIENT, str(path), request.decode()]
    argv.append("with-fds" if with_fds else "plain")
    done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30)
    seen: dict[str, Any] = json.loads(done.stdout)
    return seen


def got_nothing(seen: dict[str, Any]) -> bool:
    """Connected, and closed without a byte or a descriptor (or reset: it had sent unread bytes)."""
    return "connect" not in seen and not seen.get("fds") and not seen.get("message")


def open_to_everyone(root: Path) -> None:
    """What a careless set-up would do: the root and the agent's directory traversable by all."""
    for directory in (root, layout.agent_dir(root)):
        directory.chmod(directory.stat().st_mode | 0o711)


def socket_mode(path: Path) -> tuple[int, int]:
    info = path.stat()
    assert stat.S_ISSOCK(info.st_mode)
    return stat.S_IMODE(info.st_mode), info.st_uid


def descriptors_of(pid: int) -> list[str]:
    targets = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return targets


def holds_dev_fuse_and_no_pipe(pid: int) -> bool:
    return "/dev/fuse" in descriptors_of(pid) and holds_no_pipe(pid)


def holds_no_pipe(pid: int) -> bool:
    return not any(target.startswith("pipe:") for target in descriptors_of(pid))


@contextlib.contextmanager
def hostile_server(path: Path) -> Iterator[subprocess.Popen[str]]:
    """`nobody` listening at `path` (its directory opened to everyone for it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o777)
    argv = [*NOBODY, sys.executable, "-c", _SERVER, str(path)]
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        assert server.stdout.readline() == "listening\n"
        yield server
    finally:
        server.kill()
        server.wait(timeout=10)
        path.unlink(missing_ok=True)


def what_it_was_sent(server: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = server.communicate(timeout=20)
    seen: dict[str, Any] = json.loads(out)
    return seen


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """Processes started meanwhile inherit `mask`, as from a careless unit or shell."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


REFUSED = r"refused a client of the hand-over socket pid=\d+ uid=65534"


@pytest.mark.skipif(not HAS_FUSE, reason="needs root and /dev/fuse")
@pytest.mark.skipif(not can_take_over(), reason="needs fusevol's patched pyfuse3")
def test_a_host_user_gets_no_descriptor_from_either_socket(root: Path, tmp_path: Path) -> None:
    """Both started under `umask 000`: the sockets are 0600 all the same."""
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    write_pod_set(manifests)
    with umask(0):
        kept = Holder(root)
    careless = ("sh", "-c", 'umask 000 && exec "$@"', "sh")
    try:
        with running_agent(manifests, root, expect_log=(REFUSED,), wrapper=careless) as agent:
            agent.wait_state(POD_UID, "config", "mounted")
            wait_for(lambda: "held by fusevol hold" in agent.log_text())
            handover_socket, holder_socket = (
                layout.handover_socket(root),
                layout.holder_socket(root),
            )
            requests = {
                handover_socket: [(ROLL_OVER, False), (TAKE_OVER, False), (HOLDER, False)],
                holder_socket: [(TAKE_OVER, False), (HOLD, True)],
            }
            for path in requests:
                assert socket_mode(path) == (0o600, 0)
                assert as_nobody(path, TAKE_OVER) == {"connect": "EACCES"}
            open_to_everyone(root)
            for path in requests:  # the directories open: the socket's own mode
                assert as_nobody(path, TAKE_OVER) == {"connect": "EACCES"}
            for path, asked in requests.items():
                path.chmod(0o777)  # the peer check alone
                for request, with_fds in asked:
                    seen = as_nobody(path, request, with_fds=with_fds)
                    assert got_nothing(seen), (path.name, request, seen)
            wait_for(lambda: agent.log_text().count("refused a client") == 3)
            wait_for(lambda: kept.log_text().count("refused a client") == 2)
            assert kept.log_text().count("uid=65534") == 2
            # the hostile `HOLD` replaced nothing: the holder keeps the agent's connection
            assert kept.log_text().count("holding the agent's FUSE connection") == 1
            assert holds_dev_fuse_and_no_pipe(kept.process.pid)

            # the agent serves on, and a root successor takes its connection over
            volume = agent.volume(POD_UID, "configmap", "config")
            write_atomically(manifests / "configmap.yaml", configmap(a="after-nobody"))
            wait_for(lambda: (volume / "a").read_text() == "after-nobody")
            successor = AgentProcess(manifests=manifests, root=root, extra_args=("--replace",))
            successor.start()
            agent.wait_agent_gone(10)
            assert "FUSE taken over" in successor.log_text()
            write_atomically(manifests / "configmap.yaml", configmap(a="successor"))
            wait_for(lambda: (volume / "a").read_text() == "successor")
            assert agent.process is not None
            agent.process.terminate()  # the retired launcher: the old pod deleted
            assert agent.process.wait(timeout=10) == 0
            successor.stop()
    finally:
        assert kept.stop() == 0


def test_a_socket_is_root_only_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    with umask(0), peers.listening(path, backlog=1):
        assert socket_mode(path) == (0o600, os.geteuid())
        assert [p.name for p in tmp_path.iterdir()] == ["s.sock"]  # nothing left aside
    assert not path.exists()


async def test_nothing_is_given_to_or_taken_from_a_socket_root_does_not_listen_on(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The agent's offer to a holder, the launcher's request, a successor's look for a lame duck
    and a starting holder's question to the serving agent: each sees `nobody` at the other end,
    sends it nothing and takes nothing it offers."""
    read, write = os.pipe()
    try:
        with hostile_server(layout.holder_socket(root)) as server:
            assert holder.offer(root, [read, write]) is False
            assert what_it_was_sent(server) == {"message": "", "fds": 0}
    finally:
        os.close(read)
        os.close(write)
    path = layout.handover_socket(root)
    for request in (ROLL_OVER, TAKE_OVER):
        with hostile_server(path) as server:
            assert launcher.take_over_from(path, request, timeout_s=5) is None
            assert what_it_was_sent(server) == {"message": "", "fds": 0}
    with hostile_server(path) as server:
        assert await handover.find_predecessor(path) is None
        assert what_it_was_sent(server) == {"message": "", "fds": 0}
    refusals = [r.getMessage() for r in caplog.records if r.name == peers.log.name]
    assert len(refusals) == 4
    assert all(re.search(r"refused the server of .* uid=65534", r) for r in refusals), refusals
    caplog.clear()

    with hostile_server(path) as server:  # a holder starting while `nobody` listens there
        kept = Holder(root)
        try:
            assert what_it_was_sent(server) == {"message": "", "fds": 0}
            wait_for(lambda: "refused the server of the hand-over socket" in kept.log_text())
            assert "holding the serving agent's" not in kept.log_text()
            assert holds_no_pipe(kept.process.pid)
        finally:
            assert kept.stop() == 0
