"""The objects the pods reference (ConfigMaps, Secrets, claims, volumes), kept current in the store
by one of kubelet's change-detection strategies (`configMapAndSecretChangeDetectionStrategy`,
docs/kubelet.md fact 7):

- `WatchedObjects` (Watch, the default): one list+watch per referenced object (fieldSelector
  `metadata.name=<name>`), opened when the first pod references it and closed after the last; an
  object seen `immutable: true` is not watched any more (it cannot change; it stays in the store).
  An edit reaches the store as soon as the API server sends its watch event. Watches start
  `STARTS_AT_ONCE` at a time, the others queued; an idle one holds no task (the reflector parks).
  Those read with the agent's own credentials relist together (`fusevol.kube.relists`: after an
  API server restart, one list of names and versions per namespace and kind, not one per object).
- `FetchedObjects` (Cache and Get): a GET per object when a pod that references it is added or
  updated (for Cache this invalidates the cached copy, as kubelet's `AddReference` does), and at
  every sync period either for each object whose copy is older than the TTL (Cache, a cachetools
  TTLCache of fetch times) or for every object (Get).

Both keep only referenced objects: one that no pod references any more leaves the store. A GET
answering 404 and a watch's DELETED delete the object from the store (the volumes then follow
kubelet's rules: an optional one becomes empty, a required one keeps its last content). An object
the API server refuses to give (401, 403) is retried with the usual backoff, never hot, and
`refusal(key)` says why, for the volume's error; `ensure` does not wait for it.

`RoutedObjects` sends each key to the tracker its kind (or its reader) needs: under a node's
identity, claims and PersistentVolumes are fetched (the Node authorizer lets a node only get them,
never list or watch), ConfigMaps and Secrets watched; read as a pod, a CSI volume's objects are
watched with that pod's token (`client_for`).

Excludes: which objects are referenced (`references`), and the list/watch mechanics (`reflector`).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import cachetools
import trio

from fusevol.base.errors import FusevolError
from fusevol.kube.documents import convert
from fusevol.kube.errors import ApiError
from fusevol.kube.query import Query
from fusevol.kube.reflector import Reflector, ReflectorStatistics
from fusevol.kube.relists import Relists
from fusevol.model import ConfigMap, PersistentVolumeClaim, Secret

if TYPE_CHECKING:
    from collections.abc import Callable

    from fusevol.kube.client import KubeClient, Obj
    from fusevol.kube.listing import Items
    from fusevol.model import ObjectKey
    from fusevol.volumemanager.cache.store import ObjectStore

log = logging.getLogger(__name__)

FETCHES_IN_FLIGHT = 32
"""GETs of the Cache and Get strategies at once: a sync of thousands of objects is a queue."""
STARTS_AT_ONCE = 64
"""Watches starting (their list, then their watch) at once, as many as the client's requests in
flight; the others wait their turn in a queue. 6000 started at once were 6000 tasks waiting on
the client, and Python's heap keeps such a peak: what is freed after it lies scattered among what
stays (12 MiB of the agent's RSS at 3000 pods)."""
ENSURE_POLL_S = 0.1
"""How often `ensure` looks whether the watches still start while it waits for one."""


@dataclass(frozen=True, slots=True)
class TrackerStatistics:
    objects: int
    watches: int
    immutable: int
    fetches: int
    """Objects read since the start: lists (Watch), GETs (Cache, Get)."""


class ObjectTracker(Protocol):
    def set_wanted(self, keys: set[ObjectKey]) -> None:
        """Track exactly `keys` from now on; objects no longer wanted leave the store."""

    async def ensure(self, keys: set[ObjectKey], *, timeout_s: float) -> None:
        """A pod referencing `keys` was added or updated: return once they are in the store (or
        known to be absent), or after `timeout_s` in which no read of an object ended."""

    async def sync(self) -> None:
        """The periodic sync (Cache and Get refetch; Watch has nothing to do)."""

    def read(self, key: ObjectKey) -> bool:
        """`key` is tracked and was read since: the store's copy, or its absence, is the API's
        (a DELETED event, a list or a GET without it), not merely a watch still listing."""

    def refusal(self, key: ObjectKey) -> str:
        """The API server's message while it refuses to give `key` (401, 403); "" otherwise."""

    def statistics(self) -> TrackerStatistics: ...


class WatchedObjects:
    def __init__(
        self,
        *,
        client: KubeClient,
        store: ObjectStore,
        nursery: trio.Nursery,
        origin: str,
        on_claim: Callable[[], None],
        client_for: Callable[[ObjectKey], KubeClient] | None = None,
    ) -> None:
        """`on_claim()` after a claim changed: the volumes to track may have changed.
        `client_for(key)`: the client that watches `key` (default: `client`)."""
        self._on_claim = on_claim
        self._client = client
        self._client_for = client_for or (lambda key: client)
        self._store = store
        self._nursery = nursery
        self._origin = origin
        self._watches: dict[ObjectKey, _Watch] = {}
        self._immutable: set[ObjectKey] = set()
        self._to_start: collections.deque[_Watch] = collections.deque()
        self._starters = 0
        self._starts_ended = 0
        self._reflected = ReflectorStatistics()
        """Every watch's reflector counts here (`fetches`: lists since the start)."""
        self._relists = Relists(client)
        """Where the watches read with `client` relist together (`fusevol.kube.relists`)."""

    def set_wanted(self, keys: set[ObjectKey]) -> None:
        for key in self._watches.keys() - keys:
            self._watches.pop(key).stop()
            self._store.delete(key)
            log.debug("watch closed object=%s", key)
        for key in self._immutable - keys:
            self._immutable.discard(key)
            self._store.delete(key)
        for key in keys - self._watches.keys() - self._immutable:
            self._start(key)

    async def ensure(self, keys: set[ObjectKey], *, timeout_s: float) -> None:
        """Watches start a few at a time, and thousands of them one after the other: the wait
        ends `timeout_s` after the last start that ended, not after the first (a server that
        answers nothing costs `timeout_s` once)."""
        waiting = collections.deque(w for key in keys if (w := self._watches.get(key)) is not None)
        progress, deadline = self._starts_ended, trio.current_time() + timeout_s
        while waiting:
            watch = waiting[0]
            if watch.reflector.settled.is_set() or not watch.wanted():
                waiting.popleft()
                continue
            now = trio.current_time()
            if self._starts_ended != progress:
                progress, deadline = self._starts_ended, now + timeout_s
            if now >= deadline:
                return
            with trio.move_on_after(min(ENSURE_POLL_S, deadline - now)):
                await watch.reflector.settled.wait()

    async def sync(self) -> None:
        pass

    def read(self, key: ObjectKey) -> bool:
        if key in self._immutable:
            return True
        watch = self._watches.get(key)
        return watch is not None and watch.reflector.synced.is_set()

    def refusal(self, key: ObjectKey) -> str:
        watch = self._watches.get(key)
        return watch.reflector.refused if watch is not None else ""

    def statistics(self) -> TrackerStatistics:
        return TrackerStatistics(
            objects=len(self._watches) + len(self._immutable),
            watches=len(self._watches),
            immutable=len(self._immutable),
            fetches=self._reflected.lists + self._relists.lists,
        )

    def _start(self, key: ObjectKey) -> None:
        watch = _Watch(self, key)
        self._watches[key] = watch
        self._to_start.append(watch)
        if self._starters < STARTS_AT_ONCE:
            self._starters += 1
            self._nursery.start_soon(self._starter)
        log.debug("watch opened object=%s", key)

    async def _starter(self) -> None:
        """Start the queued watches one after the other (`STARTS_AT_ONCE` starters at most)."""
        try:
            while self._to_start:
                watch = self._to_start.popleft()
                if watch.wanted():
                    self._nursery.start_soon(watch.run)
                    await watch.reflector.started.wait()
                    self._starts_ended += 1
        finally:
            self._starters -= 1

    def _immutable_seen(self, key: ObjectKey) -> None:
        """kubelet's watch-based manager stops watching what cannot change."""
        self._immutable.add(key)
        if (watch := self._watches.pop(key, None)) is not None:
            watch.stop()
            log.debug("immutable, watch closed object=%s", key)


class _Watch:
    """One object's list+watch (thousands of them: a few slots, no closures). No task while its
    watch waits for the server (the reflector parks; calling the watch runs it again)."""

    __slots__ = ("key", "reflector", "scope", "tracker")

    def __init__(self, tracker: WatchedObjects, key: ObjectKey) -> None:
        self.tracker = tracker
        self.key = key
        self.scope: trio.CancelScope | None = None
        """The running task's, None while parked."""
        client = tracker._client_for(key)
        self.reflector = Reflector(
            client=client,
            query=Query(key.kind, key.namespace or None, "", name=key.name),
            handler=self,
            resume=self,  # called, a watch resumes: no bound method kept for each of thousands
            stats=tracker._reflected,
            relists=tracker._relists if client is tracker._client else None,
        )

    async def run(self) -> None:
        """The reflector's work, until it parks, or the watch is stopped."""
        if self.wanted():
            with trio.CancelScope() as self.scope:
                await self.reflector.run()
            self.scope = None
        if not self.wanted():  # stopped before this task started, or while a watch opened
            self.reflector.close()

    def wanted(self) -> bool:
        return self.tracker._watches.get(self.key) is self

    def __call__(self) -> None:
        """Resume: the reflector's `resume` (its stream has something)."""
        try:
            self.tracker._nursery.start_soon(self.run)
        except RuntimeError:  # the nursery is closed: the agent stops
            self.reflector.close()

    def stop(self) -> None:
        if self.scope is not None:
            self.scope.cancel()
        self.reflector.close()

    async def on_replace(self, items: Items) -> None:
        if items:
            await self.on_event("ADDED", items[0])
        else:
            self.tracker._store.delete(self.key)

    async def on_event(self, kind: str, raw: Obj) -> None:
        tracker = self.tracker
        if kind == "DELETED":
            tracker._store.delete(self.key)
            return
        obj = convert(raw, origin=tracker._origin)
        if obj is None or obj.key != self.key:
            return
        if tracker._store.upsert(obj, self.key) and isinstance(obj, PersistentVolumeClaim):
            tracker._on_claim()
        if isinstance(obj, (ConfigMap, Secret)) and obj.immutable:
            tracker._immutable_seen(self.key)


class FetchedObjects:
    def __init__(
        self,
        *,
        client: KubeClient,
        store: ObjectStore,
        ttl_s: float | None,
        origin: str,
        on_claim: Callable[[], None],
    ) -> None:
        """`ttl_s`: the Cache strategy's TTL; None for Get (no cache). `on_claim` as above."""
        self._on_claim = on_claim
        self._client = client
        self._store = store
        self._origin = origin
        self._wanted: set[ObjectKey] = set()
        self._fresh: cachetools.TTLCache[ObjectKey, bool] | None = (
            None
            if ttl_s is None
            else cachetools.TTLCache(maxsize=1 << 20, ttl=ttl_s, timer=time.monotonic)
        )
        self._fetches = 0
        self._fetching = trio.Semaphore(FETCHES_IN_FLIGHT)
        self._read: set[ObjectKey] = set()
        self._refused: dict[ObjectKey, str] = {}

    def set_wanted(self, keys: set[ObjectKey]) -> None:
        for key in self._wanted - keys:
            self._store.delete(key)
            self._read.discard(key)
            self._refused.pop(key, None)
            if self._fresh is not None:
                self._fresh.pop(key, None)
        self._wanted = set(keys)

    async def ensure(self, keys: set[ObjectKey], *, timeout_s: float) -> None:
        if self._fresh is not None:
            for key in keys:
                self._fresh.pop(key, None)  # a pod add/update invalidates (kubelet)
        with trio.move_on_after(timeout_s):
            await self._fetch_all(keys)

    async def sync(self) -> None:
        fresh = self._fresh
        await self._fetch_all({k for k in self._wanted if fresh is None or k not in fresh})

    def read(self, key: ObjectKey) -> bool:
        return key in self._read

    def refusal(self, key: ObjectKey) -> str:
        return self._refused.get(key, "")

    def statistics(self) -> TrackerStatistics:
        return TrackerStatistics(len(self._wanted), 0, 0, self._fetches)

    async def _fetch_all(self, keys: set[ObjectKey]) -> None:
        async with trio.open_nursery() as nursery:
            for key in keys:
                nursery.start_soon(self._fetch, key)

    async def _fetch(self, key: ObjectKey) -> None:
        self._fetches += 1
        try:
            async with self._fetching:
                raw = await self._client.get(key.kind, namespace=key.namespace, name=key.name)
        except ApiError as exc:
            if exc.code not in (401, 403):
                log.warning("get failed, keeping the last copy object=%s error=%s", key, exc)
            elif key in self._wanted and key not in self._refused:
                log.error("read refused object=%s error=%s", key, exc)
            if exc.code in (401, 403) and key in self._wanted:
                self._refused[key] = str(exc)
            return
        except FusevolError as exc:
            log.warning("get failed, keeping the last copy object=%s error=%s", key, exc)
            return
        if key not in self._wanted:
            return
        self._refused.pop(key, None)
        if raw is None:
            self._store.delete(key)
        elif (
            (obj := convert(raw, origin=self._origin)) is not None
            and obj.key == key
            and self._store.upsert(obj)
            and isinstance(obj, PersistentVolumeClaim)
        ):
            self._on_claim()
        self._read.add(key)
        if self._fresh is not None:
            self._fresh[key] = True


class RoutedObjects:
    """Trackers by key: `route(key)` picks the one that tracks it (see the module docstring)."""

    def __init__(
        self, *, trackers: tuple[ObjectTracker, ...], route: Callable[[ObjectKey], int]
    ) -> None:
        """`route(key)`: the index in `trackers` of the one for `key`."""
        self._trackers = trackers
        self._route = route

    def set_wanted(self, keys: set[ObjectKey]) -> None:
        parts: list[set[ObjectKey]] = [set() for _ in self._trackers]
        for key in keys:
            parts[self._route(key)].add(key)
        for tracker, part in zip(self._trackers, parts, strict=True):
            tracker.set_wanted(part)

    async def ensure(self, keys: set[ObjectKey], *, timeout_s: float) -> None:
        async with trio.open_nursery() as nursery:
            for index, tracker in enumerate(self._trackers):
                if part := {key for key in keys if self._route(key) == index}:
                    nursery.start_soon(_ensure, tracker, part, timeout_s)

    async def sync(self) -> None:
        for tracker in self._trackers:
            await tracker.sync()

    def read(self, key: ObjectKey) -> bool:
        return self._trackers[self._route(key)].read(key)

    def refusal(self, key: ObjectKey) -> str:
        return self._trackers[self._route(key)].refusal(key)

    def statistics(self) -> TrackerStatistics:
        parts = [dataclasses.astuple(tracker.statistics()) for tracker in self._trackers]
        return TrackerStatistics(*(sum(column) for column in zip(*parts, strict=True)))


async def _ensure(tracker: ObjectTracker, keys: set[ObjectKey], timeout_s: float) -> None:
    await tracker.ensure(keys, timeout_s=timeout_s)
