"""`fusevol.agent.collector`: full garbage collections wait for a moment the object store is
quiet."""

from __future__ import annotations

import functools
import gc
from typing import TYPE_CHECKING

import trio
import trio.testing

from fusevol.agent.collector import collect_when_quiet
from fusevol.decode.manifest import parse_manifest
from fusevol.volumemanager.cache.store import ObjectStore

if TYPE_CHECKING:
    import pytest


def _edit(store: ObjectStore, value: int) -> None:
    metadata = f'{{name: busy, resourceVersion: "{value}"}}'
    text = f'kind: ConfigMap\nmetadata: {metadata}\ndata: {{v: "{value}"}}\n'
    [obj] = parse_manifest(text.encode(), origin="cm.yaml")
    store.upsert(obj)


def test_full_collections_wait_for_quiet_and_are_not_automatic(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    collections: list[float] = []

    def collect(*_: object) -> int:
        collections.append(trio.current_time())
        return 0

    monkeypatch.setattr(gc, "collect", collect)
    thresholds = gc.get_threshold()

    async def main() -> None:
        store = ObjectStore()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect_when_quiet, store)
            await trio.testing.wait_all_tasks_blocked()
            assert gc.get_threshold()[2] > 1_000_000  # CPython never starts one by itself
            # Edits every 0.2 s from 9 s to 15 s: the collection due at 10 s waits for the end.
            await trio.sleep(9.0)
            for i in range(30):
                _edit(store, i)
                await trio.sleep(0.2)
            await trio.sleep(1.0)
            assert len(collections) == 1
            assert 15.0 <= collections[0] <= 15.6
            nursery.cancel_scope.cancel()
        assert gc.get_threshold() == thresholds  # given back

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_burst_of_api_requests_that_changes_nothing_also_defers_a_collection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After an API server restart, thousands of relists find every object as it was: the store
    stays quiet, the agent is not."""
    collections: list[float] = []

    def collect(*_: object) -> int:
        collections.append(trio.current_time())
        return 0

    monkeypatch.setattr(gc, "collect", collect)
    monkeypatch.setattr(gc, "get_count", lambda: (0, 0, 1))  # the relists' objects promoted
    requests = [0]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                functools.partial(collect_when_quiet, ObjectStore(), activity=lambda: requests[0])
            )
            await trio.sleep(9.0)
            for _ in range(30):  # requests every 0.2 s from 9 s to 15 s
                requests[0] += 100
                await trio.sleep(0.2)
            await trio.sleep(1.0)
            assert len(collections) == 1
            assert 15.0 <= collections[0] <= 15.6
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_an_idle_agent_skips_full_collections_until_something_reaches_the_oldest_generation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing promoted to the oldest generation (its count of young collections since the last
    full one is 0) and nothing left the store: no new garbage cycle can be there to find. A
    full collection at 3000 pods scans for 250 ms; the agent at rest made one every 10 s."""
    collections: list[float] = []

    def collect(*_: object) -> int:
        collections.append(trio.current_time())
        return 0

    counts = [(0, 0, 0)]
    monkeypatch.setattr(gc, "collect", collect)
    monkeypatch.setattr(gc, "get_count", lambda: counts[0])

    async def main() -> None:
        store = ObjectStore()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect_when_quiet, store)
            await trio.sleep(299.0)
            assert collections == []  # idle
            await trio.sleep(12.0)
            assert len(collections) == 1  # at the latest every 5 minutes all the same
            assert 300.0 <= collections[0] <= 311.0
            counts[0] = (0, 0, 1)  # a young collection promoted objects
            await trio.sleep(11.0)
            assert len(collections) == 2
            counts[0] = (0, 0, 0)
            _edit(store, 1)  # an object changed (a pod deleted leaves cycles in the old one)
            await trio.sleep(11.0)
            assert len(collections) == 3
            await trio.sleep(60.0)
            assert len(collections) == 3
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
