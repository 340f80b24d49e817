"""Update propagation from the API: ConfigMap written to the API server -> new content visible.

Runs the real agent (`--kubeconfig`, default Watch change detection) against the loopback API
server of the tests (`tests/helpers/apiserver.py`: the real wire protocol, the real `kubernetes`
client), updates the ConfigMap N times through the server, and measures, for each write, the time
until `cat <pod volume>/key` returns the new value: watch event -> store -> reconciler -> new
version published through the FUSE mount. Prints p50/p99 (and the median of the first 20 writes)
beside kubelet's documented bound (sync period + watch propagation, 60-120 s by default).

    .venv/bin/python bench/api_latency.py [--updates 100]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import AGENT_ARGS, percentile, update_latencies
from tests.agent import NODE, running_agent, wait_for
from tests.helpers.apiserver import running_apiserver

UID = "bbbbbbbb-0000-4000-8000-000000000002"


def configmap(value: str) -> dict[str, object]:
    return {"kind": "ConfigMap", "metadata": {"name": "bench"}, "data": {"key": value}}


POD = {
    "kind": "Pod",
    "metadata": {"name": "bench", "uid": UID},
    "spec": {
        "nodeName": NODE,
        "containers": [{"name": "c"}],
        "volumes": [{"name": "config", "configMap": {"name": "bench"}}],
    },
}


def measure(updates: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp, running_apiserver() as api:
        api.create(configmap("start"))
        api.create(POD)
        kubeconfig = api.write_kubeconfig(Path(tmp) / "kubeconfig")
        with running_agent(
            None, Path(tmp) / "root", "--kubeconfig", str(kubeconfig), *AGENT_ARGS
        ) as agent:
            key = agent.volume(UID, "configmap", "config") / "key"
            wait_for(lambda: key.read_text() == "start")
            latencies = update_latencies(key, lambda value: api.update(configmap(value)), updates)
            agent.stop()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--updates", type=int, default=100)
    args = parser.parse_args()
    measured = measure(args.updates)
    latencies = sorted(measured)
    p50 = statistics.median(latencies)
    p99 = percentile(latencies, 0.99)
    first20 = statistics.median(measured[:20])
    print(f"{'update propagation (API write -> visible)':<48} {'p50':>9} {'p99':>9}")
    label = f"fusevol, {args.updates} updates"
    print(f"{label:<48} {p50 * 1e3:>7.2f}ms {p99 * 1e3:>7.2f}ms")
    print(f"{'fusevol, median of the first 20 updates':<48} {first20 * 1e3:>7.2f}ms")
    print(f"{'kubelet, documented bound (sync + watch delay)':<48} {'60-120s':>9}")
    print(f"ratio kubelet lower bound / fusevol p99: {60 / p99:,.0f}x")


if __name__ == "__main__":
    main()
