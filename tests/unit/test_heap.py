"""`fusevol.base.heap`: one arena for every thread; large blocks go back to the kernel when freed;
the pages that a burst of work freed go back."""

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


LARGE_BLOCKS = """
import sys
from fusevol.base import heap
if sys.argv[1] == "mapped":
    assert heap.map_large_blocks()
def rss_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
answer = bytearray(8 << 20)  # a large answer: mapped, and once freed glibc's threshold is 8 MiB
del answer
answer = bytearray(8 << 20)  # the next one
kept = [bytearray(1024) for _ in range(64)]  # small blocks allocated after it, kept
before = rss_kib()
del answer
print(before - rss_kib())
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


@pytest.mark.parametrize("mode", ["default", "mapped"])
def test_a_large_block_goes_back_to_the_kernel_when_freed(mode: str) -> None:
    returned_kib = int(
        subprocess.run(
            [sys.executable, "-c", LARGE_BLOCKS, mode], capture_output=True, text=True, check=True
        ).stdout
    )
    if mode == "mapped":
        assert returned_kib > 7 * 1024, f"{returned_kib} KiB of 8 MiB freed returned"
    else:  # what map_large_blocks prevents: the second answer came from the heap, and stays
        assert returned_kib < 1024, f"{returned_kib} KiB of 8 MiB freed returned"


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
