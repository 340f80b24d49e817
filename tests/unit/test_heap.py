"""`fusevol.base.heap`: one arena for every thread; the pages that a burst of work freed go back."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from fusevol.base import heap

ARENAS = """
import ctypes, os, sys, threading
from fusevol.base import heap
if sys.argv[1] == "one":
    assert heap.one_arena()
barrier = threading.Barrier(4)
def work():
    barrier.wait()  # all four alive at once: none inherits the arena of one that ended
    [bytes(4096) for _ in range(64)]
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
os.dup2(1, 2)  # malloc_stats writes to stderr
ctypes.CDLL(None).malloc_stats()
"""


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


@pytest.mark.parametrize(("mode", "one"), [("default", False), ("one", True)])
def test_one_arena_for_every_thread(mode: str, one: bool) -> None:
    stats = subprocess.run(
        [sys.executable, "-c", ARENAS, mode], capture_output=True, text=True, check=True
    ).stdout
    arenas = stats.count("Arena ")
    if one:
        assert arenas == 1, stats
    else:  # what one_arena prevents: glibc gives new threads arenas of their own
        assert arenas > 1, stats


def test_trim_returns_what_a_threads_arena_kept() -> None:
    kept: list[bytes] = []

    def burst() -> None:
        # 64 MiB in 4 KiB blocks (malloc'd: above pymalloc's 512 bytes, below mmap's threshold),
        # of which one in 64 stays: freed pages glibc keeps, each arena page next to a kept one.
        blocks = [bytes(4096) for _ in range(16384)]
        kept.extend(blocks[::64])

    thread = threading.Thread(target=burst)
    thread.start()
    thread.join()
    before = rss_kib()
    assert heap.trim()
    released = before - rss_kib()
    assert released > 32 * 1024, f"{released} KiB released of ~63 MiB freed"
    assert len(kept) == 256
