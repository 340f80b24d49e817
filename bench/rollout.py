"""Reader pauses when the agent is replaced, on the containerd harness of tests/containerd.

Two busybox containers read a served volume every 20 ms as uid 1000 (resolving `..data` once a
round, reading two keys, listing the volume), one through a plain `rbind:ro` (CRI's default,
rprivate), one through an rslave bind; each agent generation runs in a PID namespace of its own,
as in a pod of the DaemonSet. Measured, for each way the agent is replaced:

- rollout: the next generation starts with `--replace` while the old one serves (the chart's
  `maxSurge: 1`) and takes its FUSE connection over;
- agent pod deleted: the old generation is SIGKILLed whole before the next starts (no overlap),
  `fusevol hold` keeping the connection meanwhile (the chart's holder), the next start 0.5 s later;
- the same without the holder: the baseline, what the chart did before the holder (the next agent
  mounts a new connection and stacks its binds: the plain bind's reads fail for ever).

Each row gives the longest gap between two reads of the plain reader around the event (p50 and
max over the runs), beside the reader's usual round measured undisturbed in the same run.

    .venv/bin/python bench/rollout.py [--runs 10]
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import percentile
from tests.agent import AgentProcess, Holder, force_stop, wait_for, write_atomically
from tests.containerd.runtime import Containerd, LineClock, build_rootfs
from tests.containerd.test_takeover import (
    _directories,
    _failed,
    configmap,
    kill_pod,
    start_readers,
)
from tests.manifests import POD_UID


def generation(manifests: Path, root: Path) -> AgentProcess:
    return AgentProcess(
        manifests=manifests,
        root=root,
        extra_args=("--replace",),
        wrapper=("unshare", "--pid", "--fork", "--kill-child"),
    )


def gap_after(clock: LineClock, since: float) -> float:
    """The longest gap between two reads from `since` on."""
    times = [at for at, _ in list(clock.lines) if at >= since]
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="events of each kind (default 10)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench needs root: containerd, mounts and the agent's FUSE mount")
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(Path(tmp), args.runs)
    print(f"{'agent replaced by':<40} | {'longest read gap p50 / max':<28} | baseline")
    for what, figures, baseline in rows:
        print(f"{what:<40} | {figures:<28} | {baseline}")


def measure(tmp: Path, runs: int) -> list[tuple[str, str, str]]:
    containerd = Containerd(tmp / "containerd")
    rootfs = build_rootfs(tmp / "rootfs")
    manifests, out, slave_out = _directories(tmp)
    root = tmp / "root"
    holder = Holder(root)
    agents = [generation(manifests, root).start()]
    readers: list[str] = []
    try:
        agents[-1].wait_state(POD_UID, "config", "mounted")
        wait_for(lambda: "held by fusevol hold" in agents[-1].log_text())
        volume = agents[-1].volume(POD_UID, "configmap", "config")
        reading = start_readers(containerd, rootfs, volume, out, slave_out)
        readers.extend(reading[0])
        clock, slave_clock = reading[1:]
        clock.wait_for("ok v0 v0", after=0)
        time.sleep(2.0)
        rounds = [b - a for a, b in itertools.pairwise(at for at, _ in list(clock.lines))]
        usual = statistics.median(rounds) * 1000

        def edit_seen(n: int) -> float:
            write_atomically(manifests / "configmap.yaml", configmap(f"v{n}"))
            edited = time.monotonic()
            return (clock.wait_for(f"ok v{n} v{n}", after=edited, timeout_s=5) - edited) * 1000

        rollouts, deletions, seen = [], [], []
        n = 0
        for _ in range(runs):  # rollouts: the old generation serves until the new one asks
            n += 1
            started = time.monotonic()
            previous = agents[-1]
            agents.append(generation(manifests, root).start())  # ready: it took over
            seen.append(edit_seen(n))
            rollouts.append(gap_after(clock, started) * 1000)
            os.kill(previous.pid, signal.SIGTERM)  # the retired launcher: the old pod goes
            assert previous.process is not None
            previous.process.wait(timeout=10)
        for _ in range(runs):  # agent pod deleted: nothing overlaps, the holder keeps it
            n += 1
            killed = time.monotonic()
            kill_pod(agents[-1])
            time.sleep(0.5)
            agents.append(generation(manifests, root).start())
            seen.append(edit_seen(n))
            deletions.append(gap_after(clock, killed) * 1000)
        failed_with_holder = _failed(clock), _failed(slave_clock)

        # The baseline: the same deletion with no holder (the chart before it).
        holder.stop()
        killed = time.monotonic()
        kill_pod(agents[-1])
        time.sleep(0.5)
        agents.append(generation(manifests, root).start())
        time.sleep(3.0)
        lines = [line for at, line in list(clock.lines) if at >= killed]
        slave_lines = [line for at, line in list(slave_clock.lines) if at >= killed]
        failed = sum(1 for line in lines if not line.startswith("ok "))
        slave_failed = sum(1 for line in slave_lines if not line.startswith("ok "))
    finally:
        for name in readers:
            containerd.remove(name)
        for agent in agents:
            force_stop(agent)
        holder.stop()
        containerd.stop()

    def figures(gaps: list[float]) -> str:
        return f"{percentile(gaps, 0.5):.0f} / {max(gaps):.0f} ms ({max(gaps) / usual:.0f}x)"

    baseline = f"a read every {usual:.0f} ms undisturbed"
    return [
        (f"rollout (overlap), {runs}x", figures(rollouts), baseline),
        (f"agent pod deleted, holder, {runs}x", figures(deletions), baseline + " (+500 ms wait)"),
        (
            "failed reads through all of those",
            f"{failed_with_holder[0]} plain, {failed_with_holder[1]} rslave",
            f"edits seen in {min(seen):.0f}-{max(seen):.0f} ms",
        ),
        (
            "agent pod deleted, no holder (before)",
            f"{failed} of {len(lines)} reads failed",
            f"rslave: {slave_failed} of {len(slave_lines)} failed in 3 s",
        ),
    ]


if __name__ == "__main__":
    main()
