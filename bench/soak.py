"""Soak: churn pods and objects for N minutes; resources must stay flat.

The real agent on a temporary manifest directory. Each cycle: PODS pods appear (each with a
configMap, a secret, a projected and an emptyDir volume), their ConfigMap and Secret are edited
EDITS times while reader processes read every volume, then every pod goes. At the end of each
cycle, once the agent is idle again, a checkpoint records what the agent holds (read from the
agent proper, the launcher's child; its helpers' RSS apart): RSS, open file descriptors,
threads, child processes, mounts under its root, FUSE tree inodes and staged nodes.
Every checkpoint describes the same state (no pods), so fds, children, mounts and FUSE inodes
must be equal at each; threads vary with trio's idle thread cache (its threads exit after 10 s
idle), and RSS grows while the allocator warms up, so RSS must be flat over the second half.

    .venv/bin/python bench/soak.py [--minutes 5] [--pods 20] [--edits 10] [--trace]   (root)

With `--trace` the agent traces its allocations (`fusevol.base.heap.TRACEMALLOC_ENV`: this
costs memory, so its RSS figures are not the agent's usual ones) and a snapshot is taken at every
checkpoint; at the end the allocations that grew from the half-way checkpoint to the last are
printed, by line: what to fix when RSS is not flat.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
import tracemalloc
from dataclasses import astuple, dataclass, fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import AGENT_ARGS, agent_pid, helper_pids, proc_status, rss_mib
from fusevol.base.heap import TRACEMALLOC_ENV
from tests.agent import AgentProcess, mounts_below, running_agent, wait_for, write_atomically

RSS_GROWTH_LIMIT_MIB = 1.0
"""Allowed RSS growth over the second half of the checkpoints: allocator noise, not a leak."""
VARYING = ("rss_mib", "anon_mib", "shmem_mib", "helpers_rss_mib", "threads")
"""Not compared for equality (see the module docstring)."""


@dataclass(frozen=True)
class Checkpoint:
    rss_mib: float
    anon_mib: float
    """Of `rss_mib`: the heap and stacks (RssAnon)."""
    shmem_mib: float
    """Of `rss_mib`: the FUSE tree's memfd journal, mapped (RssShmem)."""
    helpers_rss_mib: float
    fds: int
    threads: int
    children: int
    mounts: int
    inodes: int
    staged: int


def uid(i: int) -> str:
    return f"50a50a50-0000-4000-8000-{i:012d}"


def pod(i: int) -> str:
    return f"""kind: Pod
metadata: {{name: soak-{i}, uid: {uid(i)}}}
spec:
  containers: [{{name: c}}]
  volumes:
    - {{name: config, configMap: {{name: soak-{i % 4}}}}}
    - {{name: creds, secret: {{secretName: soak}}}}
    - name: all
      projected:
        sources:
          - configMap: {{name: soak-{i % 4}}}
          - downwardAPI: {{items: [{{path: name, fieldRef: {{fieldPath: metadata.name}}}}]}}
    - {{name: scratch, emptyDir: {{}}}}
"""


def objects(version: int) -> str:
    configmaps = "".join(
        f"kind: ConfigMap\nmetadata: {{name: soak-{n}}}\n"
        f"data: {{a: '{version}-{'x' * 2000}', b: '{version}'}}\n---\n"
        for n in range(4)
    )
    secret = f"kind: Secret\nmetadata: {{name: soak}}\nstringData: {{token: 't{version}'}}\n"
    return configmaps + secret


def checkpoint(agent: AgentProcess) -> Checkpoint:
    pid = agent_pid(agent)
    status = proc_status(pid)
    helpers = helper_pids(agent)
    tree = agent.snapshot()["statistics"]["fuse_tree"]
    return Checkpoint(
        rss_mib=rss_mib(pid),
        anon_mib=int(status["RssAnon"].split()[0]) / 1024,
        shmem_mib=int(status["RssShmem"].split()[0]) / 1024,
        helpers_rss_mib=sum(rss_mib(h) for h in helpers),
        fds=len(os.listdir(f"/proc/{pid}/fd")),
        threads=int(status["Threads"]),
        children=len(helpers),
        mounts=len(mounts_below(agent.root)) - 1,  # the agent's own FUSE mount
        inodes=tree["nodes"],
        staged=tree["staged"],
    )


def readers(agent: AgentProcess, pods: range) -> subprocess.Popen[bytes]:
    """One process reading every key of every volume in a loop, until killed."""
    paths = [
        str(agent.volume(uid(i), plugin, name))
        for i in pods
        for plugin, name in (("configmap", "config"), ("secret", "creds"), ("projected", "all"))
    ]
    script = (
        "import os, sys\n"
        "while True:\n"
        "    for d in sys.argv[1:]:\n"
        "        try:\n"
        "            for n in os.listdir(d):\n"
        "                if not n.startswith('..'):\n"
        "                    open(os.path.join(d, n), 'rb').read()\n"
        "        except OSError:\n"
        "            pass\n"
    )
    return subprocess.Popen([sys.executable, "-c", script, *paths])


def cycle(agent: AgentProcess, manifests: Path, rng: random.Random, pods: int, edits: int) -> int:
    """One cycle of churn; returns the last object version written."""
    version = int(time.time() * 1000)
    chosen = range(pods)
    for i in chosen:
        (manifests / f"pod-{i}.yaml").write_text(pod(i))
    for i in chosen:
        agent.wait_state(uid(i), "scratch", "mounted", timeout_s=60)
        agent.wait_state(uid(i), "all", "mounted", timeout_s=60)
    reader = readers(agent, chosen)
    try:
        for _ in range(edits):
            version += 1
            write_atomically(manifests / "objects.yaml", objects(version))
            time.sleep(rng.uniform(0.01, 0.2))
            victim = rng.randrange(pods)  # one pod goes and comes back meanwhile
            (manifests / f"pod-{victim}.yaml").unlink()
            time.sleep(rng.uniform(0.0, 0.1))
            (manifests / f"pod-{victim}.yaml").write_text(pod(victim))
    finally:
        reader.kill()
        reader.wait()
    for i in chosen:
        (manifests / f"pod-{i}.yaml").unlink()
    wait_for(lambda: not any((agent.root / "pods").iterdir()), timeout_s=120)
    return version


def print_growth(traces: Path, count: int) -> None:
    """The allocations that grew from the half-way snapshot to the last, by line."""
    middle = tracemalloc.Snapshot.load(str(traces / f"{count // 2}.tracemalloc"))
    last = tracemalloc.Snapshot.load(str(traces / f"{count - 1}.tracemalloc"))
    print(f"allocations grown from checkpoint {count // 2 + 1} to {count}:")
    for stat in last.compare_to(middle, "lineno")[:15]:
        print(f"  {stat}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--pods", type=int, default=20)
    parser.add_argument("--edits", type=int, default=10)
    parser.add_argument("--trace", action="store_true", help="diff tracemalloc snapshots")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (mounts)")
    rng = random.Random(9)
    names = [f.name for f in fields(Checkpoint)]
    with tempfile.TemporaryDirectory() as tmp:
        manifests = Path(tmp) / "manifests"
        manifests.mkdir()
        (manifests / "objects.yaml").write_text(objects(0))
        traces = Path(tmp) / "traces"
        traces.mkdir()
        env = {TRACEMALLOC_ENV: str(traces)} if args.trace else None
        # A pod deleted while the readers read it: its unmount may find a file open (EBUSY) and
        # is retried 0.5 s later, as kubelet's would be (there, containers stop first).
        busy = r"unmount failed .* Device or resource busy"
        with running_agent(
            manifests, Path(tmp) / "root", *AGENT_ARGS, env=env, expect_log=(busy,)
        ) as agent:
            deadline = time.monotonic() + args.minutes * 60
            points: list[Checkpoint] = []
            print(f"{'cycle':>5} {'s':>6} " + " ".join(f"{n:>8}" for n in names))
            started = time.monotonic()
            while not points or time.monotonic() < deadline:
                cycle(agent, manifests, rng, args.pods, args.edits)
                time.sleep(3)  # old versions' grace period, then idle
                points.append(checkpoint(agent))
                if args.trace:
                    (traces / "take").touch()
                    wait_for(lambda: not (traces / "take").exists(), timeout_s=120)
                values = " ".join(f"{v:>8.1f}" for v in astuple(points[-1]))
                print(f"{len(points):>5} {time.monotonic() - started:>6.0f} {values}", flush=True)
            agent.stop()
            if args.trace:
                print_growth(traces, len(points))
    changed = [n for n in names if n not in VARYING and len({getattr(p, n) for p in points}) > 1]
    middle, last = points[len(points) // 2], points[-1]
    growth = last.rss_mib - middle.rss_mib
    threads = sorted(p.threads for p in points)
    print(
        f"{len(points)} cycles of {args.pods} pods x 4 volumes, {args.edits} edits each: "
        f"RSS {points[0].rss_mib:.1f} -> {middle.rss_mib:.1f} (half-way) -> "
        f"{last.rss_mib:.1f} MiB (of which heap {middle.anon_mib:.1f} -> {last.anon_mib:.1f}, "
        f"memfd journal {middle.shmem_mib:.1f} -> {last.shmem_mib:.1f}), "
        f"threads {threads[0]}-{threads[-1]}; "
        + ("fds, children, mounts, inodes equal at every checkpoint" if not changed else "")
        + (f"CHANGED: {changed}" if changed else "")
    )
    if changed or growth > RSS_GROWTH_LIMIT_MIB:
        sys.exit("not flat")


if __name__ == "__main__":
    main()
