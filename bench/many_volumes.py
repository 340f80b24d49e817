"""One pod with 100 ConfigMap volumes: time until every volume is ready (row 5 of
`python -m bench`).

Kubernetes' own performance tests measure 22-24 s (p90) for this with kubelet, most of it the
sync loop's pacing. Here: the real agent, from the moment the pod's manifest is saved until every
volume's key reads its value through the pod directory; beside it, the writer's share of
kubelet's cost, 100 AtomicWriter volumes written to a tmpfs (`tests/kubelet_reference.py`). The
median of RUNS runs, each with an agent of its own.

    .venv/bin/python bench/many_volumes.py [--volumes 100] [--runs 5]     (root: mounts)
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import AGENT_ARGS, agent_root, tmpfs
from fusevol.model import FileProjection
from tests import kubelet_reference
from tests.agent import running_agent, wait_for

UID = "dddddddd-0000-4000-8000-000000000001"
KUBELET_P90_S = (22.0, 24.0)
"""kubelet, one pod with 100 ConfigMap volumes, p90 in Kubernetes' own performance tests."""


@dataclass(frozen=True)
class Result:
    volumes: int
    fusevol_s: float
    """The median of the runs."""
    kubelet_writer_s: float
    runs_s: tuple[float, ...]


def manifests(n: int) -> tuple[str, str]:
    """(the ConfigMaps, the pod)."""
    configmaps = "".join(
        f"kind: ConfigMap\nmetadata: {{name: cm{i}}}\ndata: {{key: value-{i}}}\n---\n"
        for i in range(n)
    )
    volumes = "".join(f"    - {{name: v{i}, configMap: {{name: cm{i}}}}}\n" for i in range(n))
    pod = (
        f"kind: Pod\nmetadata: {{name: many, uid: {UID}}}\n"
        f"spec:\n  containers: [{{name: c}}]\n  volumes:\n{volumes}"
    )
    return configmaps, pod


def measure(n: int = 100, runs: int = 5) -> Result:
    """`runs` times, each with an agent of its own: the median (one run's figure drifts by a
    third with what the machine did just before)."""
    timed = [_once(n) for _ in range(runs)]
    fusevol_s = statistics.median(fusevol for fusevol, _ in timed)
    kubelet_s = statistics.median(kubelet for _, kubelet in timed)
    return Result(n, fusevol_s, kubelet_s, tuple(fusevol for fusevol, _ in timed))


def _once(n: int) -> tuple[float, float]:
    """(fusevol's time, the AtomicWriter's time) for one pod of `n` volumes."""
    configmaps, pod = manifests(n)
    with tempfile.TemporaryDirectory() as tmp, agent_root(Path(tmp)) as root:
        directory = Path(tmp) / "manifests"
        directory.mkdir()
        (directory / "configmaps.yaml").write_text(configmaps)
        with running_agent(directory, root, *AGENT_ARGS) as agent:
            keys = [agent.volume(UID, "configmap", f"v{i}") / "key" for i in range(n)]
            started = time.perf_counter()
            (directory / "pod.yaml").write_text(pod)
            for i, key in enumerate(keys):
                reads = functools.partial(_reads, key, f"value-{i}".encode())
                wait_for(reads, timeout_s=60, interval_s=0.001)
            fusevol_s = time.perf_counter() - started
            agent.stop()
        kubelet_s = _kubelet_writer(Path(tmp) / "kubelet", n)
    return fusevol_s, kubelet_s


def _reads(key: Path, expected: bytes) -> bool:
    try:
        return key.read_bytes() == expected
    except OSError:
        return False


def _kubelet_writer(path: Path, n: int) -> float:
    with tmpfs(path) as base:
        started = time.perf_counter()
        for i in range(n):
            volume = base / f"v{i}"
            volume.mkdir()
            kubelet_reference.write(volume, {"key": FileProjection(f"value-{i}".encode(), 0o644)})
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--volumes", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (mounts)")
    r = measure(args.volumes, args.runs)
    print(
        f"one pod, {r.volumes} ConfigMap volumes: all ready in {r.fusevol_s * 1e3:.0f} ms, "
        f"median of {len(r.runs_s)} (runs: {', '.join(f'{s * 1e3:.0f}' for s in r.runs_s)} ms) "
        f"(kubelet: {KUBELET_P90_S[0]:.0f}-{KUBELET_P90_S[1]:.0f} s p90 in Kubernetes' perf tests; "
        f"its AtomicWriter alone, on tmpfs: {r.kubelet_writer_s * 1e3:.0f} ms)"
    )


if __name__ == "__main__":
    main()
