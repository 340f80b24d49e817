"""Read path: fusevol against kubelet's layout on tmpfs, measured in one run (docs/fuse.md fact 4).

Serves a ConfigMap with a 1 KiB key through the real agent, and writes the same volume the way
kubelet does (`tests/kubelet_reference.py`) to a tmpfs mounted at a pod volume directory of the
same depth. One child process reads both with os.open/os.read(4 KiB)/os.close of `vol/key`:

- hot read: median over many iterations, after a warm-up, alternating rounds between the two;
- cold read: the first read after a new version appeared (`..data` switched), median over many
  versions;
- handler calls per read, from the agent's `fusevol_fuse_requests_total` in /metrics.

    .venv/bin/python bench/read_path.py [--iterations 50000] [--versions 50]     (root: mounts)
"""

from __future__ import annotations

import argparse
import collections
import importlib.metadata
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import AGENT_ARGS, tmpfs
from fusevol.model import FileProjection, PodUID
from fusevol.node import layout
from tests import kubelet_reference
from tests.agent import running_agent, wait_for, write_atomically

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.agent import AgentProcess

UID = PodUID("cccccccc-0000-4000-8000-000000000001")
CONFIGMAP = "kind: ConfigMap\nmetadata: {{name: bench}}\ndata: {{key: '{value}'}}\n"
POD = f"""kind: Pod
metadata: {{name: bench, uid: {UID}}}
spec:
  containers: [{{name: c}}]
  volumes: [{{name: config, configMap: {{name: bench}}}}]
"""
ROUNDS = 5
"""Hot reads alternate between the two setups in this many rounds, so drift hits both alike."""

READER = r"""
import json, os, sys, time

for line in sys.stdin:
    command, path, arg = line.split()
    if command == "wait":  # until the volume's ..data no longer points at `arg`
        link, deadline = os.path.join(os.path.dirname(path), "..data"), time.monotonic() + 10
        while os.readlink(link) == arg and time.monotonic() < deadline:
            pass
        print(json.dumps({}), flush=True)
        continue
    samples = []
    for _ in range(int(arg)):  # "read": open+read+close, `arg` times
        started = time.perf_counter_ns()
        fd = os.open(path, os.O_RDONLY)
        data = os.read(fd, 4096)
        os.close(fd)
        samples.append(time.perf_counter_ns() - started)
    print(json.dumps({"ns": samples, "data": data.decode()}), flush=True)
"""


def value(version: int) -> str:
    """A 1 KiB value that names its version."""
    return f"{version:04d}".ljust(1024, "x")


def payload(version: int) -> dict[str, FileProjection]:
    """What kubelet writes for the ConfigMap at `version` (defaultMode 0644)."""
    return {"key": FileProjection(value(version).encode(), 0o644)}


class Reader:
    """The child process that does every read, for both setups."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", READER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def _ask(self, command: str, path: Path, arg: str | int) -> dict[str, object]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(f"{command} {path} {arg}\n")
        self.process.stdin.flush()
        answer: dict[str, object] = json.loads(self.process.stdout.readline())
        return answer

    def read(self, path: Path, iterations: int, *, expected: str) -> list[int]:
        """Nanoseconds per open+read+close of `path`."""
        answer = self._ask("read", path, iterations)
        assert answer["data"] == expected, f"{path} holds another version"
        samples = answer["ns"]
        assert isinstance(samples, list)
        return samples

    def wait_switched(self, path: Path, old_target: str) -> None:
        """Until `..data` next to `path` has moved on from `old_target`."""
        self._ask("wait", path, old_target)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=10)


class Setup:
    """One side of the comparison: a volume directory and what was measured on it."""

    def __init__(self, name: str, volume: Path, agent: AgentProcess | None = None) -> None:
        self.name = name
        self.volume = volume
        self.key = volume / "key"
        self.agent = agent
        """The agent serving `volume`, whose handler calls are counted (None: tmpfs)."""
        self.expected = value(0)
        """The content a read must find: the version last published."""
        self.hot_ns: list[int] = []
        self.cold_ns: list[int] = []
        self.hot_calls: collections.Counter[str] = collections.Counter()
        self.cold_calls: collections.Counter[str] = collections.Counter()

    def data_target(self) -> str:
        return os.readlink(self.volume / "..data")

    def read(self, reader: Reader, iterations: int, calls: collections.Counter[str]) -> list[int]:
        """Read the key through `reader`, adding the agent's handler calls meanwhile to `calls`."""
        before = self.agent.fuse_requests() if self.agent else collections.Counter[str]()
        samples = reader.read(self.key, iterations, expected=self.expected)
        if self.agent:
            calls += self.agent.fuse_requests() - before
        return samples


def measure_hot(reader: Reader, setups: list[Setup], iterations: int) -> None:
    """Warm up, then ROUNDS rounds alternating between the setups."""
    for setup in setups:
        setup.read(reader, 1000, collections.Counter())
    for _ in range(ROUNDS):
        for setup in setups:
            setup.hot_ns += setup.read(reader, iterations // ROUNDS, setup.hot_calls)


def measure_cold(
    reader: Reader, setups: list[Setup], publish: dict[str, Callable[[int], None]], versions: int
) -> None:
    """For each new version and setup: publish it, wait for `..data` to switch, read once."""
    for version in range(1, versions + 1):
        for setup in setups:
            old = setup.data_target()
            publish[setup.name](version)
            reader.wait_switched(setup.key, old)
            setup.expected = value(version)
            setup.cold_ns += setup.read(reader, 1, setup.cold_calls)


def run(base: Path, *, iterations: int, versions: int) -> tuple[list[Setup], str]:
    """Both setups measured in `base`; and the capabilities the agent negotiated."""
    manifests = base / "manifests"
    manifests.mkdir()
    (manifests / "cm.yaml").write_text(CONFIGMAP.format(value=value(0)))
    (manifests / "pod.yaml").write_text(POD)
    # The reference is kubelet's layout with a tmpfs on the volume directory (as for Secrets):
    # both paths have the same length and cross a mount.
    kubelet_dir = layout.volume_dir(base / "kubelet", UID, layout.Plugin.CONFIG_MAP, "config")
    with (
        tmpfs(kubelet_dir) as kubelet_volume,
        running_agent(manifests, base / "fusevol", *AGENT_ARGS) as agent,
    ):
        kubelet_volume.chmod(0o777)
        kubelet_reference.write(kubelet_volume, payload(0))
        kubelet = Setup("tmpfs, kubelet layout", kubelet_volume)
        fusevol = Setup("fusevol", agent.volume(UID, "configmap", "config"), agent)
        wait_for(lambda: fusevol.key.read_text() == value(0))
        match = re.search(r"FUSE capabilities negotiated (.*)", agent.log_text())
        publish = {
            kubelet.name: lambda v: kubelet_reference.write(kubelet_volume, payload(v)),
            fusevol.name: lambda v: write_atomically(
                manifests / "cm.yaml", CONFIGMAP.format(value=value(v))
            ),
        }
        reader = Reader()
        try:
            measure_hot(reader, [kubelet, fusevol], iterations)
            measure_cold(reader, [kubelet, fusevol], publish, versions)
        finally:
            reader.close()
        agent.stop()
    return [kubelet, fusevol], match[1] if match else "?"


def _calls(setup: Setup, counter: collections.Counter[str], reads: int) -> str:
    if setup.agent is None:
        return "-"
    per_read = [f"{op} {n / reads:.2f}" for op, n in sorted(counter.items()) if n]
    return ", ".join(per_read) or "none"


def report(setups: list[Setup], *, iterations: int, capabilities: str) -> None:
    hot_ref = statistics.median(setups[0].hot_ns)
    cold_ref = statistics.median(setups[0].cold_ns)
    print(
        f"kernel {os.uname().release}, pyfuse3 {importlib.metadata.version('pyfuse3')}, "
        f"negotiated: {capabilities}"
    )
    print(
        f"open+read(4 KiB)+close of vol/key (1 KiB): hot = median of {iterations}, "
        f"cold = first read after a new version, median of {len(setups[0].cold_ns)}"
    )
    print(
        f"{'setup':<22} {'hot µs/op':>9} {'x tmpfs':>7}  {'cold µs':>8} {'x tmpfs':>7}  "
        "handler calls per hot read | per cold read"
    )
    for setup in setups:
        hot = statistics.median(setup.hot_ns)
        cold = statistics.median(setup.cold_ns)
        print(
            f"{setup.name:<22} {hot / 1e3:>9.1f} {hot / hot_ref:>7.2f}  "
            f"{cold / 1e3:>8.1f} {cold / cold_ref:>7.2f}  "
            f"{_calls(setup, setup.hot_calls, len(setup.hot_ns))} | "
            f"{_calls(setup, setup.cold_calls, len(setup.cold_ns))}"
        )
    ratio = statistics.median(setups[1].hot_ns) / hot_ref
    verdict = "met" if ratio <= 2 else "NOT met"
    print(f"hot read: fusevol {ratio:.2f}x tmpfs (goal <= 2x: {verdict})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=50_000, help="hot reads per setup")
    parser.add_argument("--versions", type=int, default=50, help="new versions for cold reads")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("read_path.py needs root: it mounts a tmpfs and runs the agent's FUSE mount")
    with tempfile.TemporaryDirectory() as tmp:
        setups, capabilities = run(Path(tmp), iterations=args.iterations, versions=args.versions)
    report(setups, iterations=args.iterations, capabilities=capabilities)


if __name__ == "__main__":
    main()
