"""NodePublishVolume latency through the CSI plugin, as kubelet calls it: the real agent (the
Kubernetes API source on the loopback API server, `--csi-endpoint`), and kubelet's side of the
calls (`tests/csi/kubelet.py`: the target's directory, `vol_data.json`, two NodeGetCapabilities
and NodePublishVolume). Beside it, in the same run, two baselines:

- the floor (`bench/csi_floor.py`): a CSI node plugin that only binds a directory on the target,
  the least any CSI driver costs kubelet, called the same way;
- the writer's share of kubelet's own SetUp of the same volumes: AtomicWriter
  (`tests/kubelet_reference.py`) writing each to a tmpfs, as many at once as the publishes.

Each pod has 4 volumes: configMap, secret, downwardAPI and projected (configMap + secret). A
single pod's 4 publishes at once, then bursts of 20 pods (80 publishes at once, as kubelet's
operation executor makes them). The time is from the call to its answer, per publish, and per
pod the time until its last volume is answered (kubelet starts a pod's containers then). As on
a node, pods come and go: after each round its volumes are unpublished and its pods deleted, so
every round sets its volumes up anew.

    .venv/bin/python bench/csi_publish.py [--singles 10] [--bursts 3]     (root: mounts)
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import AGENT_ARGS, percentile, tmpfs
from fusevol.model import FileProjection
from tests import kubelet_reference
from tests.agent import NODE, mounts_below, running_agent
from tests.csi.kubelet import DRIVER, Kubelet
from tests.helpers.apiserver import running_apiserver

if TYPE_CHECKING:
    from collections.abc import Iterator

FLOOR = Path(__file__).resolve().parent / "csi_floor.py"
VOLUMES = {
    "config": {"configMap": {"name": "app"}},
    "creds": {"secret": {"secretName": "creds"}},
    "info": {
        "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}
    },
    "all": {
        "projected": {"sources": [{"configMap": {"name": "app"}}, {"secret": {"name": "creds"}}]}
    },
}
PAYLOADS = {
    "config": {"a": b"1", "b": b"2"},
    "creds": {"password": b"s3cret"},
    "info": {"labels": b'app="web"'},
    "all": {"a": b"1", "b": b"2", "password": b"s3cret"},
}
"""What kubelet would write for each volume."""


SIDES = ("fusevol", "floor", "writer")


@dataclass
class Latencies:
    """Seconds per publish, and per pod until its last volume was answered: fusevol's, the
    floor's (`bench/csi_floor.py`) and kubelet's writer's (AtomicWriter, per write)."""

    single: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in SIDES})
    single_pod: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in SIDES})
    burst: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in SIDES})
    burst_pod: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in SIDES})


def _pod(index: int) -> dict[str, Any]:
    volumes = [
        {
            "name": name,
            "csi": {
                "driver": DRIVER,
                "readOnly": True,
                "volumeAttributes": {"volume": json.dumps(source)},
            },
        }
        for name, source in VOLUMES.items()
    ]
    return {
        "kind": "Pod",
        "metadata": {
            "name": f"p{index}",
            "uid": f"dddddddd-0000-4000-8000-{index:012d}",
            "labels": {"app": "web"},
        },
        "spec": {"nodeName": NODE, "containers": [{"name": "c"}], "volumes": volumes},
    }


def _timed(call: Any, *args: Any) -> float:
    started = time.perf_counter()
    call(*args)
    return time.perf_counter() - started


def _write(directory: Path, name: str) -> None:
    directory.mkdir(parents=True)
    payload = {k: FileProjection(v, 0o644) for k, v in PAYLOADS[name].items()}
    kubelet_reference.write(directory, payload)


def _per_pod(calls: list[tuple[Any, str]], seconds: list[float]) -> list[float]:
    """Per pod, the time until its last volume was answered (its calls all started together)."""
    last: dict[str, float] = {}
    for (pod, _), took in zip(calls, seconds, strict=True):
        name = pod["metadata"]["name"]
        last[name] = max(last.get(name, 0.0), took)
    return list(last.values())


@contextlib.contextmanager
def _floor(base: Path, targets: Path) -> Iterator[Path]:
    """The floor (`bench/csi_floor.py`) serving on a socket in `base`, for the block; what it
    left mounted below `targets` (a run cut short) is unmounted after."""
    source = base / "floor-source"
    source.mkdir()
    socket = base / "floor-plugin" / "csi.sock"
    floor = subprocess.Popen([sys.executable, str(FLOOR), str(socket), str(source)])
    try:
        deadline = time.monotonic() + 30
        while not socket.exists():
            if floor.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"bench/csi_floor.py did not listen on {socket}")
            time.sleep(0.01)
        yield socket
    finally:
        floor.terminate()
        floor.wait()
        for target in reversed(mounts_below(targets)):
            subprocess.run(["umount", "-l", target], check=False)


def measure(*, singles: int, bursts: int) -> Latencies:
    result = Latencies()
    with tempfile.TemporaryDirectory() as tmp, running_apiserver() as api:
        base = Path(tmp)
        kubelet_dir, floor_dir = base / "kubelet", base / "kubelet-floor"
        kubelet_dir.mkdir()
        floor_dir.mkdir()
        api.create({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "1", "b": "2"}})
        secret = base64.b64encode(b"s3cret").decode()
        api.create({"kind": "Secret", "metadata": {"name": "creds"}, "data": {"password": secret}})
        kubeconfig = api.write_kubeconfig(base / "kubeconfig")
        socket = base / "plugins" / DRIVER / "csi.sock"
        args = (
            *("--kubeconfig", str(kubeconfig), "--csi-token-requests", "false"),
            *("--csi-endpoint", f"unix://{socket}", "--kubelet-dir", str(kubelet_dir)),
        )
        with (
            tmpfs(base / "tmpfs") as written,
            running_agent(None, base / "root", *args, *AGENT_ARGS) as agent,
            _floor(base, floor_dir) as floor_socket,
            concurrent.futures.ThreadPoolExecutor(80) as threads,
        ):
            kubelet = Kubelet(kubelet_dir, socket, NODE)
            floor = Kubelet(floor_dir, floor_socket, NODE)
            try:
                rounds = [("single", 1)] * (singles + 1) + [("burst", 20)] * bursts
                for number, (kind, pods) in enumerate(rounds):
                    made = [_pod(number * 100 + i) for i in range(pods)]
                    for pod in made:
                        api.create(pod)
                    time.sleep(0.2)  # the agent's watch has the pods, as kubelet's has
                    calls = [(pod, name) for pod in made for name in VOLUMES]
                    timed = {
                        "fusevol": list(threads.map(lambda c: _timed(kubelet.publish, *c), calls)),
                        "floor": list(threads.map(lambda c: _timed(floor.publish, *c), calls)),
                    }
                    writes = [
                        (written / f"{number}" / pod["metadata"]["name"] / n, n) for pod, n in calls
                    ]
                    timed["writer"] = list(threads.map(lambda w: _timed(_write, *w), writes))
                    # Pods come and go, as on a node: the next round sets its volumes up anew.
                    for plugin in (kubelet, floor):
                        list(threads.map(lambda c, p=plugin: p.unpublish(*c), calls))
                    for pod in made:
                        api.delete("Pod", "default", pod["metadata"]["name"])
                    time.sleep(0.2)  # the agent has seen the deletions
                    if number == 0:
                        continue  # warm-up: the first publish opens the watches
                    for side, seconds in timed.items():
                        getattr(result, kind)[side].extend(seconds)
                        getattr(result, f"{kind}_pod")[side].extend(_per_pod(calls, seconds))
            finally:
                kubelet.close()
                floor.close()
            agent.stop()
    return result


def report(result: Latencies) -> None:
    print(
        "NodePublishVolume, call to answer (4 volumes a pod, published at once); the floor: "
        "bench/csi_floor.py, a bare grpcio plugin that only binds"
    )
    print(
        f"{'':<30} {'fusevol p50':>11} {'p90':>8} {'floor p50':>10} {'p90':>8} "
        f"{'writer p50':>11} {'x floor':>8}"
    )
    rows = (
        ("one pod, per volume", result.single),
        ("one pod, its last volume", result.single_pod),
        ("20 pods at once, per volume", result.burst),
        ("20 pods at once, per pod", result.burst_pod),
    )
    for what, samples in rows:
        f, c, w = (samples[side] for side in SIDES)
        print(
            f"{what:<30} {statistics.median(f) * 1e3:>9.1f}ms {percentile(f, 0.9) * 1e3:>6.1f}ms "
            f"{statistics.median(c) * 1e3:>8.1f}ms {percentile(c, 0.9) * 1e3:>6.1f}ms "
            f"{statistics.median(w) * 1e3:>9.1f}ms "
            f"{statistics.median(f) / statistics.median(c):>8.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--singles", type=int, default=10, help="pods published one at a time")
    parser.add_argument("--bursts", type=int, default=3, help="bursts of 20 pods")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("csi_publish.py needs root: the agent mounts")
    report(measure(singles=args.singles, bursts=args.bursts))


if __name__ == "__main__":
    main()
