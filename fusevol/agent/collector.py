"""Python's full garbage collections, made at quiet moments instead of in the middle of a burst.

A full collection scans every object the agent holds: with 2000 pods, 15-30 ms on the trio thread
(measured with `bench/burst.py` and a gc callback). CPython starts one whenever enough objects
have survived the younger generations, and a burst of edits makes many: an edit that arrived
then waited for it (31 ms where its neighbours took 7). So the agent turns automatic full
collections off and makes them itself, every `interval_s`, once the object store has not changed
for `quiet_s`, nor its `activity` counter (the API client's requests: after an API server
restart thousands of relists change nothing in the store, yet are a burst; at the latest
`max_delay_s` later). The young generations are still collected by
CPython as usual (under 1 ms); a full collection is only for reference cycles, which wait a few
seconds longer.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from collections.abc import Callable

    from fusevol.volumemanager.cache.store import ObjectStore

log = logging.getLogger(__name__)

_NEVER = 1 << 30
"""A gen2 threshold (young collections between two full ones) that is never reached."""


async def collect_when_quiet(
    store: ObjectStore,
    *,
    activity: Callable[[], int] = lambda: 0,
    interval_s: float = 10.0,
    quiet_s: float = 0.5,
    max_delay_s: float = 60.0,
) -> None:
    young, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, _NEVER)
    try:
        while True:
            await trio.sleep(interval_s)
            with trio.move_on_after(max_delay_s):
                while True:
                    generation, busy = store.generation, activity()
                    await trio.sleep(quiet_s)
                    if (store.generation, activity()) == (generation, busy):
                        break
            started = time.perf_counter()
            found = gc.collect()
            log.debug(
                "full garbage collection took=%.1fms unreachable=%d",
                (time.perf_counter() - started) * 1e3,
                found,
            )
    finally:
        gc.set_threshold(young, middle, old)
