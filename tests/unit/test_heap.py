"""`fusevol.heap.trim`: the pages that a worker thread's arena keeps after a burst go back."""

from __future__ import annotations

import threading

from fusevol import heap


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


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
