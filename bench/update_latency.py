"""Update propagation: manifest saved -> new content readable through the pod volume directory.

Runs the real agent on a temporary manifest directory and root, saves the ConfigMap N times (the
way editors do: write a temporary file, rename it into place) and measures, for each save, the
time until `cat <pod volume>/key` returns the new value. Prints p50/p99 beside kubelet's
documented bound (sync period + cache TTL, 60-120 s by default).

    .venv/bin/python bench/update_latency.py [--edits 100]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import AGENT_ARGS, percentile, update_latencies
from tests.agent import running_agent, wait_for, write_atomically

UID = "bbbbbbbb-0000-4000-8000-000000000001"
CONFIGMAP = "kind: ConfigMap\nmetadata: {{name: bench}}\ndata: {{key: '{value}'}}\n"
POD = f"""kind: Pod
metadata: {{name: bench, uid: {UID}}}
spec:
  containers: [{{name: c}}]
  volumes: [{{name: config, configMap: {{name: bench}}}}]
"""


def measure(edits: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        manifests = Path(tmp) / "manifests"
        manifests.mkdir()
        (manifests / "cm.yaml").write_text(CONFIGMAP.format(value="start"))
        (manifests / "pod.yaml").write_text(POD)
        with running_agent(manifests, Path(tmp) / "root", *AGENT_ARGS) as agent:
            key = agent.volume(UID, "configmap", "config") / "key"
            wait_for(lambda: key.read_text() == "start")
            latencies = update_latencies(
                key,
                lambda value: write_atomically(
                    manifests / "cm.yaml", CONFIGMAP.format(value=value)
                ),
                edits,
            )
            agent.stop()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--edits", type=int, default=100)
    args = parser.parse_args()
    latencies = sorted(measure(args.edits))
    p50 = statistics.median(latencies)
    p99 = percentile(latencies, 0.99)
    print(f"{'update propagation (manifest save -> visible)':<48} {'p50':>9} {'p99':>9}")
    print(f"{'fusevol, ' + str(args.edits) + ' edits':<48} {p50 * 1e3:>7.2f}ms {p99 * 1e3:>7.2f}ms")
    print(f"{'kubelet, documented bound (sync + cache TTL)':<48} {'60-120s':>9}")
    print(f"ratio kubelet lower bound / fusevol p99: {60 / p99:,.0f}x")


if __name__ == "__main__":
    main()
