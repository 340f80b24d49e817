"""Benchmarks: `python -m bench` prints issue 7's table (bench/__main__.py)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

AGENT_ARGS = ("--log-level", "info")
"""The agent as deployed: the test harness's default, debug, writes a line per operation."""


def update_latencies(key: Path, update: Callable[[str], None], count: int) -> list[float]:
    """Seconds from `update(value)` until `key` reads `value`, for `count` new values, 20 ms apart
    (the reader spins: what a watcher that polls without sleeping would see)."""
    latencies = []
    for i in range(count):
        value = f"v{i}"
        started = time.perf_counter()
        update(value)
        while key.read_text() != value:
            pass
        latencies.append(time.perf_counter() - started)
        time.sleep(0.02)
    return latencies


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile: `fraction` 0.99 gives p99."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * len(ordered)) - 1)]


@contextlib.contextmanager
def tmpfs(path: Path) -> Iterator[Path]:
    """A fresh tmpfs at `path` (created, with its parents) for the block: kubelet's medium."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)
