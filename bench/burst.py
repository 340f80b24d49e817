"""Burst: 10 edits, 0.2 s apart, of one 64 KiB ConfigMap that N pods use (row 4b of
`python -m bench`).

For each N, in one run: the real agent serves N pods sharing the ConfigMap; each edit is saved to
the manifest directory 0.2 s after the previous one; recorded are the time until pod 0 reads the
new value, then pod N-1 (every pod's bind shows the same subtree: they switch at one instant),
and until a sweep of every pod's directory has read it (an upper bound: the sweep of N files
through N binds included, reported at rest beside it). The first edit costs as much as any
other: an edit must not wait behind per-pod work that the previous one started. Baseline: the
same burst at N=1. `setup_ratio` times set-up and tear-down alone at two sizes (linear: a ratio
of the per-volume times near 1). Memory: the agent's RSS once the pods are set up and it has
been idle for `SETTLE_S`, less its RSS before the pods came, per pod volume (the ConfigMap is
there before, so this is beyond the content); its helper processes' apart.

    .venv/bin/python bench/burst.py [--pods 1 2000] [--edits 10]     (root: mounts)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import AGENT_ARGS, agent_pid, agent_root, helper_pids, rss_mib
from tests.agent import running_agent, wait_for, write_atomically

if TYPE_CHECKING:
    from tests.agent import AgentProcess

SIZE = 64 * 1024
INTERVAL_S = 0.2
SETTLE_S = 3.0
"""Idle time after set-up before RSS is read: the status snapshot that follows set-up included."""


def uid(i: int) -> str:
    return f"b0b0b0b0-0000-4000-8000-{i:012d}"


def configmap(value: str) -> str:
    blob = "x" * SIZE
    return f"kind: ConfigMap\nmetadata: {{name: busy}}\ndata:\n  v: '{value}'\n  blob: '{blob}'\n"


def pods(n: int) -> str:
    return "".join(
        f"kind: Pod\nmetadata: {{name: p{i}, uid: {uid(i)}}}\n"
        "spec:\n  containers: [{name: c}]\n  volumes: [{name: config, configMap: {name: busy}}]\n"
        "---\n"
        for i in range(n)
    )


@dataclass(frozen=True)
class Result:
    setup_s: float
    teardown_s: float
    first_s: list[float]
    """Per edit: from the save until pod 0 reads it."""
    last_s: list[float]
    """Per edit: from the save until the last pod (N-1) reads it, read right after pod 0."""
    all_s: list[float]
    """Per edit: from the save until a sweep of every pod has read it (the sweep's own time,
    N reads through N binds, included: `sweep_s` is that time at rest)."""
    sweep_s: float
    """A sweep of every pod with nothing changing."""
    rss_kib_per_volume: float
    """The agent's RSS growth from no pods to N set-up pods, per pod volume (module docstring)."""
    helpers_rss_kib_per_volume: float
    """The same for its helper processes, together."""


def measure(n: int, edits: int = 10) -> Result:
    with tempfile.TemporaryDirectory() as tmp, agent_root(Path(tmp)) as root:
        manifests = Path(tmp) / "manifests"
        manifests.mkdir()
        (manifests / "cm.yaml").write_text(configmap("v0"))
        with running_agent(manifests, root, *AGENT_ARGS) as agent:
            keys = [agent.volume(uid(i), "configmap", "config") / "v" for i in range(n)]
            time.sleep(1.0)  # its start-up's work done
            rss_before = _rss(agent)
            started = time.perf_counter()
            (manifests / "pods.yaml").write_text(pods(n))
            for key in keys:
                wait_for(key.exists, timeout_s=1200, interval_s=0.01)
            setup = time.perf_counter() - started
            time.sleep(SETTLE_S)
            rss_after = _rss(agent)
            started = time.perf_counter()
            for key in keys:
                key.read_text()
            sweep = time.perf_counter() - started
            alls: list[float] = []
            firsts: list[float] = []
            lasts: list[float] = []
            next_save = time.perf_counter() + 1.0
            for e in range(1, edits + 1):
                time.sleep(max(0.0, next_save - time.perf_counter()))
                value = f"v{e}"
                started = time.perf_counter()
                write_atomically(manifests / "cm.yaml", configmap(value))
                next_save = started + INTERVAL_S
                for key, times in ((keys[0], firsts), (keys[-1], lasts)):
                    while key.read_text() != value:
                        pass
                    times.append(time.perf_counter() - started)
                for key in keys:
                    while key.read_text() != value:
                        if time.perf_counter() - started > 120:
                            raise TimeoutError(f"edit {e} not visible in {key} after 120 s")
                alls.append(time.perf_counter() - started)
            started = time.perf_counter()
            (manifests / "pods.yaml").unlink()
            pods_dir = agent.root / "pods"
            wait_for(lambda: not any(pods_dir.iterdir()), timeout_s=1200, interval_s=0.01)
            teardown = time.perf_counter() - started
            agent.stop()
    agent_kib = (rss_after[0] - rss_before[0]) * 1024 / n
    helpers_kib = (rss_after[1] - rss_before[1]) * 1024 / n
    return Result(setup, teardown, firsts, lasts, alls, sweep, agent_kib, helpers_kib)


def _rss(agent: AgentProcess) -> tuple[float, float]:
    """(the agent's RSS, its helpers' together), MiB."""
    return rss_mib(agent_pid(agent)), sum(map(rss_mib, helper_pids(agent)))


def setup_ratio(small: int = 500, large: int = 2000) -> tuple[Result, Result]:
    """Set-up and tear-down of `small` and of `large` pods (no edits), in one run."""
    return measure(small, edits=0), measure(large, edits=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, nargs="+", default=[1, 2000])
    parser.add_argument("--edits", type=int, default=10)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (mounts)")
    print(
        f"{'pods':>5} | {'set-up':>8} | {'tear-down':>9} | {'RSS/volume':>10} | "
        "edit -> visible (ms), each edit"
    )
    for n in args.pods:
        r = measure(n, args.edits)
        each = " ".join(f"{t * 1e3:.0f}" for t in r.all_s)
        print(
            f"{n:>5} | {r.setup_s:>7.2f}s | {r.teardown_s:>8.2f}s | "
            f"{r.rss_kib_per_volume:>6.1f} KiB | "
            f"pod 0: median {statistics.median(r.first_s) * 1e3:.1f}, max "
            f"{max(r.first_s) * 1e3:.1f}; pod {n - 1}: median "
            f"{statistics.median(r.last_s) * 1e3:.1f}, max {max(r.last_s) * 1e3:.1f}; "
            f"every pod (a sweep; {r.sweep_s * 1e3:.0f} ms at rest): {each}",
            flush=True,
        )


if __name__ == "__main__":
    main()
