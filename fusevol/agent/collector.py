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

An agent at rest skips them: when no young collection promoted anything to the oldest generation
since the last full one (`gc.get_count()[2]`, CPython's count of those) and nothing changed in
the store (a pod deleted leaves its old objects' cycles behind), no new cycle can be there to
find; at the latest every `max_skip_s` all the same. With the API source at 3000 pods a full
collection scans for 220-280 ms, six times a minute at rest: 2.5 % of a core, and as long a
wait for an edit that comes meanwhile; skipping, the agent at rest used 0.8 % of a core instead
of 3.0 % (one minute each, on the cluster kit).
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
    max_skip_s: float = 300.0,
) -> None:
    young, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, _NEVER)
    last_store, last_at = store.generation, trio.current_time()
    try:
        while True:
            await trio.sleep(interval_s)
            if (
                gc.get_count()[2] == 0
                and store.generation == last_store
                and trio.current_time() - last_at < max_skip_s
            ):
                continue  # nothing reached the oldest generation, nothing left the store
            with trio.move_on_after(max_delay_s):
                while True:
                    generation, busy = store.generation, activity()
                    await trio.sleep(quiet_s)
                    if (store.generation, activity()) == (generation, busy):
                        break
            started = time.perf_counter()
            found = gc.collect()
            last_store, last_at = store.generation, trio.current_time()
            log.debug(
                "full garbage collection took=%.1fms unreachable=%d",
                (time.perf_counter() - started) * 1e3,
                found,
            )
    finally:
        gc.set_threshold(young, middle, old)
