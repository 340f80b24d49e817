"""Watched objects start a few at a time (`fusevol.source.kube.objects`), and a pod waiting for
its objects waits as long as the starts go on, not a fixed time from its first look.

The client here answers lists after a delay (or never) and gives watches that stay idle; the
trio clock is virtual (`autojump_clock`), so the delays cost no real time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import pytest
import trio

from fusevol.model import Kind, ObjectKey
from fusevol.source.kube import objects
from fusevol.source.kube.objects import WatchedObjects
from fusevol.volumemanager.cache.store import ObjectStore

if TYPE_CHECKING:
    from collections.abc import Callable

    from fusevol.kube.client import KubeClient

LIST_S = 0.1
TIMEOUT_S = 0.25
KEYS = [ObjectKey(Kind.CONFIG_MAP, "default", f"cm-{i}") for i in range(6)]


class IdleStream:
    """A watch on which nothing happens: its reader parks."""

    def ready(self) -> bool:
        return False

    def park(self, callback: Callable[[], None]) -> None:
        pass

    async def next_event(self) -> None:
        await trio.sleep_forever()

    def close(self) -> None:
        pass


class SlowClient:
    def __init__(self, *, answers: bool) -> None:
        self.answers = answers
        self.horizon: dict[Kind, int] = {}
        self.listing = 0
        self.most_listing = 0

    async def list(self, kind: Kind, **query: Any) -> tuple[list[Any], str]:
        self.listing += 1
        self.most_listing = max(self.most_listing, self.listing)
        try:
            if not self.answers:
                await trio.sleep_forever()
            await trio.sleep(LIST_S)
        finally:
            self.listing -= 1
        return [], "7"

    async def open_watch(self, kind: Kind, **query: Any) -> IdleStream:
        return IdleStream()


async def ensure_all(client: SlowClient) -> tuple[float, list[bool]]:
    """How long `ensure` of every key took, and which keys were read by then."""
    async with trio.open_nursery() as nursery:
        tracker = WatchedObjects(
            client=cast("KubeClient", client),
            store=ObjectStore(),
            nursery=nursery,
            origin="test",
            on_claim=lambda: None,
        )
        tracker.set_wanted(set(KEYS))
        started = trio.current_time()
        await tracker.ensure(set(KEYS), timeout_s=TIMEOUT_S)
        took = trio.current_time() - started
        nursery.cancel_scope.cancel()
    return took, [tracker.read(key) for key in KEYS]


@pytest.fixture(autouse=True)
def two_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(objects, "STARTS_AT_ONCE", 2)


async def test_a_pod_waits_for_its_objects_while_their_watches_start_one_after_the_other(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Six watches two at a time take three lists' time, longer than the pod's wait: the wait
    lasts while starts end, and every object is read when it returns."""
    client = SlowClient(answers=True)
    took, read = await ensure_all(client)
    assert read == [True] * len(KEYS)
    assert took == pytest.approx(3 * LIST_S, abs=0.01)
    assert client.most_listing == 2


async def test_a_server_that_answers_nothing_costs_the_wait_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    took, read = await ensure_all(SlowClient(answers=False))
    assert read == [False] * len(KEYS)
    assert took == pytest.approx(TIMEOUT_S, abs=objects.ENSURE_POLL_S)
