"""Audited read: the hot open+read+close of a 1 KiB key on an audited volume, beside the same read
on an unaudited volume of the same agent and on kubelet's layout on tmpfs, in one run (row 1c of
`python -m bench`).

One agent, started with `--audit secrets`, serves one pod with two volumes holding the same 1 KiB
key: a Secret volume, audited (bound from the audit file system, `fusevol/fuse/audit.py`: every
open is a FUSE request to the audit server, which writes a record before it answers), and a
ConfigMap volume, unaudited (the agent's fast path: the kernel opens the file without asking).
kubelet's layout of the same Secret volume is written to a tmpfs (`tests/kubelet_reference.py`).
One child process reads all three with os.open/os.read(4 KiB)/os.close of `vol/key`, after a
warm-up, in rounds alternating between them: per-op latency, median and p90.

A check beside the timing: the records the audit server wrote during each side's reads (new lines
of `<root>/fusevol/audit.jsonl`), per open: 1 on the audited volume, each naming its volume, key
and the reader's pid; 0 on the others.

    .venv/bin/python bench/audited_read.py [--iterations 5000]     (root: mounts)
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import AGENT_ARGS, percentile, tmpfs
from bench.read_path import Reader
from fusevol.fuse.audit_records import records_path
from fusevol.fuse.servers import AUDIT
from fusevol.model import FileProjection, PodUID
from fusevol.node import layout
from tests import kubelet_reference
from tests.agent import running_agent, wait_for

if TYPE_CHECKING:
    from tests.agent import AgentProcess

UID = PodUID("cccccccc-0000-4000-8000-0000000000a1")
VALUE = "audited-".ljust(1024, "x")
SECRET = f"kind: Secret\nmetadata: {{name: bench}}\nstringData: {{key: '{VALUE}'}}\n"
CONFIGMAP = f"kind: ConfigMap\nmetadata: {{name: bench}}\ndata: {{key: '{VALUE}'}}\n"
POD = f"""kind: Pod
metadata: {{name: bench, uid: {UID}}}
spec:
  containers: [{{name: c}}]
  volumes:
    - {{name: secret, secret: {{secretName: bench}}}}
    - {{name: config, configMap: {{name: bench}}}}
"""
ROUNDS = 5
"""Reads alternate between the three sides in this many rounds, so drift hits them alike."""
WARM_UP = 200
SIDES = ("tmpfs", "unaudited", "audited")


@dataclass
class Side:
    """One volume directory read, and what was measured on it."""

    volume: Path
    ns: list[int] = field(default_factory=list)
    records: int = 0
    """Audit records written while this side was read."""
    calls: collections.Counter[str] = field(default_factory=collections.Counter)
    """The agent's FUSE handler calls while this side was read."""


@dataclass
class AuditedReads:
    sides: dict[str, Side]

    def median_us(self, side: str) -> float:
        return statistics.median(self.sides[side].ns) / 1e3

    def p90_us(self, side: str) -> float:
        return percentile([float(ns) for ns in self.sides[side].ns], 0.9) / 1e3

    def ratio(self) -> tuple[float, float]:
        """Audited over unaudited: (of the medians, of the p90s)."""
        return (
            self.median_us("audited") / self.median_us("unaudited"),
            self.p90_us("audited") / self.p90_us("unaudited"),
        )

    def records_per_open(self, side: str) -> float:
        return self.sides[side].records / len(self.sides[side].ns)


class Records:
    """The audit records appended since the last `take()`."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = path.stat().st_size if path.exists() else 0

    def take(self) -> list[dict[str, object]]:
        with open(self._path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            assert size >= self._offset, "the records file was rotated during the bench"
            f.seek(self._offset)
            new = f.read()
        assert new.endswith(b"\n") or not new, "a record being written"
        self._offset += len(new)
        return [json.loads(line) for line in new.splitlines()]


def _mount_type(path: Path) -> str:
    with open("/proc/self/mountinfo") as f:
        types = [
            line.split()[line.split().index("-") + 1] for line in f if line.split()[4] == str(path)
        ]
    assert types, f"{path} is not a mount point"
    return types[-1]


def _read(
    reader: Reader, side: Side, iterations: int, agent: AgentProcess, records: Records
) -> list[int]:
    """`iterations` reads of `side`'s key, counting the records and handler calls meanwhile."""
    before = agent.fuse_requests()
    samples = reader.read(side.volume / "key", iterations, expected=VALUE)
    side.calls += agent.fuse_requests() - before
    new = records.take()
    side.records += len(new)
    for event in new:
        volume = event["volume"]
        reader_ = event["reader"]
        assert isinstance(volume, dict)
        assert isinstance(reader_, dict)
        assert (volume["name"], volume["path"]) == ("secret", "key"), event
        assert reader_["pid"] == reader.process.pid, event
    return samples


def measure(iterations: int) -> AuditedReads:
    """`iterations` hot reads of each side."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        manifests = base / "manifests"
        manifests.mkdir()
        (manifests / "secret.yaml").write_text(SECRET)
        (manifests / "configmap.yaml").write_text(CONFIGMAP)
        (manifests / "pod.yaml").write_text(POD)
        kubelet_dir = layout.volume_dir(base / "kubelet", UID, layout.Plugin.SECRET, "secret")
        with (
            tmpfs(kubelet_dir) as kubelet_volume,
            running_agent(manifests, base / "fusevol", *AGENT_ARGS, "--audit", "secrets") as agent,
        ):
            kubelet_reference.write(kubelet_volume, {"key": FileProjection(VALUE.encode(), 0o644)})
            agent.wait_state(UID, "secret", "mounted")
            agent.wait_state(UID, "config", "mounted")
            sides = {
                "tmpfs": Side(kubelet_volume),
                "unaudited": Side(agent.volume(UID, "configmap", "config")),
                "audited": Side(agent.volume(UID, "secret", "secret")),
            }
            # Exactly one volume is audited: bound from the audit server's file system.
            assert _mount_type(sides["audited"].volume) == AUDIT.fstype
            assert _mount_type(sides["unaudited"].volume) == "fuse.fusevol"
            wait_for(lambda: all((s.volume / "key").read_text() == VALUE for s in sides.values()))
            records = Records(records_path(agent.root))
            reader = Reader()
            try:
                for side in sides.values():
                    _read(reader, side, WARM_UP, agent, records)
                for side in sides.values():  # the warm-up is not counted
                    side.records, side.calls = 0, collections.Counter()
                for _ in range(ROUNDS):
                    for side in sides.values():
                        side.ns += _read(reader, side, iterations // ROUNDS, agent, records)
            finally:
                reader.close()
            agent.stop()
    return AuditedReads(sides)


def _calls(side: Side) -> str:
    per_read = [f"{op} {n / len(side.ns):.2f}" for op, n in sorted(side.calls.items()) if n]
    return ", ".join(per_read) or "none"


def report(result: AuditedReads) -> None:
    n = len(result.sides["audited"].ns)
    print(f"hot open+read(4 KiB)+close of vol/key (1 KiB), {n} per side, µs per op")
    print(
        f"{'side':<10} {'median':>8} {'p90':>8} {'x unaud.':>9} {'records/open':>13}  "
        "agent handler calls per read"
    )
    for name in SIDES:
        median = result.median_us(name)
        print(
            f"{name:<10} {median:>8.1f} {result.p90_us(name):>8.1f} "
            f"{median / result.median_us('unaudited'):>9.2f} "
            f"{result.records_per_open(name):>13.2f}  {_calls(result.sides[name])}"
        )
    median, p90 = result.ratio()
    print(f"audited / unaudited: median {median:.2f}x, p90 {p90:.2f}x")
    per_open = result.records_per_open("audited")
    verdict = "met" if per_open == 1 else "NOT met"
    print(f"records per audited open: {per_open:.2f} (check, must be 1: {verdict})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=5000, help="hot reads per side")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("audited_read.py needs root: it mounts a tmpfs and runs the agent's FUSE mount")
    report(measure(args.iterations))


if __name__ == "__main__":
    main()
