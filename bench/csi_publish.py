"""NodePublishVolume latency through the CSI plugin, as kubelet calls it: the real agent (the
Kubernetes API source on the loopback API server, `--csi-endpoint`), and kubelet's side of the
calls (`tests/csi/kubelet.py`: the target's directory, `vol_data.json`, the gRPC call). Beside
it, in the same run, the writer's share of kubelet's own SetUp of the same volumes: AtomicWriter
(`tests/kubelet_reference.py`) writing each to a tmpfs, as many at once as the publishes.

Each pod has 4 volumes: configMap, secret, downwardAPI and projected (configMap + secret). A
single pod's 4 publishes at once, then bursts of 20 pods (80 publishes at once, as kubelet's
operation executor makes them). The time is from the call to its answer, per publish.

    .venv/bin/python bench/csi_publish.py [--singles 10] [--bursts 3]     (root: mounts)
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import AGENT_ARGS, percentile, tmpfs
from fusevol.model import FileProjection
from tests import kubelet_reference
from tests.agent import NODE, running_agent
from tests.csi.kubelet import DRIVER, Kubelet
from tests.helpers.apiserver import running_apiserver

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


@dataclass
class Latencies:
    """Seconds per publish (fusevol) and per AtomicWriter write (kubelet's writer)."""

    single: dict[str, list[float]] = field(default_factory=lambda: {"fusevol": [], "kubelet": []})
    burst: dict[str, list[float]] = field(default_factory=lambda: {"fusevol": [], "kubelet": []})


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


def measure(*, singles: int, bursts: int) -> Latencies:
    result = Latencies()
    with tempfile.TemporaryDirectory() as tmp, running_apiserver() as api:
        base = Path(tmp)
        kubelet_dir = base / "kubelet"
        kubelet_dir.mkdir()
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
            concurrent.futures.ThreadPoolExecutor(80) as threads,
        ):
            kubelet = Kubelet(kubelet_dir, socket, NODE)
            try:
                rounds = [("single", 1)] * (singles + 1) + [("burst", 20)] * bursts
                for number, (kind, pods) in enumerate(rounds):
                    made = [_pod(number * 100 + i) for i in range(pods)]
                    for pod in made:
                        api.create(pod)
                    time.sleep(0.2)  # the agent's watch has the pods, as kubelet's has
                    calls = [(pod, name) for pod in made for name in VOLUMES]
                    published = list(threads.map(lambda c: _timed(kubelet.publish, *c), calls))
                    writes = [
                        (written / f"{number}" / pod["metadata"]["name"] / n, n) for pod, n in calls
                    ]
                    wrote = list(threads.map(lambda w: _timed(_write, *w), writes))
                    if number == 0:
                        continue  # warm-up: the first publish opens the watches
                    getattr(result, kind)["fusevol"].extend(published)
                    getattr(result, kind)["kubelet"].extend(wrote)
            finally:
                kubelet.close()
            agent.stop()
    return result


def report(result: Latencies) -> None:
    print("NodePublishVolume, call to answer, per volume (4 volumes a pod, all published at once)")
    print(f"{'':<24} {'fusevol p50':>11} {'p90':>8} {'writer p50':>11} {'p90':>8} {'x writer':>9}")
    for what, samples in (("one pod", result.single), ("20 pods at once", result.burst)):
        f, k = samples["fusevol"], samples["kubelet"]
        print(
            f"{what:<24} {statistics.median(f) * 1e3:>9.1f}ms {percentile(f, 0.9) * 1e3:>6.1f}ms "
            f"{statistics.median(k) * 1e3:>9.1f}ms {percentile(k, 0.9) * 1e3:>6.1f}ms "
            f"{statistics.median(f) / statistics.median(k):>9.1f}"
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
