"""First reads, as a program that reloads its configuration makes them: fusevol beside kubelet's
layout on tmpfs, in one run (row 1b of `python -m bench`).

- After an update: a ConfigMap of 100 keys (1 KiB each) edited again and again. A reader process
  watches the volume directory with inotify, as configmap-reload does, and on `..data`'s
  IN_MOVED_TO reads every key once (open+read(4 KiB)+close through its top-level link): the time
  per key, median over the versions.
- After set-up: new pods, each with a volume of a ConfigMap of its own like it (a version other
  pods' volumes share is in the kernel already). Once the volume is bound into the pod's
  directory (seen in /proc/self/mountinfo, without touching it), the reader reads every key once.
  kubelet's side: a new volume directory on the tmpfs written by AtomicWriter
  (`tests/kubelet_reference.py`), then read.

    .venv/bin/python bench/first_read.py [--versions 20] [--pods 10]     (root: mounts)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import AGENT_ARGS, tmpfs
from fusevol.model import FileProjection, PodUID
from fusevol.node import layout
from tests import kubelet_reference
from tests.agent import mounts_below, running_agent, wait_for, write_atomically

if TYPE_CHECKING:
    from collections.abc import Callable

KEYS = 100
POD = """kind: Pod
metadata: {{name: {name}, uid: {uid}}}
spec:
  containers: [{{name: c}}]
  volumes: [{{name: config, configMap: {{name: {configmap}}}}}]
"""

READER = r"""
import ctypes, ctypes.util, json, os, struct, sys, time

libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
IN_MOVED_TO = 0x80

def read_all(directory, count):
    samples = []
    for i in range(count):
        started = time.perf_counter_ns()
        fd = os.open(f"{directory}/k{i:03d}", os.O_RDONLY)
        os.read(fd, 4096)
        os.close(fd)
        samples.append(time.perf_counter_ns() - started)
    return samples

for line in sys.stdin:
    command, directory, count = line.split()
    if command == "read":  # every key once, now
        print(json.dumps(read_all(directory, int(count))), flush=True)
        continue
    fd = libc.inotify_init1(0)  # "watch": every key once, when ..data moves
    assert libc.inotify_add_watch(fd, directory.encode(), IN_MOVED_TO) >= 0
    print("[]", flush=True)
    moved = False
    while not moved:
        events = os.read(fd, 65536)
        while events:
            _, _, _, length = struct.unpack_from("iIII", events)
            name = events[16 : 16 + length].rstrip(b"\0")
            moved = moved or name == b"..data"
            events = events[16 + length :]
    os.close(fd)
    print(json.dumps(read_all(directory, int(count))), flush=True)
"""


def value(version: int, key: int) -> str:
    return f"{version:04d}-{key:03d}".ljust(1024, "x")


def configmap(version: int, name: str = "bench") -> str:
    data = "".join(f"  k{key:03d}: '{value(version, key)}'\n" for key in range(KEYS))
    return f"kind: ConfigMap\nmetadata: {{name: {name}}}\ndata:\n{data}"


def payload(version: int) -> dict[str, FileProjection]:
    return {
        f"k{key:03d}": FileProjection(value(version, key).encode(), 0o644) for key in range(KEYS)
    }


class Reader:
    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", READER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def send(self, command: str, directory: Path) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{command} {directory} {KEYS}\n")
        self.process.stdin.flush()

    def answer(self) -> list[int]:
        assert self.process.stdout is not None
        samples: list[int] = json.loads(self.process.stdout.readline())
        return samples

    def read(self, directory: Path) -> list[int]:
        self.send("read", directory)
        return self.answer()

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=10)


@dataclass
class FirstReads:
    """Nanoseconds per key, for each side."""

    update: dict[str, list[int]] = field(default_factory=lambda: {"fusevol": [], "tmpfs": []})
    setup: dict[str, list[int]] = field(default_factory=lambda: {"fusevol": [], "tmpfs": []})
    hot: dict[str, list[int]] = field(default_factory=lambda: {"fusevol": [], "tmpfs": []})


def measure(*, versions: int, pods: int) -> FirstReads:
    result = FirstReads()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        manifests = base / "manifests"
        manifests.mkdir()
        (manifests / "cm.yaml").write_text(configmap(0))
        (manifests / "pod-0.yaml").write_text(POD.format(name="p0", uid=_uid(0), configmap="bench"))
        pods_dir = base / "kubelet" / "pods"
        with (
            tmpfs(pods_dir) as kubelet_pods,
            running_agent(manifests, base / "fusevol", *AGENT_ARGS) as agent,
        ):
            volume = agent.wait_mounted(agent.volume(_uid(0), "configmap", "config"))
            kubelet_volume = _kubelet_volume(kubelet_pods, 0)
            kubelet_reference.write(kubelet_volume, payload(0))
            wait_for(lambda: (volume / "k000").read_text() == value(0, 0))
            reader = Reader()
            try:
                _updates(reader, result, versions, volume, kubelet_volume, manifests)
                _setups(reader, result, pods, agent.volume, kubelet_pods, manifests)
            finally:
                reader.close()
            agent.stop()
    return result


def _updates(
    reader: Reader,
    result: FirstReads,
    versions: int,
    volume: Path,
    kubelet_volume: Path,
    manifests: Path,
) -> None:
    for version in range(1, versions + 1):
        reader.send("watch", kubelet_volume)
        reader.answer()
        kubelet_reference.write(kubelet_volume, payload(version))
        result.update["tmpfs"] += reader.answer()
        reader.send("watch", volume)
        reader.answer()
        write_atomically(manifests / "cm.yaml", configmap(version))
        result.update["fusevol"] += reader.answer()
    for name, directory in (("tmpfs", kubelet_volume), ("fusevol", volume)):
        result.hot[name] += reader.read(directory)


def _setups(
    reader: Reader,
    result: FirstReads,
    pods: int,
    volume_of: Callable[[str, str, str], Path],
    kubelet_pods: Path,
    manifests: Path,
) -> None:
    for pod in range(1, pods + 1):
        kubelet_volume = _kubelet_volume(kubelet_pods, pod)
        kubelet_reference.write(kubelet_volume, payload(0))
        result.setup["tmpfs"] += reader.read(kubelet_volume)
        volume = volume_of(_uid(pod), "configmap", "config")
        # A ConfigMap of its own: a version another pod's volume shares is in the kernel already.
        (manifests / f"cm-{pod}.yaml").write_text(configmap(0, f"cm-{pod}"))
        pod_manifest = POD.format(name=f"p{pod}", uid=_uid(pod), configmap=f"cm-{pod}")
        (manifests / f"pod-{pod}.yaml").write_text(pod_manifest)
        wait_for(lambda: str(volume) in mounts_below(volume.parents[4]))  # noqa: B023
        result.setup["fusevol"] += reader.read(volume)


def _uid(pod: int) -> PodUID:
    return PodUID(f"eeeeeeee-0000-4000-8000-{pod:012d}")


def _kubelet_volume(pods: Path, pod: int) -> Path:
    path = layout.volume_dir(pods.parent, _uid(pod), layout.Plugin.CONFIG_MAP, "config")
    path.mkdir(parents=True)
    return path


def report(result: FirstReads) -> None:
    print(f"first open+read(4 KiB)+close of each of {KEYS} keys (1 KiB), µs per key, median")
    print(f"{'when':<46} {'fusevol':>8} {'tmpfs':>8} {'x tmpfs':>8}")
    for what, samples in (
        ("after an update, on ..data's IN_MOVED_TO", result.update),
        ("after set-up, once bound in the pod's dir", result.setup),
        ("hot (the same keys read again)", result.hot),
    ):
        f, t = (statistics.median(samples[n]) / 1e3 for n in ("fusevol", "tmpfs"))
        print(f"{what:<46} {f:>8.1f} {t:>8.1f} {f / t:>8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--versions", type=int, default=20, help="updates read after")
    parser.add_argument("--pods", type=int, default=10, help="pods set up and read")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("first_read.py needs root: it mounts a tmpfs and runs the agent's FUSE mount")
    report(measure(versions=args.versions, pods=args.pods))


if __name__ == "__main__":
    main()
