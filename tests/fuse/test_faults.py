"""Faults: readers killed mid-request, the agent killed mid-publish, a hung mount helper, a full
tmpfs. Each test runs the real agent (tests.agent) and checks what a pod would see afterwards.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import random
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

import pytest

from tests.agent import (
    AgentProcess,
    LogTail,
    abort_fuse_connection,
    force_stop,
    mountinfo_below,
    mounts_below,
    running_agent,
    wait_for,
    write_atomically,
)
from tests.manifests import POD_UID, configmap
from tests.served import check_one_complete_version, pod_set_snapshots, read_within

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


# -- (a) clients killed in the middle of FUSE requests --------------------------------------------

# A factory process forks readers on demand (a fork costs a millisecond, an interpreter start
# twenty), so a round of kills is cheap. Every call a reader makes reaches the FUSE server (the
# kernel caches entries, attributes and pages, but not readdir, negative lookups, open or
# statfs), so a kill lands inside a request most of the time. Protocol, one line each way:
# "<n>" -> "<pid> ..." (n readers, looping already), then "reap" -> "<exit statuses>".
READER_FACTORY = r"""
import os, sys
volume = sys.argv[1]

def read_forever():
    while True:
        os.listdir(volume)
        try:
            os.stat(volume + "/missing")
        except FileNotFoundError:
            pass
        fd = os.open(volume + "/..data/a", os.O_RDONLY)
        os.read(fd, 4096)
        os.close(fd)
        os.statvfs(volume)

for line in sys.stdin:
    pids = []
    for _ in range(int(line)):
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            os.write(ready_w, b"r")
            read_forever()
        os.close(ready_w)
        os.read(ready_r, 1)
        os.close(ready_r)
        pids.append(pid)
    print(*pids, flush=True)
    sys.stdin.readline()
    print(*(os.waitpid(pid, 0)[1] for pid in pids), flush=True)
"""


class Readers:
    """Reader processes on `volume`, started and SIGKILLed in rounds."""

    def __init__(self, volume: Path, *, per_round: int = 3) -> None:
        self._per_round = per_round
        self._factory = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", READER_FACTORY, str(volume)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def __enter__(self) -> Readers:
        return self

    def __exit__(self, *exc: object) -> None:
        self._factory.kill()
        self._factory.wait(timeout=10)
        for pipe in (self._factory.stdin, self._factory.stdout):
            assert pipe is not None
            pipe.close()

    def kill_round(self, rng: random.Random) -> int:
        """Start a round of readers, SIGKILL each at a random moment; returns how many."""
        assert self._factory.stdin is not None
        assert self._factory.stdout is not None
        self._factory.stdin.write(f"{self._per_round}\n")
        self._factory.stdin.flush()
        pids = [int(pid) for pid in self._factory.stdout.readline().split()]
        assert len(pids) == self._per_round
        for pid in pids:
            time.sleep(rng.uniform(0, 0.003))
            os.kill(pid, signal.SIGKILL)
        self._factory.stdin.write("reap\n")
        self._factory.stdin.flush()
        statuses = [int(status) for status in self._factory.stdout.readline().split()]
        assert statuses == [signal.SIGKILL] * len(pids)  # killed, not failed
        return len(pids)


def test_readers_killed_mid_request_leave_the_agent_answering(agent: AgentProcess) -> None:
    volume = agent.volume(POD_UID, "configmap", "config")
    before = pod_set_snapshots(agent)
    rng = random.Random(9)
    with Readers(volume) as readers:
        killed = sum(readers.kill_round(rng) for _ in range(100))
    assert killed == 300
    # A fresh client is answered at once, through the pod's bind and through `..data`.
    assert read_within(volume / "a", timeout_s=1.0) == b"alpha"
    assert read_within(volume / "..data" / "b", timeout_s=1.0) == b"beta"
    assert pod_set_snapshots(agent) == before
    # Updates still flow, and `fusevol status` reports a snapshot written after them.
    edited = time.time()
    write_atomically(agent.manifests / "configmap.yaml", configmap(a="after"))
    wait_for(lambda: (volume / "a").read_bytes() == b"after", timeout_s=5)
    wait_for(lambda: agent.snapshot()["written_at"] > edited, timeout_s=5)
    agent.wait_state(POD_UID, "config", "mounted")
    text = agent.status()
    assert f"pod default/web uid={POD_UID}" in text
    assert text.count(" mounted") == 2, text
    assert agent.process is not None
    assert agent.process.poll() is None
    assert " ERROR " not in agent.log_text()
    assert "Traceback" not in agent.log_text()


def test_killed_readers_never_freeze_the_agent(agent: AgentProcess) -> None:
    """After each round of kills, with no FUSE traffic from us, an edit must be published."""
    volume = agent.volume(POD_UID, "configmap", "config")
    rng = random.Random(4)
    with Readers(volume) as readers:
        for round_ in range(400):
            readers.kill_round(rng)
            _check_not_frozen(agent, volume, round_)


def _check_not_frozen(agent: AgentProcess, volume: Path, round_: int) -> None:
    """An edit is published within 3 s, with no FUSE request from us to wake the agent up."""
    tail = LogTail(agent.log_path)
    write_atomically(agent.manifests / "configmap.yaml", configmap(b=f"beta-{round_}"))
    try:
        tail.wait_line("volume updated", f"{POD_UID}-config", timeout_s=3)
    except TimeoutError:
        assert agent.process is not None
        with open(f"/proc/{agent.pid}/wchan") as f:
            where = f.read()
        os.statvfs(volume)  # any FUSE request wakes it up again
        raise AssertionError(
            f"round {round_}: no update published within 3s; agent thread in {where}"
        ) from None


# -- (b) the agent killed with SIGKILL while it publishes -----------------------------------------

UPDATE_UID = "99999999-0000-4000-8000-000000000001"
UPDATE_POD = f"""\
kind: Pod
metadata: {{name: updated, namespace: default, uid: {UPDATE_UID}}}
spec:
  containers: [{{name: c}}]
  volumes:
    - name: config
      configMap: {{name: app}}
    - name: creds
      secret: {{secretName: creds}}
    - name: info
      downwardAPI:
        items: [{{path: podname, fieldRef: {{fieldPath: metadata.name}}}}]
    - name: all
      projected:
        sources:
          - configMap: {{name: app, items: [{{key: a, path: pa}}]}}
          - secret: {{name: creds, items: [{{key: token, path: pt}}]}}
          - downwardAPI: {{items: [{{path: pn, fieldRef: {{fieldPath: metadata.name}}}}]}}
    - name: scratch
      emptyDir: {{}}
"""


def _configmap(version: int) -> tuple[str, dict[str, bytes]]:
    """Version `version` of ConfigMap app: `a` changes, and the extra keys alternate between two
    sets of ten, so each publish also creates and removes top-level symlinks."""
    data = {"a": f"v{version}".encode(), "b": b"beta"}
    data.update({f"k{version % 2}-{i}": f"x{version}".encode() for i in range(10)})
    lines = "".join(f'  {k}: "{v.decode()}"\n' for k, v in data.items())
    return f"kind: ConfigMap\nmetadata: {{name: app, namespace: default}}\ndata:\n{lines}", data


class Editor:
    """Rewrites the ConfigMap in a loop from a thread, as fast as the agent can follow."""

    def __init__(self, manifests: Path, first: int) -> None:
        self._manifests = manifests
        self.version = first
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Editor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.version += 1
            write_atomically(self._manifests / "configmap.yaml", _configmap(self.version)[0])
            time.sleep(0.002)


def _served_volumes_are_whole(agent: AgentProcess, version: int) -> bool:
    data = _configmap(version)[1]
    check_one_complete_version(agent.volume(UPDATE_UID, "configmap", "config"), data)
    check_one_complete_version(agent.volume(UPDATE_UID, "secret", "creds"), {"token": b"t0ken"})
    check_one_complete_version(
        agent.volume(UPDATE_UID, "downward-api", "info"), {"podname": b"updated"}
    )
    check_one_complete_version(
        agent.volume(UPDATE_UID, "projected", "all"),
        {"pa": data["a"], "pt": b"t0ken", "pn": b"updated"},
    )
    return True


@pytest.fixture
def update_manifests(manifests: Path) -> Path:
    (manifests / "updated.yaml").write_text(UPDATE_POD)
    write_atomically(manifests / "configmap.yaml", _configmap(0)[0])
    return manifests


def _start(manifests: Path, root: Path, generation: int) -> AgentProcess:
    """Start an agent on `root`, the previous one's log set aside (its " ready " line would make
    `AgentProcess.start` return at once)."""
    agent = AgentProcess(manifests=manifests, root=root)
    if agent.log_path.exists():
        agent.log_path.rename(agent.log_path.with_name(f"{agent.log_path.name}.{generation}"))
    return agent.start()


def _stacks_ok(root: Path, *, layers: int) -> bool:
    """One FUSE mount below `root`, and six pod volume binds, each `layers` mounts deep with a
    bind of that FUSE mount on top."""
    lines = [line.split() for line in mountinfo_below(root)]
    fuse = [f for f in lines if f[4] == str(root / "fusevol" / "mnt")]
    stacks: dict[str, list[list[str]]] = {}
    for fields in lines:
        if fields[4] != str(root / "fusevol" / "mnt"):
            stacks.setdefault(fields[4], []).append(fields)
    if len(fuse) != 1 or len(stacks) != 6:
        return False
    for mounts in stacks.values():
        covered = {m[1] for m in mounts}
        (top,) = [m for m in mounts if m[0] not in covered]
        if len(mounts) != layers or top[2] != fuse[0][2]:
            return False
    return True


def _kill_9(agent: AgentProcess) -> str:
    """SIGKILL `fusevol run` and the agent proper (a crash of the whole service: the FUSE
    connection is lost, no agent can take it over) and reap them. Returns "" if the agent died,
    else the wait channels of its threads (one of them left waiting on the agent's own FUSE
    mount): the process is then released the only way a node has, `umount -f` of the FUSE mount,
    which aborts the connection."""
    assert agent.process is not None
    agent.process.kill()  # first: a launcher that outlives its agent starts a new one
    os.kill(agent.pid, signal.SIGKILL)
    try:
        agent.wait_agent_gone(1.5)
        agent.process.wait(timeout=10)  # the launcher exits with its child
    except subprocess.TimeoutExpired:
        task_dir = f"/proc/{agent.pid}/task"
        stuck = {}
        for task in os.listdir(task_dir):
            with open(f"{task_dir}/{task}/wchan") as f:
                stuck[task] = f.read()
        abort_fuse_connection(agent)
        agent.wait_agent_gone(10)
        agent.process.wait(timeout=10)
        return str(stuck)
    return ""


AGENT_KILLS = int(os.environ.get("FUSEVOL_AGENT_KILLS", "20"))
"""The CI subset; the README's 100 runs with FUSEVOL_AGENT_KILLS=100 (about five times longer)."""


def test_agent_killed_while_publishing_restarts_into_one_complete_version(
    update_manifests: Path, tmp_path: Path
) -> None:
    """AGENT_KILLS x: start, stream ConfigMap edits, SIGKILL after 50-500 ms, restart. Every
    restart serves each volume whole and current, and adopts the emptyDir with its content.

    A kill that leaves the agent unkillable (the bug pinned by the next test) is released with
    `umount -f` here, so that this test checks what happens after a restart either way.
    """
    root = tmp_path / "root"
    rng = random.Random(20)
    version = 0
    agent: AgentProcess | None = None
    try:
        for iteration in range(AGENT_KILLS):
            agent = _start(update_manifests, root, iteration)
            wait_for(lambda a=agent, v=version: _served_volumes_are_whole(a, v), timeout_s=15)  # type: ignore[misc]
            # One FUSE mount, four binds for this pod and two for the healthy one, each a live
            # bind of that FUSE mount stacked on one dead bind per predecessor (containers that
            # hold a copy of a dead one switch to the new one through it); the emptyDir is a
            # plain directory, kept. Polled: the healthy pod may still be set up, and mountinfo
            # read while mounts change can show an entry twice.
            try:
                wait_for(lambda i=iteration: _stacks_ok(root, layers=i + 1), timeout_s=10)  # type: ignore[misc]
            except TimeoutError:
                raise AssertionError("\n".join(mountinfo_below(root))) from None
            scratch = agent.volume(UPDATE_UID, "empty-dir", "scratch")
            if iteration:
                assert (scratch / "kept").read_text() == str(iteration - 1)
            (scratch / "kept").write_text(str(iteration))
            with Editor(update_manifests, version) as editor:
                time.sleep(rng.uniform(0.05, 0.5))
                _kill_9(agent)
            version = editor.version
            assert version > 0
        agent = _start(update_manifests, root, 20)
        wait_for(lambda: _served_volumes_are_whole(agent, version), timeout_s=15)
        agent.stop()  # exit 0 and nothing mounted below the root
        assert not any((root / "pods").iterdir())
        for log in tmp_path.glob("root-agent.log*"):
            assert "Traceback" not in log.read_text(), log
    finally:
        if agent is not None:
            force_stop(agent)


_FUSE_FORGET, _FUSE_INTERRUPT, _FUSE_BATCH_FORGET = 2, 36, 42
_FUSE_IN_HEADER = struct.Struct("<IIQQIII")  # len, opcode, unique, nodeid, uid, gid, pid
_FUSE_OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique


def _dup_fuse_fd(pid: int) -> int:
    """A duplicate of the agent's /dev/fuse descriptor (pidfd_getfd(2)): same connection."""
    (target,) = (
        int(fd)
        for fd in os.listdir(f"/proc/{pid}/fd")
        if os.readlink(f"/proc/{pid}/fd/{fd}") == "/dev/fuse"
    )
    pidfd = os.pidfd_open(pid)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fd: int = libc.syscall(438, pidfd, target, 0)  # SYS_pidfd_getfd, the same on every arch
    finally:
        os.close(pidfd)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "pidfd_getfd")
    return fd


def _sent_by_agent(agent_pid: int, sender: int) -> bool:
    """True if thread `sender` belongs to the agent or to one of its child processes (the
    publisher's helpers)."""
    if os.path.exists(f"/proc/{agent_pid}/task/{sender}"):
        return True
    try:
        with open(f"/proc/{sender}/stat") as f:
            return int(f.read().rsplit(") ", 1)[1].split()[1]) == agent_pid
    except (FileNotFoundError, ProcessLookupError):
        return False


class RequestThief:
    """Reads requests off the agent's FUSE connection until it holds one sent by the agent's
    publisher, and keeps it unanswered: the state a SIGKILL finds when it lands while the
    agent's trio thread is handling a request of its own publisher. Requests of anyone else are
    answered EIO. (A random kill during a stream of updates lands there now and then, a few
    times in twenty in the test above; this makes it certain.)"""

    def __init__(self, agent_pid: int) -> None:
        self._fd = _dup_fuse_fd(agent_pid)
        self._agent_pid = agent_pid
        self.holding = threading.Event()
        self.held: tuple[int, int] | None = None
        """(opcode, sender thread) of the request held."""
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                select.select([self._fd], [], [])  # the agent's fd is non-blocking (shared flags)
                data = os.read(self._fd, 1 << 21)
            except BlockingIOError:
                continue  # the agent took the request first
            except OSError:
                return  # the connection was aborted
            _, opcode, unique, _, _, _, sender = _FUSE_IN_HEADER.unpack_from(data)
            if opcode in (_FUSE_FORGET, _FUSE_BATCH_FORGET, _FUSE_INTERRUPT):
                continue
            if sender and _sent_by_agent(self._agent_pid, sender):
                self.held = (opcode, sender)
                self.holding.set()
                return
            os.write(self._fd, _FUSE_OUT_HEADER.pack(16, -errno.EIO, unique))

    def close(self) -> None:
        """Only after the connection is aborted (umount -f): a blocked read keeps it open."""
        self._thread.join(timeout=10)
        os.close(self._fd)


def test_sigkill_while_the_agent_serves_its_own_request_lets_it_exit(
    update_manifests: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    agent = _start(update_manifests, root, 0)
    thief: RequestThief | None = None
    try:
        wait_for(lambda: _served_volumes_are_whole(agent, 0), timeout_s=15)
        assert agent.process is not None
        thief = RequestThief(agent.pid)
        with Editor(update_manifests, 0) as editor:
            assert thief.holding.wait(timeout=3), "the publisher sent no request"
            stuck = _kill_9(agent)
        assert not stuck, f"agent alive 1.5s after SIGKILL, holding {thief.held}: {stuck}"
        # Its helper, whose request the thief holds, dies once the connection is aborted; the
        # next agent does that itself (it finds the dead agent's mount and aborts it).
        restarted = _start(update_manifests, root, 1)
        wait_for(lambda: _served_volumes_are_whole(restarted, editor.version), timeout_s=15)
        assert thief.held is not None
        helper = thief.held[1]
        wait_for(lambda: not _alive(helper), timeout_s=5)
        restarted.stop()
        agent = restarted
    finally:
        abort_fuse_connection(agent)  # also ends the thief's blocked read in the fixed case
        force_stop(agent)
        if thief is not None:
            thief.close()


# -- (c) a mount helper that never returns --------------------------------------------------------

HUNG_MOUNT = """\
#!/bin/sh
# Stand-in for mount(8): hangs for `-t nfs`, passes everything else to the real one.
previous=""
for arg in "$@"; do
    if [ "$previous" = "-t" ] && [ "$arg" = "nfs" ]; then
        echo $$ >> "$HUNG_MOUNT_PIDS"
        exec sleep 3600
    fi
    previous="$arg"
done
exec /usr/bin/mount "$@"
"""

NFS_UID = "88888888-0000-4000-8000-000000000001"
NFS_POD = f"""\
kind: Pod
metadata: {{name: nfs-user, namespace: default, uid: {NFS_UID}}}
spec:
  containers: [{{name: c}}]
  volumes:
    - {{name: share, nfs: {{server: 192.0.2.1, path: /export}}}}
    - {{name: config, configMap: {{name: app}}}}
    - {{name: scratch, emptyDir: {{}}}}
"""


@pytest.fixture
def hung_mount_env(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    helper = bin_dir / "mount"
    helper.write_text(HUNG_MOUNT)
    helper.chmod(0o755)
    pids = tmp_path / "hung-pids"
    pids.touch()
    yield {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HUNG_MOUNT_PIDS": str(pids)}, pids
    for pid in pids.read_text().split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def test_hung_nfs_mount_blocks_only_its_own_volume(
    manifests: Path, tmp_path: Path, hung_mount_env: tuple[dict[str, str], Path]
) -> None:
    """There is no flag for `MountSettings.command_timeout_s` (60 s), so the helper hangs for the
    whole test: the point is what keeps working meanwhile."""
    env, pids = hung_mount_env
    (manifests / "nfs.yaml").write_text(NFS_POD)
    root = tmp_path / "root"
    with running_agent(manifests, root, env=env) as agent:
        # The pod's other volumes and the other pod are served while the nfs mount hangs.
        config = agent.wait_mounted(agent.volume(NFS_UID, "configmap", "config"))
        assert (config / "a").read_bytes() == b"alpha"
        wait_for(agent.volume(NFS_UID, "empty-dir", "scratch").is_dir)
        agent.wait_state(POD_UID, "config", "mounted")
        wait_for(lambda: pids.read_text().strip())
        agent.wait_state(NFS_UID, "share", "mounting")
        # Updates still reach both pods.
        write_atomically(manifests / "configmap.yaml", configmap(a="during"))
        wait_for(lambda: (config / "a").read_bytes() == b"during", timeout_s=5)
        healthy = agent.volume(POD_UID, "configmap", "config")
        wait_for(lambda: (healthy / "a").read_bytes() == b"during", timeout_s=5)
        # A new pod arriving meanwhile is served too.
        (manifests / "later.yaml").write_text(
            UPDATE_POD.replace("updated", "later").split("    - name: info")[0]
        )
        later = agent.wait_mounted(agent.volume(UPDATE_UID, "configmap", "config"))
        assert (later / "a").read_bytes() == b"during"
        agent.wait_state(UPDATE_UID, "config", "mounted")
        agent.wait_state(UPDATE_UID, "creds", "mounted")
        assert agent.volume_status(NFS_UID, "share")["state"] == "mounting"
        # A stop does not wait for the helper: it is cancelled, and everything is unmounted.
        # (Only the hung helper is in flight now: a stop that cancels a helper while it has a
        # request pending on the FUSE mount can freeze the agent, see the reader-kill test.)
        started = time.monotonic()
        agent.stop()
        assert time.monotonic() - started < 15
    assert mounts_below(root) == []
    for pid in pids.read_text().split():
        wait_for(lambda p=int(pid): not _alive(p), timeout_s=10)  # type: ignore[misc]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ", 1)[1][0] != "Z"


# -- (d) a full tmpfs behind an emptyDir ----------------------------------------------------------

TMPFS_UID = "77777777-0000-4000-8000-000000000001"
TMPFS_POD = f"""\
kind: Pod
metadata: {{name: tmpfs-user, namespace: default, uid: {TMPFS_UID}}}
spec:
  containers: [{{name: c}}]
  volumes:
    - {{name: small, emptyDir: {{medium: Memory, sizeLimit: 1Mi}}}}
    - {{name: disk, emptyDir: {{}}}}
    - {{name: config, configMap: {{name: app}}}}
"""


def test_full_memory_empty_dir_fails_only_the_writer(manifests: Path, tmp_path: Path) -> None:
    (manifests / "tmpfs.yaml").write_text(TMPFS_POD)
    with running_agent(manifests, tmp_path / "root") as agent:
        small = agent.wait_mounted(agent.volume(TMPFS_UID, "empty-dir", "small"))
        config = agent.wait_mounted(agent.volume(TMPFS_UID, "configmap", "config"))
        disk = agent.volume(TMPFS_UID, "empty-dir", "disk")
        wait_for(disk.is_dir)
        agent.wait_state(POD_UID, "config", "mounted")
        agent.wait_state(POD_UID, "creds", "mounted")
        before = pod_set_snapshots(agent)
        with (  # noqa: PT012 - the loop of writes is the point
            pytest.raises(OSError, match="No space left on device") as raised,
            open(small / "big", "wb") as f,
        ):
            for _ in range(2 * 1024):
                f.write(b"x" * 1024)
                f.flush()
        assert raised.value.errno == errno.ENOSPC
        assert (small / "big").stat().st_size <= 1024 * 1024
        with pytest.raises(OSError, match="No space left on device") as again:
            (small / "more").write_bytes(b"y" * 8192)
        assert again.value.errno == errno.ENOSPC
        # Everything else keeps working: reads, other writes, updates, status.
        (disk / "fine").write_bytes(b"z" * (2 * 1024 * 1024))
        assert (config / "a").read_bytes() == b"alpha"
        assert pod_set_snapshots(agent) == before
        write_atomically(manifests / "configmap.yaml", configmap(a="still"))
        wait_for(lambda: (config / "a").read_bytes() == b"still", timeout_s=5)
        assert agent.volume_status(TMPFS_UID, "small")["state"] == "mounted"
        # Freeing space makes the tmpfs writable again.
        (small / "big").unlink()
        (small / "more").write_bytes(b"y" * 8192)
        assert " ERROR " not in agent.log_text()
        agent.stop()
