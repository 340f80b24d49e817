"""The benchmark table: every row is fusevol beside a baseline measured in the same run.

    .venv/bin/python -m bench [--quick]          (root: real mounts and the real agent)

Rows, each from one module of this package (run alone for details):
  1-2  hot and cold read of a 1 KiB key, vs the same layout on tmpfs        read_path.py
  1b   first reads of 100 keys after an update (on ..data's inotify event)  first_read.py
       and after set-up, vs the same on tmpfs
  1c   hot read of a 1 KiB key on an audited volume (each open recorded)    audited_read.py
       vs an unaudited volume of the same agent, and tmpfs
  3    update propagation, manifest save -> visible, p50/p99 of 100         update_latency.py
       and API write -> visible (a loopback API server), p50/p99 of 100     api_latency.py
  4    fan-out: N pods on one 256 KiB ConfigMap vs N AtomicWriter copies    fanout.py
  4b   burst: 10 edits 0.2 s apart of a 64 KiB ConfigMap 2000 pods use,    burst.py
       vs the same burst with 1 pod; set-up, tear-down and the agent's RSS
       per pod volume with 2000 pods vs 500
  5    one pod with 100 ConfigMap volumes: all ready                        many_volumes.py
  5b   NodePublishVolume, one pod and 20 at once, vs a CSI plugin that     csi_publish.py
       only binds (bench/csi_floor.py) and AtomicWriter's writes
  6    cold stat+open+close throughput, caches dropped, 1 and 4 clients,    cold_throughput.py
       vs tmpfs and the floor (a minimal C libfuse3 server, same layout,
       its names held as fusevol's)

Run alone, not in this table (it needs containerd and runc): reader pauses when the agent is
replaced (a rollout, a deleted agent pod with and without the holder)         rollout.py
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

from bench import (
    api_latency,
    audited_read,
    burst,
    cold_throughput,
    csi_publish,
    fanout,
    first_read,
    many_volumes,
    percentile,
    read_path,
    update_latency,
)


def _row(what: str, fusevol: str, baseline: str, ratio: str) -> None:
    print(f"{what:<44} | {fusevol:<24} | {baseline:<30} | {ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations, pods up to 100")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench needs root: it mounts tmpfs and runs the agent's FUSE mount")
    started = time.monotonic()
    iterations, versions = (10_000, 20) if args.quick else (50_000, 50)
    edits = 30 if args.quick else 100
    fanout_pods = (10, 100) if args.quick else (10, 100, 1000)

    with tempfile.TemporaryDirectory() as tmp:
        setups, _ = read_path.run(Path(tmp), iterations=iterations, versions=versions)
    first = first_read.measure(versions=versions // 2, pods=5 if args.quick else 20)
    audited = audited_read.measure(2000 if args.quick else 10_000)
    updates = update_latency.measure(edits)
    api_updates = api_latency.measure(edits)
    fan = [(n, fanout.fusevol(n), fanout.kubelet(n)) for n in fanout_pods]
    burst_pods = 100 if args.quick else 2000
    one = burst.measure(1)
    many = burst.measure(burst_pods)
    setup_pods = (25, 100) if args.quick else (500, 2000)
    small, large = burst.setup_ratio(*setup_pods)
    hundred = many_volumes.measure(100, 3 if args.quick else 5)
    publishes = csi_publish.measure(singles=5 if args.quick else 10, bursts=2 if args.quick else 3)
    cold = cold_throughput.measure(2000, 3 if args.quick else 5)

    _row("row", "fusevol", "baseline (same run)", "fusevol vs baseline")
    print("-" * 120)
    tmpfs_setup, fusevol_setup = setups
    for label, attr in (("hot", "hot_ns"), ("cold", "cold_ns")):
        f = statistics.median(getattr(fusevol_setup, attr)) / 1e3
        t = statistics.median(getattr(tmpfs_setup, attr)) / 1e3
        what = f"1-2 {label} read, 1 KiB key, open+read+close"
        _row(what, f"{f:.1f} µs", f"tmpfs, kubelet layout {t:.1f} µs", f"{f / t:.2f}x the time")
    for label, samples in (("update", first.update), ("set-up", first.setup)):
        f, t = (statistics.median(samples[side]) / 1e3 for side in ("fusevol", "tmpfs"))
        what = f"1b  first read of each key after {label}"
        _row(what, f"{f:.1f} µs", f"tmpfs, kubelet layout {t:.1f} µs", f"{f / t:.2f}x the time")
    median, p90 = audited.ratio()
    _row(
        "1c  audited hot read, 1 KiB key, o+r+c",
        f"p50 {audited.median_us('audited'):.1f} µs, p90 {audited.p90_us('audited'):.1f}",
        f"unaudited, same agent: p50 {audited.median_us('unaudited'):.1f} µs, "
        f"p90 {audited.p90_us('unaudited'):.1f}",
        f"{median:.0f}x the time (p50), {p90:.0f}x (p90)",
    )
    _row(
        "    audited read: records per open",
        f"{audited.records_per_open('audited'):.2f} (unaudited "
        f"{audited.records_per_open('unaudited'):.2f})",
        f"tmpfs, kubelet layout p50 {audited.median_us('tmpfs'):.1f} µs",
        f"unaudited {audited.median_us('unaudited') / audited.median_us('tmpfs'):.2f}x tmpfs, "
        f"audited {audited.median_us('audited') / audited.median_us('tmpfs'):.0f}x",
    )
    for what, latencies in (("manifest save", updates), ("API write", api_updates)):
        p50, p99 = statistics.median(latencies), percentile(latencies, 0.99)
        _row(
            f"3   update, {what} -> visible ({edits})",
            f"p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms",
            "kubelet bound 60-120 s (doc.)",
            f"{60 / p99:,.0f}x faster (p99 vs 60 s)",
        )
    for n, (setup, base_rss, rss, update), (k_setup, k_update, k_bytes) in fan:
        _row(
            f"4   fan-out {n} pods, 256 KiB CM: set-up",
            f"{setup:.2f} s, RSS +{rss - base_rss:.1f} MiB",
            f"{k_setup:.2f} s, {k_bytes / 2**20:.0f} MiB written",
            f"{setup / k_setup:.2f}x the time, 0 bytes written",
        )
        _row(
            f"    fan-out {n} pods: one update to all",
            f"{update * 1e3:.0f} ms, 0 bytes written",
            f"{k_update * 1e3:.0f} ms, {k_bytes / 2**20:.0f} MiB written",
            f"{update / k_update:.2f}x the time",
        )
    med = statistics.median
    _row(
        f"4b  burst of 10 edits, {burst_pods} pods: visible",
        f"pod 0 median {med(many.first_s) * 1e3:.1f} ms, max {max(many.first_s) * 1e3:.0f}; "
        f"pod {burst_pods - 1} median {med(many.last_s) * 1e3:.1f} ms",
        f"1 pod: median {med(one.first_s) * 1e3:.1f} ms, max {max(one.first_s) * 1e3:.0f}",
        f"{med(many.last_s) / med(one.first_s):.2f}x the time (median, last pod)",
    )
    _row(
        f"    burst, {burst_pods} pods: a sweep of every pod",
        f"median {med(many.all_s) * 1e3:.0f} ms, max {max(many.all_s) * 1e3:.0f}",
        f"the same sweep at rest {many.sweep_s * 1e3:.0f} ms",
        f"{med(many.all_s) / many.sweep_s:.2f}x the sweep at rest",
    )
    _row(
        f"    RSS per pod volume, {setup_pods[1]} pods",
        f"agent +{large.rss_kib_per_volume:.1f} KiB, helpers "
        f"+{large.helpers_rss_kib_per_volume:.1f}",
        f"{setup_pods[0]} pods: agent +{small.rss_kib_per_volume:.1f} KiB",
        f"{large.rss_kib_per_volume / small.rss_kib_per_volume:.2f}x per volume",
    )
    for label, attr in (("set-up", "setup_s"), ("tear-down", "teardown_s")):
        t_small, t_large = getattr(small, attr), getattr(large, attr)
        _row(
            f"    {label} of {setup_pods[1]} pods (one volume each)",
            f"{t_large / setup_pods[1] * 1e3:.2f} ms/volume ({t_large:.2f} s)",
            f"{setup_pods[0]} pods: {t_small / setup_pods[0] * 1e3:.2f} ms/volume",
            f"t({setup_pods[1]})/t({setup_pods[0]}) = {t_large / t_small:.2f}",
        )
    _row(
        "5   one pod, 100 ConfigMap volumes: ready",
        f"{hundred.fusevol_s * 1e3:.0f} ms (median of {len(hundred.runs_s)})",
        "kubelet 22-24 s p90 (perf tests)",
        f"{22 / hundred.fusevol_s:.0f}x faster; writer alone "
        f"{hundred.kubelet_writer_s * 1e3:.0f} ms",
    )
    for what, timings in (
        ("one pod, its last volume", publishes.single_pod),
        ("20 pods at once, per pod", publishes.burst_pod),
    ):
        f, c, w = (statistics.median(timings[side]) for side in csi_publish.SIDES)
        _row(
            f"5b  NodePublishVolume, {what}, p50",
            f"{f * 1e3:.1f} ms",
            f"CSI floor {c * 1e3:.1f} ms; AtomicWriter {w * 1e3:.1f} ms",
            f"{f / c:.2f}x the floor",
        )
    for clients in cold_throughput.CLIENTS:
        f = statistics.median(cold.fusevol[clients])
        t = statistics.median(cold.tmpfs[clients])
        if cold.floor:
            c = statistics.median(cold.floor[clients])
            floor, vs_floor = f"C libfuse floor {c:,.0f}", f", {f / c:.2f}x the floor"
        else:
            floor, vs_floor = f"C libfuse floor not built: {cold.floor_not_built}", ""
        _row(
            f"6   cold stat+open, {clients} client(s), {cold.keys} keys",
            f"{f:,.0f} keys/s",
            f"tmpfs {t:,.0f} keys/s; {floor}",
            f"{f / t:.2f}x tmpfs{vs_floor}",
        )
    print(f"(bench ran {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
