"""The reflector (`fusevol.kube.reflector`) over a scripted client: each numbered step of
its docstring, with the exact calls it makes, in order.

The client answers `list` from a dict and each `open_watch` with a stream the test feeds (events,
the stream's end, a 410, a failure to connect), as the API server's list and watch do.
tests/kube shows the same against the loopback API server over HTTP.
"""

from __future__ import annotations

import copy
import logging
import queue
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import pytest
import trio
import trio.testing

from fusevol.kube.backoff import Backoff
from fusevol.kube.client import behind_horizon
from fusevol.kube.errors import ApiError, ApiUnavailable, ApiUnreachable
from fusevol.kube.query import Callbacks, Query
from fusevol.kube.reflector import RESUME_JITTER_S, Reflector
from fusevol.kube.relists import Answer
from fusevol.model import Kind

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from fusevol.kube.client import KubeClient
    from fusevol.kube.listing import Items
    from fusevol.kube.relists import Relists

Obj = dict[str, Any]
QUERY = Query(Kind.CONFIG_MAP, "default", "metadata.name=app")


def configmap(version: str, value: str = "1") -> Obj:
    return {"metadata": {"name": "app", "resourceVersion": version}, "data": {"a": value}}


class Stream:
    """One watch: what the test feeds it, read by `next_event`."""

    def __init__(self, resource_version: str) -> None:
        self.resource_version = resource_version
        self._events: queue.Queue[Obj | None] = queue.Queue()
        self.closed = False

    def send(self, kind: str, obj: Obj) -> None:
        self._events.put({"type": kind, "object": obj})

    def end(self) -> None:
        """The server ends the watch (its timeoutSeconds)."""
        self._events.put(None)

    async def next_event(self) -> Obj | None:
        if self.closed:
            return None
        return await trio.to_thread.run_sync(self._events.get, abandon_on_cancel=True)

    def close(self) -> None:
        self.closed = True
        self._events.put(None)


@dataclass
class ScriptedClient:
    items: list[Obj] = field(default_factory=list)
    version: str = "10"
    lists: int = 0
    streams: list[Stream] = field(default_factory=list)
    refuse_watches: int = 0
    """The next this many `open_watch` calls fail to connect."""
    unreachable_watches: int = 0
    """The next this many `open_watch` calls find no connection at all (the server is away)."""
    reachable: trio.Event = field(default_factory=trio.Event)
    """Set: `wait_reachable` returns (a connection to the server is open again)."""
    waiting_for_reach: int = 0
    list_versions: list[str] = field(default_factory=list)
    """The `resource_version` of every list, in order."""
    too_large: bool = False
    """A list from a resourceVersion gets kube-apiserver's 504 "Too large resource version"."""
    horizon: dict[Kind, int] = field(default_factory=dict)

    async def list(self, kind: Kind, **query: Any) -> tuple[list[Obj], str]:
        assert (kind, query["namespace"], query["field_selector"]) == (
            QUERY.kind,
            QUERY.namespace,
            QUERY.field_selector,
        )
        self.lists += 1
        self.list_versions.append(query.get("resource_version", ""))
        if self.too_large and query.get("resource_version"):
            raise ApiError(504, "Timeout", "Too large resource version")
        return copy.deepcopy(self.items), self.version

    async def open_watch(self, kind: Kind, **query: Any) -> Stream:
        assert 300 <= query["timeout_s"] < 600  # client-go's randomised watch timeout
        if self.refuse_watches:
            self.refuse_watches -= 1
            raise ApiUnavailable("connection refused")
        if self.unreachable_watches:
            self.unreachable_watches -= 1
            raise ApiUnreachable("connection refused, and none open")
        if behind_horizon(self.horizon, kind, query["resource_version"]):  # as KubeClient does
            since, oldest = query["resource_version"], self.horizon[kind]
            raise ApiError(410, "Expired", f"too old resource version: {since} ({oldest})")
        stream = Stream(query["resource_version"])
        self.streams.append(stream)
        return stream

    async def wait_reachable(self) -> None:
        self.waiting_for_reach += 1
        await self.reachable.wait()


@dataclass
class Mirror:
    client: ScriptedClient
    reflector: Reflector
    calls: list[tuple[str, Any]]

    async def until(self, condition: Callable[[], bool]) -> None:
        with trio.fail_after(5):
            while not condition():
                await trio.sleep(0.001)

    async def watching(self, count: int) -> Stream:
        """The `count`-th watch, once the reflector opened it."""
        await self.until(lambda: len(self.client.streams) >= count)
        return self.client.streams[count - 1]


@pytest.fixture
async def mirror() -> AsyncIterator[Mirror]:
    client = ScriptedClient(items=[configmap("10")])
    calls: list[tuple[str, Any]] = []

    async def on_replace(items: Items) -> None:
        calls.append(("replace", [i["metadata"]["resourceVersion"] for i in items]))

    async def on_event(kind: str, obj: Obj) -> None:
        calls.append((kind, obj["metadata"]["resourceVersion"]))

    reflector = Reflector(
        client=cast("KubeClient", client),
        query=QUERY,
        handler=Callbacks(on_replace, on_event),
        backoff=Backoff(initial_s=0.01, max_s=0.05),
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reflector.run)
        yield Mirror(client, reflector, calls)
        nursery.cancel_scope.cancel()


async def test_list_then_watch_from_its_version_events_in_order(mirror: Mirror) -> None:
    stream = await mirror.watching(1)
    assert mirror.reflector.synced.is_set()
    assert stream.resource_version == "10"
    stream.send("MODIFIED", configmap("11", "2"))
    stream.send("BOOKMARK", {"metadata": {"resourceVersion": "12"}})
    stream.send("DELETED", configmap("13"))
    await mirror.until(lambda: mirror.reflector.stats.resource_version == "13")
    assert mirror.calls == [("replace", ["10"]), ("MODIFIED", "11"), ("DELETED", "13")]
    assert (mirror.reflector.stats.bookmarks, mirror.reflector.stats.events) == (1, 2)


async def test_an_ended_watch_resumes_from_the_last_event_without_a_relist(
    mirror: Mirror,
) -> None:
    first = await mirror.watching(1)
    first.send("BOOKMARK", {"metadata": {"resourceVersion": "15"}})
    first.end()
    second = await mirror.watching(2)
    assert second.resource_version == "15"
    assert first.closed
    assert mirror.client.lists == 1


async def test_410_gone_relists_and_replaces_at_once_then_backs_off_if_it_repeats(
    mirror: Mirror, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="fusevol.kube.reflector")
    gone = {"code": 410, "reason": "Expired", "message": "too old resource version"}
    first = await mirror.watching(1)
    mirror.client.items, mirror.client.version = [configmap("20", "compacted")], "20"
    first.send("ERROR", gone)
    second = await mirror.watching(2)
    assert second.resource_version == "20"
    assert mirror.calls == [("replace", ["10"]), ("replace", ["20"])]
    second.send("ERROR", gone)  # again, before the new watch delivered anything
    await mirror.watching(3)
    assert mirror.client.lists == 3
    messages = [r.getMessage() for r in caplog.records]
    assert sum("watch expired, relisting" in m for m in messages) == 1
    assert sum("watch expired again, relisting" in m for m in messages) == 1  # waited a backoff
    assert all(r.levelno < logging.WARNING for r in caplog.records)


async def test_a_relist_after_410_is_no_older_than_the_last_version_else_from_etcd(
    mirror: Mirror,
) -> None:
    gone = {"code": 410, "reason": "Expired", "message": "too old resource version"}
    first = await mirror.watching(1)
    first.send("BOOKMARK", {"metadata": {"resourceVersion": "15"}})
    first.send("ERROR", gone)
    await mirror.watching(2)
    assert mirror.client.list_versions == ["0", "15"]  # the watch cache can serve them
    mirror.client.too_large = True  # a cache behind that version: read etcd instead
    (await mirror.watching(2)).send("ERROR", gone)
    await mirror.watching(3)
    assert mirror.client.list_versions == ["0", "15", "10", ""]


@dataclass
class ScriptedRelists:
    """`Relists` that answers from a list the test gives, and records what it was asked."""

    answers: list[Answer | None]
    asked: list[tuple[Kind, str | None, str, str]] = field(default_factory=list)

    async def check(
        self, kind: Kind, namespace: str | None, name: str, since: str
    ) -> Answer | None:
        self.asked.append((kind, namespace, name, since))
        return self.answers.pop(0)


async def test_a_relist_answered_with_its_namespace_reads_its_object_only_if_it_changed() -> None:
    client = ScriptedClient(items=[configmap("10")])
    relists = ScriptedRelists([Answer("20", gone=False), Answer("30", gone=True), None])
    calls: list[object] = []

    async def on_replace(items: Items) -> None:
        calls.append([i["metadata"]["resourceVersion"] for i in items])

    async def on_event(kind: str, obj: Obj) -> None:
        calls.append(kind)

    reflector = Reflector(
        client=cast("KubeClient", client),
        query=Query(QUERY.kind, QUERY.namespace, "", name="app"),  # one named object
        handler=Callbacks(on_replace, on_event),
        backoff=Backoff(initial_s=0.01, max_s=0.05),
        relists=cast("Relists", relists),
    )
    mirror = Mirror(client, reflector, [])
    gone = {"code": 410, "reason": "Expired", "message": "too old resource version"}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reflector.run)
        (await mirror.watching(1)).send("ERROR", gone)
        # Unchanged since the version its watch saw: not read, nothing delivered.
        second = await mirror.watching(2)
        assert (second.resource_version, client.lists, calls) == ("20", 1, [["10"]])
        second.send("ERROR", gone)
        # Gone: an empty list delivered, as its own list would have said.
        third = await mirror.watching(3)
        assert (third.resource_version, client.lists, calls) == ("30", 1, [["10"], []])
        third.send("ERROR", gone)
        # Changed (or no answer): its own list, no older than the version its watch saw.
        assert (await mirror.watching(4)).resource_version == "10"
        assert calls == [["10"], [], ["10"]]
        assert client.list_versions == ["0", "30"]
        nursery.cancel_scope.cancel()
    assert relists.asked == [(Kind.CONFIG_MAP, "default", "app", v) for v in ("10", "20", "30")]
    assert reflector.stats.lists == 2  # its own lists only: the namespace's are counted there


async def test_a_failed_watch_retries_from_its_version_warning_once(
    mirror: Mirror, caplog: pytest.LogCaptureFixture
) -> None:
    first = await mirror.watching(1)
    first.send("MODIFIED", configmap("11", "2"))
    await mirror.until(lambda: mirror.reflector.stats.resource_version == "11")
    mirror.client.refuse_watches = 3
    first.end()
    second = await mirror.watching(2)
    assert second.resource_version == "11"  # nothing delivered is dropped or relisted
    assert mirror.client.lists == 1
    assert mirror.reflector.stats.failures == 3
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage().split(" retry_in")[0] for r in warnings] == [
        f"watch failed query={QUERY}"
    ]
    caplog.clear()
    # A delivered event resets the backoff: the next failure warns again.
    second.send("MODIFIED", configmap("12", "3"))
    await mirror.until(lambda: mirror.reflector.stats.resource_version == "12")
    mirror.client.refuse_watches = 1
    second.end()
    await mirror.watching(3)
    assert [r.levelno for r in caplog.records if r.levelno >= logging.WARNING] == [logging.WARNING]
    caplog.clear()


def watch_with(client: ScriptedClient, calls: list[tuple[str, Any]]) -> Reflector:
    async def on_replace(items: Items) -> None:
        calls.append(("replace", [i["metadata"]["resourceVersion"] for i in items]))

    async def on_event(kind: str, obj: Obj) -> None:
        calls.append((kind, obj["metadata"]["resourceVersion"]))

    return Reflector(
        client=cast("KubeClient", client),
        query=QUERY,
        handler=Callbacks(on_replace, on_event),
        backoff=Backoff(initial_s=0.01, max_s=0.05),
    )


async def test_a_410_naming_where_the_watch_cache_starts_spares_the_other_watches_from_before_it(
    mirror: Mirror, caplog: pytest.LogCaptureFixture
) -> None:
    """A restarted API server answers every resume 410; its message says from where it can
    watch, so the reflectors of the same client resuming from before that relist at once."""
    caplog.set_level(logging.DEBUG, logger="fusevol.kube.reflector")
    first = await mirror.watching(1)
    first.send("BOOKMARK", {"metadata": {"resourceVersion": "15"}})
    await mirror.until(lambda: mirror.reflector.stats.resource_version == "15")
    restarted = "too old resource version: 15 (30)"
    mirror.client.items, mirror.client.version = [configmap("12")], "31"
    first.send("ERROR", {"code": 410, "reason": "Expired", "message": restarted})
    await mirror.watching(2)
    assert mirror.client.horizon == {Kind.CONFIG_MAP: 30}
    # Another reflector of the same client, whose last version is from before the restart.
    behind, ahead = watch_with(mirror.client, []), watch_with(mirror.client, [])
    behind._version = "20"
    ahead._version = "30"  # the oldest the cache can watch from: asked
    async with trio.open_nursery() as nursery:
        nursery.start_soon(behind.run)
        await mirror.watching(3)
        nursery.start_soon(ahead.run)
        await mirror.watching(4)
        nursery.cancel_scope.cancel()
    streams = mirror.client.streams
    assert [s.resource_version for s in streams] == ["10", "31", "31", "30"]
    assert mirror.client.list_versions == ["0", "15", "20"]  # no watch asked from 20
    assert (behind.stats.expired, behind.stats.watches, ahead.stats.expired) == (1, 1, 0)
    # A list older than the horizon (another API server behind the same address): forgotten.
    mirror.client.version = "25"
    streams[1].send("ERROR", {"code": 410, "reason": "Expired", "message": "too old: 31 (29)"})
    assert (await mirror.watching(5)).resource_version == "25"
    assert mirror.client.horizon == {}
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert infos == [
        "the API server's watch cache starts later: watches of configmaps from before it "
        f"relist (query={QUERY}: Expired: {restarted})"
    ]


async def test_a_watch_that_finds_the_server_unreachable_resumes_once_it_is_reachable(
    mirror: Mirror, caplog: pytest.LogCaptureFixture
) -> None:
    """Not after its own backoff, grown while the server was away: when the client (one dialer
    for every reflector) reaches the server again, within a jitter of up to half a second."""
    first = await mirror.watching(1)
    first.send("BOOKMARK", {"metadata": {"resourceVersion": "15"}})
    await mirror.until(lambda: mirror.reflector.stats.resource_version == "15")
    mirror.reflector._backoff = Backoff(initial_s=60, max_s=60)  # never reached in this test
    mirror.client.unreachable_watches = 1
    first.end()
    await mirror.until(lambda: mirror.client.waiting_for_reach == 1)
    await trio.sleep(0.05)
    assert len(mirror.client.streams) == 1  # waits for the server, not for a timer
    reached = trio.current_time()
    mirror.client.reachable.set()
    second = await mirror.watching(2)
    assert trio.current_time() - reached <= RESUME_JITTER_S + 0.1
    assert second.resource_version == "15"
    assert (mirror.client.lists, mirror.reflector.stats.failures) == (1, 1)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []  # the client says it


async def test_cancelling_the_reflector_closes_its_watch() -> None:
    client = ScriptedClient(items=[])

    async def ignore(*_: Any) -> None:
        pass

    reflector = Reflector(
        client=cast("KubeClient", client),
        query=QUERY,
        handler=Callbacks(ignore, ignore),
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reflector.run)
        with trio.fail_after(5):
            while not client.streams:
                await trio.sleep(0.001)
        nursery.cancel_scope.cancel()
    assert client.streams[0].closed


async def test_a_start_is_over_at_a_failure_of_its_own_not_while_no_server_answers() -> None:
    """`started` lets a caller start watches a few at a time: a watch that finds no server at all
    keeps its turn (every other would find none either); one that fails otherwise (refused, a
    5xx, an undecodable object: maybe its own trouble) gives it up."""
    client = ScriptedClient(items=[configmap("10")], unreachable_watches=1)
    reflector = watch_with(client, [])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reflector.run)
        with trio.fail_after(5):
            while not client.waiting_for_reach:
                await trio.sleep(0.001)
        assert reflector.settled.is_set()  # listed
        assert not reflector.started.is_set()
        client.refuse_watches = 1
        client.reachable.set()
        with trio.fail_after(5):
            await reflector.started.wait()
        assert (reflector.stats.failures, client.streams) == (2, [])
        nursery.cancel_scope.cancel()


async def test_set_flags_are_one_object_for_all_reflectors_and_their_waiters_wake() -> None:
    """Thousands of reflectors hold their flags for hours once set: each holds the one set flag
    then, and a backoff only from its first failure."""
    client = ScriptedClient(items=[configmap("10")])
    reflectors = [
        Reflector(client=cast("KubeClient", client), query=QUERY, handler=Callbacks(noop, noop))
        for _ in range(2)
    ]
    woken: list[Reflector] = []

    async def wait_synced(reflector: Reflector) -> None:
        await reflector.synced.wait()
        woken.append(reflector)

    async with trio.open_nursery() as nursery:
        for reflector in reflectors:
            nursery.start_soon(wait_synced, reflector)
        await trio.testing.wait_all_tasks_blocked()
        for reflector in reflectors:
            nursery.start_soon(reflector.run)
        with trio.fail_after(5):
            while len(client.streams) < 2 or len(woken) < 2:
                await trio.sleep(0.001)
        first, second = reflectors
        assert first.synced is second.synced is first.settled is second.settled
        assert first.synced.is_set()
        assert first._backoff is None
        nursery.cancel_scope.cancel()


async def noop(*_: object) -> None:
    pass
