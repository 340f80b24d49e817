"""The agent's heap: one glibc arena for all its threads (`one_arena`), its large blocks mapped
on their own (`map_large_blocks`), its free pages given back to the kernel once the agent is idle
(`trim`), and a debugging aid that traces what Python allocates (`trace_allocations`, with
`FUSEVOL_TRACEMALLOC`).

What Python allocates above pymalloc's 512 bytes comes from glibc's malloc. By default glibc gives
threads arenas of their own, up to eight per core: with trio's 40 worker threads (file reads,
manifest text, mount batches, the joined status snapshot) that was 15 arenas beside the main heap,
each keeping the free chunks and per-thread caches of the bursts of work that went through it.
A 10-minute `bench/soak.py` grew the heap 0.6 MiB over its second half that way (malloc's own
count of bytes in use rose 1.5 MB over the run; what Python allocated, traced in another run,
stayed flat); with one arena, 0.1 MiB. The agent's threads hardly ever allocate at the same
time (Python's GIL), so the one arena's lock is seldom contended.

glibc maps a block of 128 KiB or more on its own, and unmaps it when it is freed, but each time
such a block is freed it raises that threshold to the block's size (up to 32 MiB): after the
first large answer, the next ones (a list of pods, `/status` of thousands of volumes) come from
the heap, and a small block allocated after one keeps its pages there once it is freed. One
`/status` of 3000 pods left the agent 8.9 MiB larger for good that way; with the threshold fixed
at 128 KiB, 1.2 MiB.

`malloc_trim(0)` returns every whole free page to the kernel (`madvise(MADV_DONTNEED)`, since
glibc 2.8, not only the top of the heap). It takes the arena's lock, so it runs in a worker
thread, after the work it cleans up after (`fusevol.observe.status`: once the reconciler has been
quiet).

On a C library without them (musl), both do nothing.
"""

from __future__ import annotations

import ctypes
import functools
import tracemalloc
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from pathlib import Path

_M_ARENA_MAX = -8
"""mallopt's parameter for the most arenas (malloc.h)."""
_M_MMAP_THRESHOLD = -3
"""mallopt's parameter for the size from which a block is mapped on its own (malloc.h)."""
LARGE_BLOCK = 128 << 10
"""glibc's own first threshold (`map_large_blocks`)."""


@functools.cache
def _libc() -> Any:
    return ctypes.CDLL(None)


def one_arena() -> bool:
    """Have every thread started from now on allocate from the main heap (before the first
    thread: a thread keeps the arena it got); True if the C library took it."""
    mallopt = getattr(_libc(), "mallopt", None)
    return mallopt is not None and bool(mallopt(_M_ARENA_MAX, 1))


def map_large_blocks() -> bool:
    """Have every block of `LARGE_BLOCK` or more mapped on its own, and given back to the kernel
    as soon as it is freed, for the whole run (glibc's threshold no longer moves); True if the C
    library took it."""
    mallopt = getattr(_libc(), "mallopt", None)
    return mallopt is not None and bool(mallopt(_M_MMAP_THRESHOLD, LARGE_BLOCK))


def trim() -> bool:
    """Return free heap pages to the kernel (blocks for a few milliseconds: a worker thread's
    job); True if the C library did (`malloc_trim` says whether it released anything)."""
    malloc_trim = getattr(_libc(), "malloc_trim", None)
    return malloc_trim is not None and bool(malloc_trim(0))


TRACEMALLOC_ENV = "FUSEVOL_TRACEMALLOC"
"""A directory: with it set, the agent traces its allocations (tracemalloc), and each time a file
`take` appears there it writes a snapshot `<n>.tracemalloc` and removes `take` (bench/soak.py
`--trace` diffs them across its checkpoints, to find what grows). A debugging aid: tracing costs
memory and time."""


async def trace_allocations(directory: Path) -> None:
    tracemalloc.start(8)
    request = directory / "take"
    n = 0
    while True:
        await trio.sleep(0.2)  # polled: a file written by another process, a debugging aid
        if not await trio.to_thread.run_sync(request.exists):
            continue
        snapshot = tracemalloc.take_snapshot()
        await trio.to_thread.run_sync(snapshot.dump, str(directory / f"{n}.tracemalloc"))
        await trio.to_thread.run_sync(request.unlink)
        n += 1
