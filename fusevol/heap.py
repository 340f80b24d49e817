"""Give the C heap's free pages back to the kernel, once the agent is idle: glibc's `malloc_trim`.

What Python allocates above pymalloc's 512 bytes comes from glibc: on the trio thread from the
main heap, in worker threads (file reads, manifest text, mount batches, the joined status
snapshot) from per-thread arenas; all of them keep the pages of what is freed. With trio's 40
worker threads: 15 arenas and the main heap that grew with each burst of work and never shrank
(bench/soak.py, issue 18). `malloc_trim(0)` returns every whole free page of every arena to the
kernel (`madvise(MADV_DONTNEED)`, since glibc 2.8, not only the top of the main heap). It takes
the arenas' locks in turn, so it runs in a worker thread, after the work it cleans up after
(`fusevol.status`: once the reconciler has been quiet).

On a C library without it (musl), `trim` does nothing.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any


@functools.cache
def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL(None).malloc_trim
    except AttributeError:  # not glibc
        return None


def trim() -> bool:
    """Return free heap pages to the kernel (blocks for a few milliseconds: a worker thread's
    job); True if the C library did (`malloc_trim` says whether it released anything)."""
    malloc_trim = _malloc_trim()
    return malloc_trim is not None and bool(malloc_trim(0))
