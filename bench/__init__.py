"""Benchmarks: `python -m bench` prints the benchmark table (bench/__main__.py).

Every figure about the agent (RSS, fds, threads) is read from the agent proper, `agent_pid()`:
the child of `fusevol run`'s launcher, never the launcher itself (which holds nothing).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from tests.agent import AgentProcess

AGENT_ARGS = ("--log-level", "info")
"""The agent as deployed: the test harness's default, debug, writes a line per operation."""


def update_latencies(key: Path, update: Callable[[str], None], count: int) -> list[float]:
    """Seconds from `update(value)` until `key` reads `value`, for `count` new values, 20 ms apart
    (the reader spins: what a watcher that polls without sleeping would see)."""
    latencies = []
    for i in range(count):
        value = f"v{i}"
        started = time.perf_counter()
        update(value)
        while key.read_text() != value:
            pass
        latencies.append(time.perf_counter() - started)
        time.sleep(0.02)
    return latencies


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile: `fraction` 0.99 gives p99."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * len(ordered)) - 1)]


@contextlib.contextmanager
def tmpfs(path: Path) -> Iterator[Path]:
    """A fresh tmpfs at `path` (created, with its parents) for the block: kubelet's medium."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def agent_root(tmp: Path) -> contextlib.AbstractContextManager[Path]:
    """The agent's root for a benchmark that times pod set-up: a fresh tmpfs at `tmp/root`.

    What is timed is fusevol's work, not the node's disk. This machine's disk is an ext4 without
    a journal, whose inode allocator checks that each candidate inode was not deleted recently
    (`recently_deleted`, only without a journal) by a look-up in the buffer cache: after a few
    runs that made and removed thousands of pod directories, each mkdir scanned so much that
    set-up of 2000 pods took 2-3 times longer (perf: half of the busy time in
    `find_inode_bit`), and its figures drifted from run to run."""
    return tmpfs(tmp / "root")


def agent_pid(agent: AgentProcess) -> int:
    """The agent proper: the launcher's (`agent.process`) child, the process that serves FUSE.
    AssertionError if it is not the launcher's child (so a figure never describes the launcher)."""
    assert agent.process is not None
    launcher = agent.process.pid
    children = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    assert str(agent.pid) in children, f"agent {agent.pid} is not a child of {launcher}"
    return agent.pid


def proc_status(pid: int) -> dict[str, str]:
    """/proc/<pid>/status as a dict of stripped values."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, v in (line.split(":", 1) for line in lines)}


def rss_mib(pid: int) -> float:
    """Resident set size of process `pid`, in MiB."""
    return int(proc_status(pid)["VmRSS"].split()[0]) / 1024


def helper_pids(agent: AgentProcess) -> list[int]:
    """The agent's own children (publisher and mount helpers), reported apart from it."""
    pid = agent_pid(agent)
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
