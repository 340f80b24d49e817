"""Burst: 10 edits, 0.2 s apart, of one 64 KiB ConfigMap that N pods use (issue 18).

For each N, in one run: the real agent serves N pods sharing the ConfigMap; each edit is saved to
the manifest directory 0.2 s after the previous one; recorded are the time until pod 0 reads the
new value, and until a sweep of every pod's directory has read it (an upper bound: the sweep of
N files through N binds included). The first edit costs as much as any other: an edit must not
wait behind per-pod work that the previous one started. Baseline: the same burst at N=1.

    .venv/bin/python bench/burst.py [--pods 1 2000] [--edits 10]     (root: mounts)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import AGENT_ARGS
from tests.agent import running_agent, wait_for, write_atomically

SIZE = 64 * 1024
INTERVAL_S = 0.2


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


def measure(n: int, edits: int = 10) -> tuple[float, list[float], float, list[float]]:
    """(set-up s, seconds from each save until every pod reads the edit, tear-down s, seconds
    from each save until pod 0 reads it)."""
    with tempfile.TemporaryDirectory() as tmp:
        manifests = Path(tmp) / "manifests"
        manifests.mkdir()
        (manifests / "cm.yaml").write_text(configmap("v0"))
        with running_agent(manifests, Path(tmp) / "root", *AGENT_ARGS) as agent:
            keys = [agent.volume(uid(i), "configmap", "config") / "v" for i in range(n)]
            started = time.perf_counter()
            (manifests / "pods.yaml").write_text(pods(n))
            for key in keys:
                wait_for(key.exists, timeout_s=1200, interval_s=0.01)
            setup = time.perf_counter() - started
            latencies, firsts = [], []
            next_save = time.perf_counter() + 1.0
            for e in range(1, edits + 1):
                time.sleep(max(0.0, next_save - time.perf_counter()))
                value = f"v{e}"
                started = time.perf_counter()
                write_atomically(manifests / "cm.yaml", configmap(value))
                next_save = started + INTERVAL_S
                while keys[0].read_text() != value:
                    pass
                firsts.append(time.perf_counter() - started)
                for key in keys:
                    while key.read_text() != value:
                        if time.perf_counter() - started > 120:
                            raise TimeoutError(f"edit {e} not visible in {key} after 120 s")
                latencies.append(time.perf_counter() - started)
            started = time.perf_counter()
            (manifests / "pods.yaml").unlink()
            pods_dir = agent.root / "pods"
            wait_for(lambda: not any(pods_dir.iterdir()), timeout_s=1200, interval_s=0.01)
            teardown = time.perf_counter() - started
            agent.stop()
    return setup, latencies, teardown, firsts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, nargs="+", default=[1, 2000])
    parser.add_argument("--edits", type=int, default=10)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (mounts)")
    print(f"{'pods':>5} | {'set-up':>8} | {'tear-down':>9} | edit -> all pods (ms), each edit")
    for n in args.pods:
        setup, latencies, teardown, firsts = measure(n, args.edits)
        each = " ".join(f"{t * 1e3:.0f}" for t in latencies)
        print(
            f"{n:>5} | {setup:>7.2f}s | {teardown:>8.2f}s | "
            f"median {statistics.median(latencies) * 1e3:.0f}, "
            f"max {max(latencies) * 1e3:.0f}: {each}; pod 0 alone: median "
            f"{statistics.median(firsts) * 1e3:.0f}, max {max(firsts) * 1e3:.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
