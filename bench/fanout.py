"""Fan-out: N pods using one 256 KiB ConfigMap, fusevol beside a kubelet-style baseline.

For each N, in one run:
  fusevol   set-up time of N pod volumes, agent RSS, time to apply one update to all N
            (manifest saved -> every pod's `..data` switched and a sample reads the new bytes);
  kubelet   the same N volumes written the AtomicWriter way onto a tmpfs (a port of kubelet's
            writer, tests/kubelet_reference.py): time to write N copies, and the bytes written,
            for the set-up and for the update.

    .venv/bin/python bench/fanout.py [--pods 10 100 1000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import AGENT_ARGS, agent_pid, agent_root, rss_mib, tmpfs
from fusevol.model import FileProjection
from tests import kubelet_reference
from tests.agent import running_agent, wait_for, write_atomically

if TYPE_CHECKING:
    from collections.abc import Callable

SIZE = 256 * 1024


def configmap(fill: str) -> str:
    return f"kind: ConfigMap\nmetadata: {{name: big}}\ndata:\n  blob: '{fill * SIZE}'\n"


def pods(n: int) -> str:
    return "".join(
        f"""kind: Pod
metadata: {{name: p{i}, uid: cccccccc-0000-4000-8000-{i:012d}}}
spec:
  containers: [{{name: c}}]
  volumes: [{{name: config, configMap: {{name: big}}}}]
---
"""
        for i in range(n)
    )


def switched(volume: Path, old: Path) -> Callable[[], bool]:
    return lambda: (volume / "..data").readlink() != old


def fusevol(n: int) -> tuple[float, float, float, float]:
    """(set-up s, RSS MiB before pods, RSS MiB with N pods, update s)."""
    with tempfile.TemporaryDirectory() as tmp, agent_root(Path(tmp)) as root:
        manifests = Path(tmp) / "manifests"
        manifests.mkdir()
        (manifests / "cm.yaml").write_text(configmap("a"))
        with running_agent(manifests, root, *AGENT_ARGS) as agent:
            pid = agent_pid(agent)
            base_rss = rss_mib(pid)
            volumes = [
                agent.volume(f"cccccccc-0000-4000-8000-{i:012d}", "configmap", "config")
                for i in range(n)
            ]
            started = time.perf_counter()
            (manifests / "pods.yaml").write_text(pods(n))
            last = volumes[-1]
            wait_for(lambda: (last / "blob").exists(), timeout_s=600, interval_s=0.01)
            for volume in volumes:
                wait_for((volume / "blob").exists, timeout_s=600, interval_s=0.01)
            setup = time.perf_counter() - started
            rss = rss_mib(pid)
            before = {v: (v / "..data").readlink() for v in volumes}
            started = time.perf_counter()
            write_atomically(manifests / "cm.yaml", configmap("b"))
            for volume in volumes:
                wait_for(switched(volume, before[volume]), timeout_s=600, interval_s=0.0005)
            update = time.perf_counter() - started
            assert (volumes[0] / "blob").read_bytes()[:1] == b"b"
            agent.stop()
    return setup, base_rss, rss, update


def kubelet(n: int) -> tuple[float, float, int]:
    """(set-up s, update s, bytes written per pass) for N AtomicWriter copies on a tmpfs."""
    with tempfile.TemporaryDirectory() as tmp, tmpfs(Path(tmp)) as base:
        dirs = [base / f"v{i}" for i in range(n)]
        for d in dirs:
            d.mkdir()
        first = {"blob": FileProjection(b"a" * SIZE, 0o644)}
        second = {"blob": FileProjection(b"b" * SIZE, 0o644)}
        started = time.perf_counter()
        for d in dirs:
            kubelet_reference.write(d, first)
        setup = time.perf_counter() - started
        started = time.perf_counter()
        for d in dirs:
            kubelet_reference.write(d, second)
        update = time.perf_counter() - started
    return setup, update, n * SIZE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, nargs="+", default=[10, 100, 1000])
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (mounts)")
    print(
        f"{'pods':>5} | {'fusevol setup':>13} {'RSS +pods':>10} {'update all':>10} | "
        f"{'kubelet setup':>13} {'update all':>10} {'bytes/update':>12} | {'update ratio':>12}"
    )
    for n in args.pods:
        setup, base, rss, update = fusevol(n)
        k_setup, k_update, k_bytes = kubelet(n)
        print(
            f"{n:>5} | {setup:>12.2f}s {rss - base:>8.1f}Mi {update * 1e3:>8.1f}ms | "
            f"{k_setup:>12.2f}s {k_update * 1e3:>8.1f}ms {k_bytes / 2**20:>10.1f}Mi | "
            f"{k_update / update:>11.2f}x"
        )
    print("fusevol writes 0 bytes to disk or tmpfs per update; one 256 KiB copy in memory.")


if __name__ == "__main__":
    main()
