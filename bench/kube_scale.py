"""The Kubernetes API source at scale, against a real API server: connections, threads, RSS, time
until every volume is mounted, edit latency, and a restart of the API server.

    flock /tmp/kit.lock .venv/bin/python bench/kube_scale.py --kubeconfig K \\
        [--pods 100,1000,3000] [--edits 100] [--baseline REV --baseline-pods 600 --repeat K] \\
        [--restart-command 'CMD' --restart-pods 3000] [--server-streams 250]   (root: mounts)

Never against a cluster that matters: it creates the namespace `fusevol-bench` and deletes it at
the end (`KUBE_SCALE_KEEP_LOGS=DIR` keeps the agent's logs there, `KUBE_SCALE_LOG_LEVEL` sets their
level). For each N, N pods in it bound to the node `fusevol-bench-node` (spec.nodeName set: no
scheduler or kubelet acts on them; no service account token is mounted), each with a ConfigMap
and a Secret volume of its own: 2N watched objects. The agent runs as that node
(`--source kubernetes --kubeconfig K --node-name fusevol-bench-node`) without kubelet: it serves
the pods' volumes in pod directories itself, in a mount namespace of its own (`unshare --mount`:
thousands of binds stay out of the host's mount table; the files are read through
`/proc/<agent>/root`). Whenever the run makes new pods, an agent is run once first and its
figures dropped (the first agent after them measured more). Figures are read from the agent
proper (the launcher's child):

- mounted: from the agent's start until its `/metrics` counts all 2N volumes mounted (then its
  `/status` must show each of them `mounted`);
- TCP connections to the API server (its sockets, /proc/<pid>/fd and /proc/net/tcp), threads,
  RSS, and RSS per watched object beside an agent on an empty node (same run);
- an edit: a ConfigMap patched through the API until its file in the pod directory reads the new
  value (each edit a different ConfigMap), p50/p99 over `--edits`;
- `--restart-command` (e.g. the cluster kit's kill -9 of kube-apiserver and its start script),
  run once at `--restart-pods`: how long until every watch streams again, how many LISTs and
  connections that took, and whether any file read changed meanwhile (none may).

kubelet's figures beside, where they are known: its connections are client-go's, ceil(streams /
the server's SETTINGS_MAX_CONCURRENT_STREAMS: 250 by kube-apiserver's default), and an edit reaches
its pods at its next sync (60-120 s by default); it runs at most 110 pods a node. `--baseline REV`
runs fusevol of git revision REV (the agent before the HTTP/2 client: a connection and a thread
per watch) at `--baseline-pods` in the same run, for the ratios; `--repeat K` runs the two in
turn K times and takes each figure's median (an agent's RSS varies by 2-4 MiB from one to the
next, more than a change of a few hundred bytes per object).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import itertools
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import kubernetes
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import agent_pid, percentile, proc_status, rss_mib
from fusevol.kube.configuration import load_configuration
from tests.agent import AgentProcess, wait_for

if TYPE_CHECKING:
    from collections.abc import Callable

NAMESPACE = "fusevol-bench"
NODE = "fusevol-bench-node"
SERVER_STREAMS = 250
"""kube-apiserver's SETTINGS_MAX_CONCURRENT_STREAMS when --http2-max-streams-per-connection is
unset (k8s.io/apiserver secure_serving.go)."""
OTHER_WATCHES = 3
"""The node's pods, the PVs it provisioned, the claims selected for it."""


@dataclass
class Row:
    label: str
    pods: int
    mounted_s: float
    connections: int
    threads: int
    rss_mib: float
    edit_p50_ms: float
    edit_p99_ms: float

    @property
    def objects(self) -> int:
        return 2 * self.pods

    def kib_per_object(self, empty_rss_mib: float) -> float:
        """RSS beyond an agent on an empty node, per watched object."""
        return (self.rss_mib - empty_rss_mib) * 1024 / self.objects


class Cluster:
    """The bench's own side of the API: the `kubernetes` client, not the code measured."""

    def __init__(self, kubeconfig: Path) -> None:
        config = load_configuration(kubeconfig)  # the agent's: its keys never in $TMPDIR files
        config.connection_pool_maxsize = 32
        self.server = urllib.parse.urlsplit(config.host)
        self.core: Any = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(config))
        self.pods = 0
        self.uids: dict[int, str] = {}

    def ensure_namespace(self) -> None:
        """The bench's namespace, new (one still being deleted is waited for)."""
        self._wait_namespace_gone()
        self.core.create_namespace({"metadata": {"name": NAMESPACE}})

    def _wait_namespace_gone(self) -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                namespace = self.core.read_namespace(NAMESPACE)
            except kubernetes.client.ApiException as exc:
                if exc.status == 404:
                    return
                raise
            if namespace.status.phase != "Terminating":
                self.core.delete_namespace(NAMESPACE)
            time.sleep(1)
        raise TimeoutError(f"namespace {NAMESPACE} still there after 600 s")

    def resize(self, pods: int) -> None:
        """Exactly N pods with their objects (ConfigMaps and Secrets are kept once made)."""

        def create(i: int) -> None:
            for make, name, body in (
                (self.core.create_namespaced_config_map, f"cm-{i}", {"data": {"a": "0"}}),
                (self.core.create_namespaced_secret, f"s-{i}", {"stringData": {"k": f"s{i}"}}),
            ):
                try:
                    make(NAMESPACE, {"metadata": {"name": name}, **body})
                except kubernetes.client.ApiException as exc:
                    if exc.status != 409:
                        raise
            self.uids[i] = self.core.create_namespaced_pod(NAMESPACE, _pod(i)).metadata.uid

        def delete(i: int) -> None:
            self.core.delete_namespaced_pod(f"p-{i}", NAMESPACE, grace_period_seconds=0)
            del self.uids[i]

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(create, range(self.pods, pods)))
            list(pool.map(delete, range(pods, self.pods)))
        self.pods = pods

    def edit(self, i: int, value: str) -> None:
        self.core.patch_namespaced_config_map(f"cm-{i}", NAMESPACE, {"data": {"a": value}})

    def delete_all(self) -> None:
        """The namespace and everything in it (its pods at once: no kubelet confirms them)."""
        self.core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)
        self.core.delete_namespace(NAMESPACE)
        self._wait_namespace_gone()
        self.pods = 0


def _pod(i: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"p-{i}"},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": "busybox"}],
            "volumes": [
                {"name": "config", "configMap": {"name": f"cm-{i}"}},
                {"name": "creds", "secret": {"secretName": f"s-{i}"}},
            ],
        },
    }


class Agent:
    """The agent on the bench's node, in a mount namespace of its own."""

    def __init__(
        self, tmp: Path, kubeconfig: Path, uids: dict[int, str], *, pythonpath: Path | None = None
    ) -> None:
        self.uids = uids
        # PYTHONSAFEPATH: `python -m` would put the working directory (this checkout) first.
        env = None if pythonpath is None else {"PYTHONPATH": str(pythonpath), "PYTHONSAFEPATH": "1"}
        self.process = AgentProcess(
            manifests=None,
            root=tmp / "root",
            extra_args=(
                "--source",
                "kubernetes",
                "--kubeconfig",
                str(kubeconfig),
                "--node-name",
                NODE,
                "--log-level",
                os.environ.get("KUBE_SCALE_LOG_LEVEL", "info"),
            ),
            env=env,
            wrapper=("unshare", "--mount", "--propagation", "private"),
        )
        self.process.root.mkdir()
        self.started = 0.0
        self._metrics_url = ""

    def start(self) -> None:
        self.started = time.monotonic()
        self.process.start()

    @property
    def pid(self) -> int:
        return agent_pid(self.process)

    def path(self, i: int, plugin: str, volume: str, key: str) -> Path:
        inside = self.process.volume(self.uids[i], plugin, volume) / key
        return Path(f"/proc/{self.pid}/root{inside}")

    def states(self) -> list[str]:
        code, body = self.process.http_get("/status")
        assert code == 200, body
        return [v["state"] for p in json.loads(body)["pods"] for v in p["volumes"]]

    def statistics(self) -> dict[str, Any]:
        return self.process.live_statistics()

    def api_streams(self) -> int:
        """The requests and watches open on the agent's API connections (`/metrics`)."""
        streams = [value for name, _, value in self._metrics() if name == "fusevol_api_streams"]
        assert len(streams) == 1, "no fusevol_api_streams in /metrics"
        return int(streams[0])

    def mounted(self) -> int:
        """The volumes in the actual state of world (kubelet's `volume_manager_total_volumes`,
        from `/metrics`)."""
        return int(
            sum(
                value
                for name, labels, value in self._metrics()
                if name == "volume_manager_total_volumes"
                and labels.get("state") == "actual_state_of_world"
            )
        )

    def _metrics(self) -> list[tuple[str, dict[str, str], float]]:
        """`/metrics`' samples, what the bench polls four times a second (8 ms of the agent's
        time at 3000 pods). Not `/status`: its every volume's state took 100-270 ms of the
        agent's one thread, a third of its time through a start polled at that pace, which it
        measured."""
        if not self._metrics_url:  # the agent's port, from its log once (not at every poll)
            port = re.findall(r"http listening address=\S*:(\d+)", self.process.log_text())[-1]
            self._metrics_url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(self._metrics_url, timeout=5) as answer:
            text = answer.read().decode()
        return [
            (sample.name, sample.labels, sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        ]

    def stop(self) -> None:
        """kill -9 of the launcher: the agent dies with it, and its mount namespace with them."""
        self.process.kill()
        wait_for(lambda: not self.process.agent_alive(), timeout_s=30)


def connections(pid: int, server: urllib.parse.SplitResult) -> int:
    """The agent's established TCP connections to the API server."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    port = f"{server.port or 443:04X}"
    count = 0
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            remote, state, inode = fields[2], fields[3], fields[9]
            if inode in inodes and state == "01" and remote.endswith(f":{port}"):
                count += 1
    return count


def threads(pid: int) -> int:
    return int(proc_status(pid)["Threads"])


def measure(
    cluster: Cluster,
    kubeconfig: Path,
    pods: int,
    edits: int,
    *,
    label: str = "fusevol",
    pythonpath: Path | None = None,
    after: Callable[[Agent], None] | None = None,
) -> Row:
    grew = pods > cluster.pods
    cluster.resize(pods)
    if grew:
        # The first agent after new pods were made measured 8 MiB more RSS at 3000 pods than
        # the same code run next (124 against 116 and 116 MiB, one run; the cause not found):
        # it is run, and its figures dropped, so that every row and its baseline compare alike.
        print(f"warm-up at N={pods}:", measure(cluster, kubeconfig, pods, 2), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        agent = Agent(Path(tmp), kubeconfig, cluster.uids, pythonpath=pythonpath)
        try:
            agent.start()
            wait_for(lambda: agent.mounted() >= 2 * pods, timeout_s=600, interval_s=0.25)
            mounted_s = time.monotonic() - agent.started
            states = collections.Counter(agent.states())
            assert states == {"mounted": 2 * pods}, states
            time.sleep(2)  # what settles after the last mount (status, collections)
            pid = agent.pid
            row = Row(
                label,
                pods,
                mounted_s,
                connections(pid, cluster.server),
                threads(pid),
                rss_mib(pid),
                0.0,
                0.0,
            )
            latencies = edit_latencies(cluster, agent, pods, edits)
            row.edit_p50_ms = statistics.median(latencies) * 1e3
            row.edit_p99_ms = percentile(latencies, 0.99) * 1e3
            if after is not None:
                after(agent)
        finally:
            agent.stop()
            if keep := os.environ.get("KUBE_SCALE_KEEP_LOGS"):
                shutil.copy(agent.process.log_path, Path(keep) / f"agent-{label}-{pods}.log")
    return row


_EDITS = itertools.count()
"""Edit values, new across the agents of a run: each agent edits the same ConfigMaps."""


def edit_latencies(cluster: Cluster, agent: Agent, pods: int, edits: int) -> list[float]:
    latencies = []
    for n in range(edits):
        i = (n * 7919) % pods  # a different ConfigMap each time, spread over all of them
        key = agent.path(i, "configmap", "config", "a")
        value = f"edit-{next(_EDITS)}"  # never the value it has: a patch to it changes nothing
        started = time.perf_counter()
        cluster.edit(i, value)
        deadline = time.monotonic() + 30
        while key.read_text() != value:
            assert time.monotonic() < deadline, f"edit {n} of cm-{i} not seen in 30 s"
        latencies.append(time.perf_counter() - started)
        time.sleep(0.02)
    return latencies


@dataclass
class Restart:
    pods: int
    resumed_s: float
    """From the start of the restart command until every watch streams again."""
    ready_s: float
    """Of which: the command (kill, until the API server is ready)."""
    lists: int
    connections_made: int
    changed: int
    """Files read during the outage that differed from before it (must be 0)."""


def restart(agent: Agent, pods: int, command: str) -> Restart:
    """Run `command` (kill -9 of the API server and its restart) under a running agent."""
    before = agent.statistics()["source"]
    every = max(1, pods // 50)
    sample = [
        agent.path(i, plugin, volume, key)
        for i in range(0, pods, every)
        for plugin, volume, key in (("configmap", "config", "a"), ("secret", "creds", "k"))
    ]
    contents = [p.read_bytes() for p in sample]
    started = time.monotonic()
    proc = subprocess.Popen(["bash", "-c", command], stdout=subprocess.DEVNULL)
    changed = 0
    while proc.poll() is None:  # while the server is away and coming back: nothing changes
        changed += sum(p.read_bytes() != c for p, c in zip(sample, contents, strict=True))
        time.sleep(0.2)
    assert proc.returncode == 0, f"restart command failed: {proc.returncode}"
    ready_s = time.monotonic() - started

    watches = 2 * pods + OTHER_WATCHES
    timeline = []
    deadline = time.monotonic() + 180
    while True:  # until every watch streams again (or 180 s): the open streams, 4 times a second
        streams = agent.api_streams()
        timeline.append((time.monotonic() - started, streams))
        if streams >= watches or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    after: dict[str, Any] = agent.statistics()["source"]
    print("streams after the kill:", [(round(t, 1), n) for t, n in timeline[::4]], flush=True)
    levels = collections.Counter(
        re.sub(r"[0-9]+", "N", line.split("error=", 1)[-1])[:160]
        for line in agent.process.log_text().splitlines()
        if " WARNING " in line or " ERROR " in line
    )
    print("the agent's warnings and errors:", levels.most_common(8), flush=True)
    resumed_s = time.monotonic() - started
    changed += sum(p.read_bytes() != c for p, c in zip(sample, contents, strict=True))
    return Restart(
        pods,
        resumed_s,
        ready_s,
        after["objects"]["fetches"]
        + after["pod_lists"]
        - before["objects"]["fetches"]
        - before["pod_lists"],
        after["api"]["connections_made"] - before["api"]["connections_made"],
        changed,
    )


def empty_node_rss(kubeconfig: Path) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        agent = Agent(Path(tmp), kubeconfig, {})
        try:
            agent.start()
            time.sleep(3)
            return rss_mib(agent.pid)
        finally:
            agent.stop()


def baseline_tree(revision: str, tmp: Path) -> Path:
    """fusevol of git revision `revision`, exported to `tmp` (for PYTHONPATH)."""
    repo = Path(__file__).resolve().parent.parent
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", revision, "fusevol"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    return tmp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--pods", default="100,1000,3000")
    parser.add_argument("--edits", type=int, default=100)
    parser.add_argument("--baseline", metavar="REV", help="git revision of the agent to compare")
    parser.add_argument("--baseline-pods", type=int, default=600)
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="K",
        help="run the baseline and this code in turn K times (RSS varies 2-4 MiB an agent)",
    )
    parser.add_argument("--restart-command", help="kills the API server and restarts it")
    parser.add_argument("--restart-pods", type=int, default=0, help="default: the largest N")
    parser.add_argument(
        "--server-streams",
        type=int,
        default=SERVER_STREAMS,
        help="the API server's --http2-max-streams-per-connection, for kubelet's connections",
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench needs root: the agent mounts")
    sizes = sorted(int(n) for n in args.pods.split(","))
    restart_at = args.restart_pods or sizes[-1]
    cluster = Cluster(args.kubeconfig)
    cluster.ensure_namespace()
    rows: list[Row] = []
    restarted: list[Restart] = []
    try:
        empty_rss = empty_node_rss(args.kubeconfig)
        if args.baseline:
            with tempfile.TemporaryDirectory() as old:
                tree = baseline_tree(args.baseline, Path(old))
                for _ in range(args.repeat):
                    rows.append(
                        measure(
                            cluster,
                            args.kubeconfig,
                            args.baseline_pods,
                            args.edits,
                            label=f"fusevol {args.baseline}",
                            pythonpath=tree,
                        )
                    )
                    print(rows[-1], flush=True)
                    rows.append(measure(cluster, args.kubeconfig, args.baseline_pods, args.edits))
                    print(rows[-1], flush=True)
        for pods in sizes:
            after = None
            if args.restart_command and pods == restart_at:
                command: str = args.restart_command

                def after(agent: Agent, pods: int = pods, command: str = command) -> None:
                    restarted.append(restart(agent, pods, command))
                    print(restarted[-1], flush=True)

            rows.append(measure(cluster, args.kubeconfig, pods, args.edits, after=after))
            print(rows[-1], flush=True)
    finally:
        cluster.delete_all()
    report(rows, restarted, empty_rss, args.server_streams)


def report(
    rows: list[Row], restarted: list[Restart], empty_rss: float, server_streams: int
) -> None:
    print()
    print(f"agent on an empty node: RSS {empty_rss:.0f} MiB")
    head = (
        "agent",
        "N pods",
        "objects",
        "mounted",
        "conns",
        "threads",
        "RSS MiB",
        "KiB/object",
        "edit p50",
        "edit p99",
        "kubelet conns",
    )
    print(" | ".join(f"{h:>11}" for h in head))
    for row in rows:
        kubelet = math.ceil((row.objects + 1) / server_streams)
        cells = (
            row.label,
            row.pods,
            row.objects,
            f"{row.mounted_s:.1f}s",
            row.connections,
            row.threads,
            f"{row.rss_mib:.0f}",
            f"{row.kib_per_object(empty_rss):.1f}",
            f"{row.edit_p50_ms:.1f}ms",
            f"{row.edit_p99_ms:.1f}ms",
            kubelet,
        )
        print(" | ".join(f"{c:>11}" for c in cells))
    print(
        "kubelet: an edit reaches its pods at its next sync, 60-120 s by default; at most 110 "
        f"pods a node; conns: client-go over the server's {server_streams} streams a connection"
    )
    based = [r for r in rows if r.label != "fusevol"]
    # the rows run in turn with the baseline's come first at its N
    paired = [r for r in rows if based and r.label == "fusevol" and r.pods == based[0].pods]
    if based and paired:
        base, new = _median_row(based), _median_row(paired[: len(based)])
        medians = f" (medians of {len(based)} agents each, run in turn)" if len(based) > 1 else ""
        print(
            f"at N={base.pods}, {base.label} / fusevol{medians}: connections "
            f"{base.connections}/{new.connections} = "
            f"{base.connections / max(1, new.connections):.0f}x, threads "
            f"{base.threads}/{new.threads} = {base.threads / new.threads:.0f}x, RSS "
            f"{base.rss_mib:.1f}/{new.rss_mib:.1f} MiB = {base.rss_mib / new.rss_mib:.2f}x "
            f"({base.kib_per_object(empty_rss):.1f}/{new.kib_per_object(empty_rss):.1f} KiB per "
            "object), "
            f"mounted {base.mounted_s:.1f}/{new.mounted_s:.1f} s, "
            f"edit p99 {base.edit_p99_ms:.0f}/{new.edit_p99_ms:.0f} ms"
        )
    for r in restarted:
        print(
            f"API server restart at N={r.pods}: every watch streaming again {r.resumed_s:.1f}s "
            f"after the kill (the server ready after {r.ready_s:.1f}s), {r.lists} LISTs for "
            f"{2 * r.pods + OTHER_WATCHES} watches, {r.connections_made} new connection(s), "
            f"{r.changed} files changed meanwhile"
        )


def _median_row(rows: list[Row]) -> Row:
    """Each figure's median over `rows` (the same code at the same N)."""
    figures = {
        f.name: statistics.median(getattr(r, f.name) for r in rows)
        for f in fields(Row)
        if f.name not in ("label", "pods")
    }
    return Row(rows[0].label, rows[0].pods, **figures)


if __name__ == "__main__":
    main()
