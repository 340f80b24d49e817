"""Shared pieces of the fault and bad-input suite: manifests, probes and checks on served volumes.

The agent itself is run by `tests.agent` (a child process on real FUSE and bind mounts); this
module only adds what several fault tests need: a healthy pod to compare against, a cheap way to
wait for new log lines, and the AtomicWriter invariants a served volume must hold at any instant
(one `..data` that resolves, every top-level name a symlink into it, no `..data_tmp`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from tests.agent import HAS_FUSE, mounts_below, running_agent, wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tests.agent import AgentProcess

needs_fuse = pytest.mark.skipif(not HAS_FUSE, reason="needs root and /dev/fuse")

HEALTHY_UID = "aaaaaaaa-0000-4000-8000-000000000001"

HEALTHY_CONFIGMAP = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: app, namespace: default}
data:
  a: "alpha"
  b: "beta"
"""

HEALTHY_SECRET = """\
apiVersion: v1
kind: Secret
metadata: {name: creds, namespace: default}
stringData:
  token: "t0ken"
"""

HEALTHY_POD = f"""\
apiVersion: v1
kind: Pod
metadata: {{name: healthy, namespace: default, uid: {HEALTHY_UID}}}
spec:
  containers: [{{name: c}}]
  volumes:
    - name: config
      configMap: {{name: app}}
    - name: creds
      secret: {{secretName: creds, defaultMode: 0400}}
"""

HEALTHY_FILES = {
    ("configmap", "config"): {"a": b"alpha", "b": b"beta"},
    ("secret", "creds"): {"token": b"t0ken"},
}


def write_healthy(directory: Path) -> None:
    (directory / "app.yaml").write_text(HEALTHY_CONFIGMAP)
    (directory / "creds.yaml").write_text(HEALTHY_SECRET)
    (directory / "healthy.yaml").write_text(HEALTHY_POD)


@dataclass(frozen=True)
class Snapshot:
    """What a served volume shows: the `..data` target and the content of every top-level name."""

    data_target: str
    files: dict[str, bytes]


def snapshot(volume: Path) -> Snapshot:
    names = sorted(n for n in os.listdir(volume) if not n.startswith(".."))
    return Snapshot(os.readlink(volume / "..data"), {n: (volume / n).read_bytes() for n in names})


def healthy_snapshots(agent: AgentProcess) -> dict[tuple[str, str], Snapshot]:
    return {key: snapshot(agent.volume(HEALTHY_UID, *key)) for key in sorted(HEALTHY_FILES)}


def check_one_complete_version(volume: Path, expected: dict[str, bytes]) -> None:
    """AtomicWriter's invariants, plus `expected` (top-level name -> bytes, flat payloads only).

    Exactly one version directory, `..data` pointing at it, no `..data_tmp`, every top-level name
    a symlink `name -> ..data/name`, and nothing else in the volume directory.
    """
    entries = set(os.listdir(volume))
    versions = {e for e in entries if e.startswith("..") and e not in ("..data", "..data_tmp")}
    assert "..data_tmp" not in entries, entries
    assert len(versions) == 1, entries
    assert os.readlink(volume / "..data") == next(iter(versions))
    top = entries - versions - {"..data"}
    assert top == set(expected), (top, set(expected))
    for name, content in expected.items():
        assert os.readlink(volume / name) == f"..data/{name}"
        assert (volume / name).read_bytes() == content, name
        assert (volume / "..data" / name).read_bytes() == content, name


class LogTail:
    """Reads an agent log incrementally, so a long test does not re-read the whole file."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = path.stat().st_size if path.exists() else 0
        self.text = ""

    def read_new(self) -> str:
        try:
            with open(self._path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return ""
        # Only whole lines: a line being written is read on the next call.
        end = chunk.rfind(b"\n") + 1
        self._offset += end
        new = chunk[:end].decode(errors="replace")
        self.text += new
        return new

    def wait_line(self, *parts: str, timeout_s: float = 10.0) -> str:
        """The first new line (since this tail started) holding every one of `parts`."""

        def probe() -> str | None:
            self.read_new()
            return next(
                (line for line in self.text.splitlines() if all(p in line for p in parts)), None
            )

        return wait_for(probe, timeout_s=timeout_s, interval_s=0.005)


_TIMED_READ = """
import sys, time
start = time.monotonic()
with open(sys.argv[1], "rb") as f:
    data = f.read()
sys.stderr.write(repr(time.monotonic() - start))
sys.stdout.buffer.write(data)
"""


def read_within(path: Path, timeout_s: float) -> bytes:
    """Read `path` in a child process; the open and read must take less than `timeout_s`.

    A child, so that a hung FUSE server fails the test instead of hanging it.
    """
    try:
        result = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _TIMED_READ, str(path)],
            capture_output=True,
            timeout=timeout_s + 10.0,  # interpreter start-up is not part of the budget
            check=True,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading {path} did not complete within {timeout_s + 10.0}s")
    elapsed = float(result.stderr)
    assert elapsed < timeout_s, f"reading {path} took {elapsed:.3f}s"
    return result.stdout


def force_stop(agent: AgentProcess, *, patience_s: float = 1.5) -> None:
    """Make sure `agent` is gone and nothing is mounted below its root, whatever state it is in.

    A SIGKILLed agent can be left with a thread waiting on its own FUSE mount (see
    test_faults.py): it never exits until the connection is aborted, which `umount -f` does
    for FUSE even when it then answers "target is busy". Only a lazy unmount of the rest follows.
    """
    process = agent.process
    if process is not None and process.poll() is None:
        process.kill()
        process.wait(timeout=10)
    if agent.pid and agent.agent_alive():  # a lame duck, or an agent dying with its launcher
        with contextlib.suppress(ProcessLookupError):
            os.kill(agent.pid, signal.SIGKILL)
        try:
            agent.wait_agent_gone(patience_s)
        except subprocess.TimeoutExpired:
            abort_fuse_connection(agent)
            agent.wait_agent_gone(10)
    for path in reversed(mounts_below(agent.root)):
        subprocess.run(["umount", "-l", path], check=False)


def abort_fuse_connection(agent: AgentProcess) -> None:
    """`umount -f` of the agent's FUSE mount: the kernel aborts the connection (fuse_umount_begin)
    even if the unmount itself then fails as busy."""
    mountpoint = str(agent.fuse_mountpoint())
    subprocess.run(["umount", "-f", mountpoint], check=False, capture_output=True)


@contextlib.contextmanager
def agent_on(
    manifests: Path, root: Path, *extra_args: str, env: dict[str, str] | None = None
) -> Iterator[AgentProcess]:
    """`tests.agent.running_agent`, but a hung or unkillable agent cannot hang the suite."""
    with running_agent(manifests, root, *extra_args, env=env) as agent:
        try:
            yield agent
        finally:
            force_stop(agent)
