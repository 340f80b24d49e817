"""The FUSE connection outlives the agent, seen from containers whose bind is a plain `rbind:ro`
(rprivate, CRI's default: no mount made after the container started can ever reach it).

A container reads every 20 ms as uid 1000, resolving `..data` once per round and reading two keys
through it (kubelet's atomicity guarantee), through: kill -9 of the agent proper while `fusevol
run` lives (the launcher starts a new agent, which takes the connection over), the agent killed
at random moments while edits stream in (mid-publish), and an upgrade-restart (SIGTERM, then a
new `fusevol run`, which takes the lame duck's connection over).
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import statistics
import threading
import time
from typing import TYPE_CHECKING

import pytest

from fusevol.fuse.session import can_take_over
from tests.agent import (
    AgentProcess,
    Holder,
    force_stop,
    mounts_below,
    pid_alive,
    wait_for,
    write_atomically,
)
from tests.containerd.runtime import Containerd, LineClock, bind, needs_containerd
from tests.manifests import (
    POD_UID,
    configmap as pod_set_configmap,
    pod as pod_set_pod,
    write_pod_set,
)
from tests.served import check_one_complete_version

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

pytestmark = [
    needs_containerd,
    pytest.mark.containerd,
    pytest.mark.skipif(not can_take_over(), reason="needs fusevol's patched pyfuse3"),
]

KILLS = int(os.environ.get("FUSEVOL_TAKEOVER_KILLS", "20"))
"""Kills mid-publish: the CI subset; the README's 100 with FUSEVOL_TAKEOVER_KILLS=100."""

READ_LOOP = (
    "while :; do read up idle < /proc/uptime; d=$(busybox readlink /etc/config/..data)"
    " && a=$(cat /etc/config/$d/a) && b=$(cat /etc/config/$d/b) && ls /etc/config >/dev/null"
    ' && echo "$up ok $a $b" || echo "$up fail"; usleep 20000; done >> /out/reads 2>> /out/errors'
)
"""`ls` always reaches the FUSE server (opendir); `..data` is resolved once per round. Each line
is stamped with the moment its round began (`LineClock(stamped=True)`)."""


def configmap(value: str) -> str:
    return pod_set_configmap(a=value, b=value)


def children(launcher: int) -> list[int]:
    with open(f"/proc/{launcher}/task/{launcher}/children") as f:
        return [int(pid) for pid in f.read().split()]


def kill_agent(agent: AgentProcess) -> None:
    """kill -9 of the agent proper; returns once the launcher has started the next one."""
    assert agent.process is not None
    launcher, old = agent.process.pid, agent.pid
    os.kill(old, signal.SIGKILL)
    agent.pid = wait_for(lambda: [p for p in children(launcher) if p != old], timeout_s=20)[0]


def test_plain_binds_read_through_every_takeover(
    containerd: Containerd, rootfs: Path, tmp_path: Path, report: Callable[[str], None]
) -> None:
    manifests, out, slave_out = _directories(tmp_path)
    agent = AgentProcess(manifests=manifests, root=tmp_path / "root").start()
    agents = [agent]
    try:
        agent.wait_state(POD_UID, "config", "mounted")
        wait_for(lambda: "held by the launcher" in agent.log_text())
        volume = agent.volume(POD_UID, "configmap", "config")
        clock = LineClock(out / "reads", stamped=True)
        slave_clock = LineClock(slave_out / "reads", stamped=True)
        for reads in (out / "reads", slave_out / "reads"):
            reads.chmod(0o666)  # the readers are uid 1000
        reader = containerd.run(
            "plain",
            rootfs,
            bind(volume, "/etc/config", "ro", "rprivate"),
            bind(out, "/out", "rw"),
            command=("sleep", "100000"),
        )
        # The same reader behind an rslave bind (HostToContainer): the takeover serves both alike.
        slave = containerd.run(
            "slave",
            rootfs,
            bind(volume, "/etc/config", "ro", "rslave"),
            bind(slave_out, "/out", "rw"),
            command=("sleep", "100000"),
        )
        for name in (reader, slave):
            exec_as_1000 = ("task", "exec", "--detach", "--exec-id", "reader", "--user", "1000")
            containerd.ctr(*exec_as_1000, name, "sh", "-c", READ_LOOP)
        figures = []
        try:
            clock.wait_for("ok v0 v0", after=0)
            slave_clock.wait_for("ok v0 v0", after=0)
            time.sleep(1.0)
            # A round of the loop (four processes) on this machine, undisturbed: the part of a gap
            # that is the reader's own, not a wait on the FUSE server.
            rounds = [b - a for a, b in itertools.pairwise(at for at, _ in list(clock.lines))]
            usual = statistics.median(rounds)

            # 1. kill -9 of the agent proper, three times; then an edit.
            pauses = []
            for _ in range(3):
                killed = time.monotonic()
                kill_agent(agent)
                clock.wait_for("ok v0 v0", after=time.monotonic(), timeout_s=10)
                pauses.append(_longest_gap(clock, killed - 0.05) - usual)
            write_atomically(manifests / "configmap.yaml", configmap("v1"))
            edited = time.monotonic()
            seen = clock.wait_for("ok v1 v1", after=edited, timeout_s=10)
            figures.append(
                f"kill -9 of the agent, launcher alive (3x): {_failed(clock)} failed reads,"
                f" longest pause {max(pauses) * 1000:.0f} ms (beyond a usual round of"
                f" {usual * 1000:.0f} ms); edit seen"
                f" {(seen - edited) * 1000:.0f} ms after"
            )
            assert max(pauses) <= 1.0, figures[-1]

            # 2. Killed mid-publish: edits stream in while the agent is killed at random moments.
            stop = threading.Event()
            last = ["v1"]

            def edit() -> None:
                n = 1
                while not stop.is_set():
                    n += 1
                    write_atomically(manifests / "configmap.yaml", configmap(f"v{n}"))
                    last[0] = f"v{n}"
                    time.sleep(random.uniform(0.01, 0.05))

            editor = threading.Thread(target=edit, daemon=True)
            editor.start()
            try:
                for _ in range(KILLS):
                    time.sleep(random.uniform(0.05, 0.4))
                    kill_agent(agent)
            finally:
                stop.set()
                editor.join(timeout=10)
            final = last[0]
            write_atomically(manifests / "configmap.yaml", configmap(final + "-final"))
            clock.wait_for(f"ok {final}-final {final}-final", after=0, timeout_s=20)
            wait_for(lambda: _one_version(volume, final + "-final"), timeout_s=10)
            figures.append(
                f"killed mid-publish {KILLS}x: {_failed(clock)} failed reads, {_mixed(clock)}"
                " mixed versions, one complete current version after"
            )

            # 3. Upgrade-restart: SIGTERM, then a new `fusevol run`.
            agent.hand_over()
            restarted = time.monotonic()
            previous, agent = agent, AgentProcess(manifests=manifests, root=agent.root).start()
            agents.append(agent)
            previous.wait_agent_gone(10)
            gone = time.monotonic() - restarted
            assert not pid_alive(previous.pid)
            write_atomically(manifests / "configmap.yaml", configmap("upgraded"))
            edited = time.monotonic()
            seen = clock.wait_for("ok upgraded upgraded", after=edited, timeout_s=10)
            figures.append(
                f"upgrade-restart (SIGTERM, start): {_failed(clock)} failed reads; old agent"
                f" gone {gone:.2f} s after the new start; edit seen"
                f" {(seen - edited) * 1000:.0f} ms after"
            )
        finally:
            clock.close()
            slave_clock.close()
            containerd.remove(reader)
            containerd.remove(slave)
        figures.append(
            f"the same through an rslave bind: {_failed(slave_clock)} failed reads,"
            f" {_mixed(slave_clock)} mixed versions"
        )
        for line in figures:
            report(line)
        errors = (out / "errors").read_text() if (out / "errors").exists() else ""
        assert _failed(clock) == 0, (figures, errors[:500])
        assert _mixed(clock) == 0, figures
        assert (_failed(slave_clock), _mixed(slave_clock)) == (0, 0), figures
        agent.stop()
    finally:
        for each in agents:
            force_stop(each)


def _directories(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The pod set's manifests (the ConfigMap at v0), and an output directory for each reader."""
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    write_pod_set(manifests)
    (manifests / "configmap.yaml").write_text(configmap("v0"))
    out, slave_out = tmp_path / "out", tmp_path / "slave-out"
    for directory in (out, slave_out):
        directory.mkdir()
        directory.chmod(0o777)
    return manifests, out, slave_out


def start_readers(
    containerd: Containerd, rootfs: Path, volume: Path, out: Path, slave_out: Path
) -> tuple[list[str], LineClock, LineClock]:
    """Two containers reading `volume` every 20 ms as uid 1000 (`READ_LOOP`), one through a
    plain rbind (rprivate), one through an rslave bind, each into its own output directory;
    their names and the clocks of their reads."""
    clock = LineClock(out / "reads", stamped=True)
    slave_clock = LineClock(slave_out / "reads", stamped=True)
    for reads in (out / "reads", slave_out / "reads"):
        reads.chmod(0o666)
    readers = []
    for name, propagation, directory in (
        ("plain", "rprivate", out),
        ("slave", "rslave", slave_out),
    ):
        readers.append(
            containerd.run(
                name,
                rootfs,
                bind(volume, "/etc/config", "ro", propagation),
                bind(directory, "/out", "rw"),
                command=("sleep", "100000"),
            )
        )
        exec_as_1000 = ("task", "exec", "--detach", "--exec-id", "reader", "--user", "1000")
        containerd.ctr(*exec_as_1000, name, "sh", "-c", READ_LOOP)
    return readers, clock, slave_clock


def kill_pod(agent: AgentProcess) -> None:
    """SIGKILL of a generation run in a PID namespace of its own (`wrapper=("unshare", "--pid",
    ...)`), as a deleted pod is: its PID 1 goes, and every process in it with it."""
    os.kill(agent.pid, signal.SIGKILL)
    assert agent.process is not None
    agent.process.wait(timeout=10)
    agent.wait_agent_gone(10)


def _failed(clock: LineClock) -> int:
    return sum(1 for _, line in clock.lines if not line.startswith("ok "))


def _mixed(clock: LineClock) -> int:
    """Rounds that read `a` and `b` of different versions through one `..data`."""
    return sum(1 for _, line in clock.lines if len(set(line.split()[1:])) > 1)


def _longest_gap(clock: LineClock, since: float) -> float:
    times = [at for at, _ in list(clock.lines) if at >= since]
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def _one_version(volume: Path, value: str) -> bool:
    check_one_complete_version(volume, {"a": value.encode(), "b": value.encode()})
    return True


ROLLOUTS = 10
SECOND_UID = "22222222-2222-4333-8444-555555555555"


def test_a_rollout_takes_the_connection_from_the_serving_agent(
    containerd: Containerd, rootfs: Path, tmp_path: Path, report: Callable[[str], None]
) -> None:
    """Two generations overlapping, as a DaemonSet's maxSurge starts them: a new `fusevol run`
    on the root while the old one serves asks it for its connection and serves it; the old
    launcher retires (stays, doing nothing) until it is stopped. Ten in a row, readers behind a
    plain rbind and an rslave bind: no read fails, `ls` always lists the keys, every edit after a
    rollout shows within a second."""
    manifests, out, slave_out = _directories(tmp_path)

    def ready_file(n: int) -> Path:
        return tmp_path / f"ready-{n}"  # each pod's own, as in the chart

    def generation(n: int) -> AgentProcess:
        args = ("--replace", "--ready-file", str(ready_file(n)))
        return AgentProcess(manifests=manifests, root=tmp_path / "root", extra_args=args)

    agent = generation(0).start()
    agents = [agent]
    try:
        agent.wait_state(POD_UID, "config", "mounted")
        wait_for(lambda: "held by the launcher" in agent.log_text())
        wait_for(ready_file(0).exists)
        volume = agent.volume(POD_UID, "configmap", "config")
        readers, clock, slave_clock = start_readers(containerd, rootfs, volume, out, slave_out)
        try:
            clock.wait_for("ok v0 v0", after=0)
            slave_clock.wait_for("ok v0 v0", after=0)
            seen_ms, pauses = [], []
            for n in range(1, ROLLOUTS + 1):
                started = time.monotonic()
                previous, agent = agent, generation(n)
                agents.append(agent.start())
                assert previous.process is not None
                assert previous.process.poll() is None  # retired, not exited
                previous.wait_agent_gone(10)  # its agent handed the connection over and went
                assert not ready_file(n - 1).exists()  # the old pod is no longer ready
                wait_for(ready_file(n).exists, timeout_s=5)  # the new one is
                pauses.append(_longest_gap(clock, started))
                write_atomically(manifests / "configmap.yaml", configmap(f"v{n}"))
                edited = time.monotonic()
                seen = clock.settled(f"ok v{n} v{n}", after=edited, within_s=1)
                slave_clock.settled(f"ok v{n} v{n}", after=edited, within_s=1)
                seen_ms.append(max(0.0, seen - edited) * 1000)
                previous.process.send_signal(signal.SIGTERM)  # the old pod is deleted
                assert previous.process.wait(timeout=10) == 0
            assert "retired" in agents[0].log_text()

            # The successor in a PID namespace of its own, as in another pod: the connection's
            # mounter cannot see its processes, so the kernel reports its publisher's requests
            # with pid 0. Edits and a new pod's volume are still published through the mount.
            wrapper = ("unshare", "--pid", "--fork")
            args = ("--replace", "--ready-file", str(ready_file(99)))
            previous, agent = (
                agent,
                AgentProcess(
                    manifests=manifests, root=agent.root, extra_args=args, wrapper=wrapper
                ),
            )
            agents.append(agent.start())
            previous.wait_agent_gone(10)
            write_atomically(manifests / "configmap.yaml", configmap("namespaced"))
            edited = time.monotonic()
            seen = clock.settled("ok namespaced namespaced", after=edited, within_s=2)
            seen_ms.append(max(0.0, seen - edited) * 1000)
            (manifests / "second.yaml").write_text(pod_set_pod("second", SECOND_UID))
            agent.wait_state(SECOND_UID, "config", "mounted")
            assert (agent.volume(SECOND_UID, "configmap", "config") / "a").read_text() == (
                "namespaced"
            )
            assert previous.process is not None
            previous.process.send_signal(signal.SIGTERM)
            assert previous.process.wait(timeout=10) == 0
            # And back to this PID namespace: a successor takes the connection from it.
            previous, agent = agent, generation(100)
            agents.append(agent.start())
            write_atomically(manifests / "configmap.yaml", configmap("back"))
            clock.settled("ok back back", after=time.monotonic(), within_s=2)
            assert previous.process is not None
            os.kill(previous.pid, signal.SIGTERM)  # the retired launcher, unshare's child
            assert previous.process.wait(timeout=10) == 0
        finally:
            clock.close()
            slave_clock.close()
            for name in readers:
                containerd.remove(name)
        report(
            f"{ROLLOUTS} rollouts (the new agent asks the serving one): {_failed(clock)} failed"
            f" reads plain, {_failed(slave_clock)} rslave, {_mixed(clock)} mixed versions;"
            f" longest read pause {max(pauses) * 1000:.0f} ms; edit seen after each in"
            f" {min(seen_ms):.0f}-{max(seen_ms):.0f} ms"
        )
        errors = (out / "errors").read_text() if (out / "errors").exists() else ""
        assert (_failed(clock), _failed(slave_clock)) == (0, 0), errors[:500]
        assert _mixed(clock) == 0
        agent.stop()
    finally:
        for each in agents:
            force_stop(each)


DELETIONS = int(os.environ.get("FUSEVOL_TAKEOVER_DELETIONS", "5"))
"""Whole-pod kills in a row: the CI count; more with FUSEVOL_TAKEOVER_DELETIONS."""


def test_a_deleted_agent_pod_costs_readers_a_pause_not_a_read(
    containerd: Containerd, rootfs: Path, tmp_path: Path, report: Callable[[str], None]
) -> None:
    """No overlap: each generation in a PID namespace of its own (a pod) is SIGKILLed whole, as
    a deleted, evicted or OOM-killed agent pod is, before the next one starts. `fusevol hold`
    (the chart's holder pod) keeps the connection meanwhile, and the next generation takes it
    over from there: readers behind a plain rbind and an rslave bind wait, none fails, and the
    next edit shows within a second. Five times in a row."""
    manifests, out, slave_out = _directories(tmp_path)
    root = tmp_path / "root"

    def generation() -> AgentProcess:
        return AgentProcess(
            manifests=manifests,
            root=root,
            extra_args=("--replace",),
            wrapper=("unshare", "--pid", "--fork", "--kill-child"),
        )

    holder = Holder(root)
    agent = generation().start()
    agents = [agent]
    try:
        agent.wait_state(POD_UID, "config", "mounted")
        wait_for(lambda: "held by fusevol hold" in agent.log_text())
        volume = agent.volume(POD_UID, "configmap", "config")
        readers, clock, slave_clock = start_readers(containerd, rootfs, volume, out, slave_out)
        try:
            clock.wait_for("ok v0 v0", after=0)
            slave_clock.wait_for("ok v0 v0", after=0)
            seen_ms, pauses = [], []
            for n in range(1, DELETIONS + 1):
                killed = time.monotonic()
                kill_pod(agent)
                time.sleep(0.5)  # the DaemonSet's next pod being created
                agent = generation()
                agents.append(agent.start())
                assert "taking over the FUSE connection that fusevol hold kept" in (
                    agent.log_text()
                )
                write_atomically(manifests / "configmap.yaml", configmap(f"v{n}"))
                edited = time.monotonic()
                seen = clock.settled(f"ok v{n} v{n}", after=edited, within_s=1)
                slave_clock.settled(f"ok v{n} v{n}", after=edited, within_s=1)
                seen_ms.append(max(0.0, seen - edited) * 1000)
                pauses.append(_longest_gap(clock, killed))
        finally:
            clock.close()
            slave_clock.close()
            for name in readers:
                containerd.remove(name)
        report(
            f"{DELETIONS} agent pods SIGKILLed whole, no overlap, fusevol hold keeping the"
            f" connection: {_failed(clock)} failed reads plain, {_failed(slave_clock)} rslave,"
            f" {_mixed(clock)} mixed versions; longest read pause {max(pauses) * 1000:.0f} ms"
            f" (0.5 s of it the wait before the next start); edit seen after each in"
            f" {min(seen_ms):.0f}-{max(seen_ms):.0f} ms"
        )
        errors = (out / "errors").read_text() if (out / "errors").exists() else ""
        assert (_failed(clock), _failed(slave_clock)) == (0, 0), errors[:500]
        assert _mixed(clock) == 0
        os.kill(agent.pid, signal.SIGINT)  # the tear-down, to the pod's PID 1 (unshare ignores it)
        assert agent.process is not None
        assert agent.process.wait(timeout=60) == 0
        assert mounts_below(root) == []
        wait_for(lambda: "no longer held" in holder.log_text(), timeout_s=10)
    finally:
        for each in agents:
            force_stop(each)
        assert holder.stop() == 0
