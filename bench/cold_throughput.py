"""Cold request throughput: stat+open+close of distinct keys with the kernel's caches dropped
(row 6 of `python -m bench`), fusevol beside kubelet's layout on tmpfs, with 1 and 4 client
processes.

One ConfigMap with KEYS keys, served by the real agent and written the AtomicWriter way to a
tmpfs. For each setup and client count: `echo 3 > /proc/sys/vm/drop_caches` (the FUSE mount's
dentries, inodes and cached symlinks go; tmpfs keeps its own, which is the physical floor), then
the clients, started together, each stat+open+close their share of `vol/<key>`; throughput is
keys per second over the wall time of the slowest client. Median of REPEATS runs.

    .venv/bin/python bench/cold_throughput.py [--keys 2000] [--repeats 5]     (root: mounts)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import AGENT_ARGS, tmpfs
from fusevol.model import FileProjection
from tests import kubelet_reference
from tests.agent import running_agent, wait_for

UID = "eeeeeeee-0000-4000-8000-000000000001"
POD = f"""kind: Pod
metadata: {{name: cold, uid: {UID}}}
spec:
  containers: [{{name: c}}]
  volumes: [{{name: config, configMap: {{name: cold}}}}]
"""
CLIENTS = (1, 4)

CLIENT = r"""
import os, sys, time
paths = sys.argv[1:]
sys.stdin.readline()  # go
started = time.perf_counter()
for path in paths:
    os.stat(path)
    os.close(os.open(path, os.O_RDONLY))
print(time.perf_counter() - started, flush=True)
"""


@dataclass
class Result:
    keys: int
    fusevol: dict[int, list[float]] = field(default_factory=dict)
    """clients -> keys/s of each run."""
    tmpfs: dict[int, list[float]] = field(default_factory=dict)


def key_names(n: int) -> list[str]:
    return [f"k{i:05d}" for i in range(n)]


def configmap(n: int) -> str:
    data = "".join(f"  {key}: v\n" for key in key_names(n))
    return f"kind: ConfigMap\nmetadata: {{name: cold}}\ndata:\n{data}"


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def run_clients(volume: Path, keys: list[str], clients: int) -> float:
    """Keys per second: every key once, split between `clients` processes started together."""
    shares = [keys[i::clients] for i in range(clients)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLIENT, *(str(volume / k) for k in share)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for share in shares
    ]
    time.sleep(0.2)  # all started and waiting
    drop_caches()
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
    elapsed = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"client failed: exit status {proc.returncode}")
        elapsed.append(float(out))
    return len(keys) / max(elapsed)


def measure(n: int = 2000, repeats: int = 5) -> Result:
    result = Result(n)
    keys = key_names(n)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        manifests = base / "manifests"
        manifests.mkdir()
        (manifests / "cm.yaml").write_text(configmap(n))
        (manifests / "pod.yaml").write_text(POD)
        with (
            tmpfs(base / "kubelet") as kubelet_volume,
            running_agent(manifests, base / "root", *AGENT_ARGS) as agent,
        ):
            kubelet_reference.write(
                kubelet_volume, {key: FileProjection(b"v", 0o644) for key in keys}
            )
            volume = agent.volume(UID, "configmap", "config")
            wait_for(lambda: (volume / keys[-1]).exists(), timeout_s=30)
            for _ in range(repeats):  # interleaved, so that drift hits both alike
                for clients in CLIENTS:
                    result.tmpfs.setdefault(clients, []).append(
                        run_clients(kubelet_volume, keys, clients)
                    )
                    result.fusevol.setdefault(clients, []).append(
                        run_clients(volume, keys, clients)
                    )
            agent.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (mounts, drop_caches)")
    r = measure(args.keys, args.repeats)
    print(f"cold stat+open+close of {r.keys} distinct keys, caches dropped, median of runs")
    for clients in CLIENTS:
        f, t = statistics.median(r.fusevol[clients]), statistics.median(r.tmpfs[clients])
        print(
            f"{clients} client(s): fusevol {f:,.0f} keys/s, tmpfs {t:,.0f} keys/s "
            f"({f / t:.2f}x tmpfs)"
        )


if __name__ == "__main__":
    main()
