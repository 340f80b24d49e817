"""Checks on what a served volume shows, at any instant: AtomicWriter's invariants (one `..data`
that resolves, every top-level name a symlink into it, no `..data_tmp`), snapshots to compare
before and after a fault, and a read that must complete in time even if the server hangs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from tests.manifests import FILES, POD_UID

if TYPE_CHECKING:
    from pathlib import Path

    from tests.agent import AgentProcess


@dataclass(frozen=True)
class Snapshot:
    """What a served volume shows: the `..data` target and the content of every top-level name."""

    data_target: str
    files: dict[str, bytes]


def snapshot(volume: Path) -> Snapshot:
    names = sorted(n for n in os.listdir(volume) if not n.startswith(".."))
    return Snapshot(os.readlink(volume / "..data"), {n: (volume / n).read_bytes() for n in names})


def pod_set_snapshots(agent: AgentProcess) -> dict[tuple[str, str], Snapshot]:
    """A snapshot of each volume of tests/manifests.py's pod."""
    return {key: snapshot(agent.volume(POD_UID, *key)) for key in sorted(FILES)}


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
