"""Cold request throughput: stat+open+close of distinct keys with the kernel's caches dropped
(row 6 of `python -m bench`), fusevol beside kubelet's layout on tmpfs and beside the floor, a
minimal C FUSE server of the same layout, with 1 and 4 client processes.

One ConfigMap with KEYS keys, served by the real agent and written the AtomicWriter way to a
tmpfs. For each setup and client count: `echo 3 > /proc/sys/vm/drop_caches` (the FUSE mounts'
unused dentries and inodes, and every cached symlink target, go; tmpfs keeps its own: it is the
kernel alone), then the clients, started together, each stat+open+close their share of
`vol/<key>`; throughput is keys per second over the wall time from the first client's start to
the last client's end, read on the one monotonic clock all processes share. Median of REPEATS
runs, the three setups interleaved in each run, so that drift hits them alike.

The wall time, not each client's own: on two CPUs, four tmpfs clients of 500 keys (~2 ms each)
often run one after another, and the slowest client's own time then counted them as parallel,
up to ~1,000,000 keys/s against ~250,000 for one client; across the run they do ~220,000-360,000.

fusevol's pin holder keeps the kernel's entries of every served name (docs/fuse.md fact 17), as
a tmpfs keeps its own: a cold key costs the readlink of its link (and `..data`'s once a run),
one round trip through /dev/fuse with two context switches. Without the pins it cost three: a
lookup of the key, its readlink and a lookup of the file in the version directory.

The floor: tmpfs answers from the kernel's own caches and makes no request, so it says how far
fusevol is from a disk-less file system, not how far it is from what FUSE allows.
bench/cold_floor.c serves the same layout with nothing else to do: libfuse3's low-level API, one
thread, every answer computed from the inode number, and the same mount as fusevol's (no open
requests, cached symlinks, 300 s entry and attribute timeouts); this bench holds the same names
of it as fusevol's holder does (`fusevol.fuse.pin_helper.Holder`), so that it makes the same
requests. Its figure is what those requests cost any FUSE server on this machine; fusevol's is
read against it. It is compiled at run time (gcc and libfuse3's pkg-config); without them the
floor is reported as not built and the rest runs.

Neither server nor client is bound to a CPU. Where the scheduler puts them decides much: with
one client and no names held, the floor served ~30k keys/s with client and server on one CPU and
~4.5k on two (each request then waits for a wake-up on the other CPU), so runs vary with
placement.

    .venv/bin/python bench/cold_throughput.py [--keys 2000] [--repeats 5]     (root: mounts)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import AGENT_ARGS, tmpfs
from fusevol.fuse.pin_helper import Holder
from fusevol.model import FileProjection
from tests import kubelet_reference
from tests.agent import running_agent, wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator

UID = "eeeeeeee-0000-4000-8000-000000000001"
POD = f"""kind: Pod
metadata: {{name: cold, uid: {UID}}}
spec:
  containers: [{{name: c}}]
  volumes: [{{name: config, configMap: {{name: cold}}}}]
"""
CLIENTS = (1, 4)
FLOOR_SOURCE = Path(__file__).resolve().parent / "cold_floor.c"

CLIENT = r"""
import os, sys, time
paths = sys.argv[1:]
sys.stdin.readline()  # go
started = time.monotonic()
for path in paths:
    os.stat(path)
    os.close(os.open(path, os.O_RDONLY))
print(started, time.monotonic(), flush=True)
"""


@dataclass
class Result:
    keys: int
    fusevol: dict[int, list[float]] = field(default_factory=dict)
    """clients -> keys/s of each run."""
    tmpfs: dict[int, list[float]] = field(default_factory=dict)
    floor: dict[int, list[float]] = field(default_factory=dict)
    """The C libfuse floor (bench/cold_floor.c); empty when it was not built."""
    floor_not_built: str | None = None
    """Why `floor` is empty: no gcc, no libfuse3 for pkg-config, or a failed build."""


class FloorNotBuilt(Exception):
    """The floor cannot be built on this machine; the message says why."""


def key_names(n: int) -> list[str]:
    return [f"k{i:05d}" for i in range(n)]


def configmap(n: int) -> str:
    data = "".join(f"  {key}: v\n" for key in key_names(n))
    return f"kind: ConfigMap\nmetadata: {{name: cold}}\ndata:\n{data}"


def build_floor(directory: Path) -> Path:
    """bench/cold_floor.c compiled into `directory`; FloorNotBuilt if it cannot be."""
    gcc, pkg_config = shutil.which("gcc"), shutil.which("pkg-config")
    if gcc is None:
        raise FloorNotBuilt("no gcc")
    if pkg_config is None:
        raise FloorNotBuilt("no pkg-config")
    flags = subprocess.run(
        [pkg_config, "--cflags", "--libs", "fuse3"], capture_output=True, text=True, check=False
    )
    if flags.returncode != 0:
        raise FloorNotBuilt("pkg-config finds no fuse3 (libfuse3-dev)")
    directory.mkdir(parents=True, exist_ok=True)
    binary = directory / "cold_floor"
    compiled = subprocess.run(
        [gcc, "-O2", "-o", str(binary), str(FLOOR_SOURCE), *flags.stdout.split()],
        capture_output=True,
        text=True,
        check=False,
    )
    if compiled.returncode != 0:
        raise FloorNotBuilt(f"gcc failed: {compiled.stderr.strip()}")
    return binary


@contextlib.contextmanager
def running_floor(binary: Path, mountpoint: Path, keys: list[str]) -> Iterator[Path]:
    """The floor serving `keys` at `mountpoint` for the block, then stopped and unmounted."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([str(binary), str(mountpoint), str(len(keys))])
    try:
        deadline = time.monotonic() + 10
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"cold_floor exited with status {proc.returncode}")
            with contextlib.suppress(OSError):
                (mountpoint / keys[0]).stat()
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"cold_floor does not answer at {mountpoint}")
            time.sleep(0.01)
        yield mountpoint
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if os.path.ismount(mountpoint):
            subprocess.run(["umount", "-l", str(mountpoint)], check=False)


@contextlib.contextmanager
def held(volume: Path, keys: list[str]) -> Iterator[None]:
    """The names of `volume` held for the block, as fusevol's pin holder holds a volume's."""
    holder = Holder(1 + 2 * len(keys))
    version = os.readlink(volume / "..data")
    holder.pin(str(volume), ["..data", *keys, *(f"{version}/{key}" for key in keys)])
    try:
        yield
    finally:
        holder.drop(str(volume))


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def run_clients(volume: Path, keys: list[str], clients: int) -> float:
    """Keys per second: every key once, split between `clients` processes started together,
    over the wall time from the first one's start to the last one's end."""
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
    spans = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"client failed: exit status {proc.returncode}")
        started, ended = map(float, out.split())
        spans.append((started, ended))
    return keys_per_second(len(keys), spans)


def keys_per_second(keys: int, spans: list[tuple[float, float]]) -> float:
    """`keys` over the wall time the clients' (start, end) spans cover, from the first start
    to the last end: clients that ran one after another count as serial, not parallel."""
    return keys / (max(end for _, end in spans) - min(start for start, _ in spans))


def measure(n: int = 2000, repeats: int = 5) -> Result:
    result = Result(n)
    keys = key_names(n)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        manifests = base / "manifests"
        manifests.mkdir()
        (manifests / "cm.yaml").write_text(configmap(n))
        (manifests / "pod.yaml").write_text(POD)
        try:
            floor_binary: Path | None = build_floor(base / "build")
        except FloorNotBuilt as exc:
            floor_binary, result.floor_not_built = None, str(exc)
        with (
            tmpfs(base / "kubelet") as kubelet_volume,
            running_agent(manifests, base / "root", *AGENT_ARGS) as agent,
            contextlib.ExitStack() as stack,
        ):
            kubelet_reference.write(
                kubelet_volume, {key: FileProjection(b"v", 0o644) for key in keys}
            )
            volume = agent.volume(UID, "configmap", "config")
            wait_for(lambda: (volume / keys[-1]).exists(), timeout_s=30)
            names = 1 + 2 * n  # `..data`, and each key's link and file
            wait_for(lambda: agent.live_statistics()["publisher"]["pinned"] >= names, timeout_s=30)
            floor_volume = None
            if floor_binary is not None:
                floor_volume = stack.enter_context(
                    running_floor(floor_binary, base / "floor", keys)
                )
                stack.enter_context(held(floor_volume, keys))
            for _ in range(repeats):  # interleaved, so that drift hits all alike
                for clients in CLIENTS:
                    result.tmpfs.setdefault(clients, []).append(
                        run_clients(kubelet_volume, keys, clients)
                    )
                    result.fusevol.setdefault(clients, []).append(
                        run_clients(volume, keys, clients)
                    )
                    if floor_volume is not None:
                        result.floor.setdefault(clients, []).append(
                            run_clients(floor_volume, keys, clients)
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
    print(
        "the floor: bench/cold_floor.c, a single-threaded C libfuse3 server of the same layout, "
        "its names held as fusevol's are"
    )
    for clients in CLIENTS:
        f, t = statistics.median(r.fusevol[clients]), statistics.median(r.tmpfs[clients])
        if r.floor:
            c = statistics.median(r.floor[clients])
            floor, vs_floor = f"the floor {c:,.0f} keys/s", f", {f / c:.2f}x the floor"
        else:
            floor, vs_floor = f"the floor not built: {r.floor_not_built}", ""
        print(
            f"{clients} client(s): fusevol {f:,.0f} keys/s, {floor}, tmpfs {t:,.0f} keys/s "
            f"({f / t:.2f}x tmpfs{vs_floor})"
        )


if __name__ == "__main__":
    main()
