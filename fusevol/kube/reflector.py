"""Reflector: keep one list+watch query mirrored, whatever the API server and the network do.

client-go's reflector (and kopf's watch loop), as small stages:

1. LIST (with the query's field selector) -> the handler's `on_replace(items)`, the complete
   current state (the list is the handler's: it may empty it once read); `synced` is set after
   the first one. The first asks for resourceVersion 0, whatever the API server's watch cache
   holds, as client-go's first list does (thousands of watches starting read no etcd).
2. WATCH from the list's resourceVersion, bookmarks requested. Each ADDED/MODIFIED/DELETED event
   goes to its `on_event`; every event, BOOKMARK included, moves the resourceVersion on, so that a
   reconnect resumes where the stream stopped and does not need a relist.
3. The stream ends (the server's `timeoutSeconds`, randomised in [5, 10) min like client-go's):
   watch again from the last resourceVersion (2).
4. ERROR 410 Gone (the version was compacted away, or a restarted API server's watch cache starts
   later): relist (1), and `on_replace` converges the mirror. The relist asks for a state no older
   than the last resourceVersion seen, which the API server serves from its watch cache (client-go's
   relist after an expired watch); only if it cannot (410, or 504 "too large resource version": a
   cache behind) is the list read from etcd (resourceVersion unset). After an API server restart
   every watch gets its 410 at once: thousands of relists, served from the new watch cache; those of
   one named object each are asked of their kind and namespace together first (`relists`: one list
   of names and versions), and an object that did not change meanwhile is not read again. The 410's
   message says where the server's watch cache of the resource starts ("too old resource version: 41
   (57)": from 57 on); the client keeps that horizon (`learn_horizon`) and answers every other watch
   of that resource from before it the server's 410 itself, without a request, queued or not. A list
   older than the horizon (another API server behind the same address, whose cache is behind) drops
   it: a wrong horizon costs a list, never a loop. The first time at once; a 410 again before the
   new watch delivered anything (a server whose watch cache is broken) waits the same backoff as
   (5), as client-go's reflector waits its backoff before every relist: never a tight list-watch
   loop against a sick server.
5. Any other failure (connection reset, a watch cut mid-event, a 5xx): wait with exponential
   backoff (0.8 s doubling to 30 s, jittered, as client-go's), then resume from the last
   resourceVersion, or relist if there is none. When no connection to the server could be made
   at all (`ApiUnreachable`: it is away), the reflector waits instead for the client to reach it
   again (one dialer for the whole agent, every 2 s at most), then resumes after a jitter of up
   to half a second: the watches of an agent come back together within 2.5 s of the server's
   return, whatever their own backoff had grown to, over the one new connection, never all at
   the same instant. Nothing is dropped meanwhile: what was
   delivered stays delivered, so an API server that is away for minutes changes nothing on the
   node until it is back. A refusal (401, 403: the Node authorizer's "no relationship found
   between node ... and this object", a pod's RBAC) is such a failure too, with the same backoff
   (never a hot retry), one ERROR line naming the query and the server's message, and `refused`
   holding that message until a list succeeds; `settled` is set by the first list or the first
   refusal, so that nobody waits for an object the server will not give.

The client's calls are awaited on the trio thread (each watch a stream of the client's one HTTP/2
connection, no thread); a cancelled reflector closes its stream. A reflector given `resume` holds
no task while its watch waits for the server (thousands of watched objects are idle for hours,
and a waiting task is 3-4 KB of frames, task and cancel status): `run()` returns instead
(*parked*), and the stream calls `resume()` once it has something, to run it again.

What a reflector is given is `query`'s (the `Query`, its `Handler`); (5)'s backoff is `backoff`'s,
the set-once flags (`synced`, `settled`, `started`) `flag`'s.

Excludes: what the items mean (the handlers), and conversion of objects.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from fusevol.kube.backoff import Backoff
from fusevol.kube.client import TOO_OLD, behind_horizon, learn_horizon
from fusevol.kube.errors import ApiError, ApiUnavailable, ApiUnreachable
from fusevol.kube.flag import Flag, raised

if TYPE_CHECKING:
    from collections.abc import Callable

    from fusevol.kube.client import KubeClient, Obj
    from fusevol.kube.listing import Items
    from fusevol.kube.query import Handler, Query
    from fusevol.kube.relists import Relists
    from fusevol.kube.watch import WatchStream

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = (300, 600)
"""client-go's minWatchTimeout is 5 min, each watch asking for a random timeout up to twice that."""


RESUME_JITTER_S = 0.5
"""After the server is reachable again (5): each reflector resumes within this, at random."""


@dataclass(slots=True)
class ReflectorStatistics:
    lists: int = 0
    watches: int = 0
    events: int = 0
    bookmarks: int = 0
    expired: int = 0
    """410s: the server's, and the client's for watches behind the horizon (4)."""
    failures: int = 0
    resource_version: str = ""


class Reflector:
    """Steps 1-5 of the module docstring for one query (one per watched object: slots)."""

    __slots__ = (
        "_backoff",
        "_client",
        "_expiring",
        "_expiry_backoff",
        "_handler",
        "_relist_from",
        "_relists",
        "_resume",
        "_stream",
        "_version",
        "query",
        "refused",
        "settled",
        "started",
        "stats",
        "synced",
    )

    def __init__(
        self,
        *,
        client: KubeClient,
        query: Query,
        handler: Handler,
        backoff: Backoff | None = None,
        resume: Callable[[], None] | None = None,
        stats: ReflectorStatistics | None = None,
        relists: Relists | None = None,
    ) -> None:
        """`resume`: parks the watch while it waits (module docstring); called from the
        connection's task when the stream has something, it must call `run()` again in a task
        and return at once. `stats`: counters shared with other reflectors (thousands of
        watched objects count together; its `resource_version` is then whichever moved last).
        `relists`: a query of one named object relists through it first (4)."""
        self._client = client
        self.query = query
        self._handler = handler
        self._backoff = backoff
        """(5)'s, made at the first failure (`_failing`) unless given."""
        self._expiring = False
        """A 410 came, and no event since: (4) backs off on the next one."""
        self._expiry_backoff: Backoff | None = None
        """(4)'s, made at the second 410 in a row."""
        self.synced = Flag()
        """Set by the first list. A flag once set is the one all reflectors share (`raised`):
        to be read through the reflector, never kept."""
        self.settled = Flag()
        """Set by the first list, or the first refusal (5)."""
        self.started = Flag()
        """Set once the reflector first parked (its list and watch done), failed (5) otherwise
        than by finding no server at all, or was closed: what a caller starting reflectors a
        few at a time waits for."""
        self.refused = ""
        """The server's message while it refuses the query (401, 403); "" otherwise."""
        self.stats = stats or ReflectorStatistics()
        self._version = ""
        """Where the next watch resumes; empty: list first."""
        self._relist_from = ""
        """The last resourceVersion of an expired watch: the next list is no older (4)."""
        self._resume = resume
        self._relists = relists if query.name else None
        self._stream: WatchStream | None = None
        """The open watch, between `run()`s while parked."""

    async def run(self) -> None:
        """Steps 1-5 of the module docstring, until cancelled, or until parked (`resume`)."""
        while True:
            try:
                if self._stream is None:
                    if not self._version:
                        self._version = await self._list()  # (1)
                    self._stream = await self._open()  # (2)
                if await self._follow():
                    return  # parked
            except ApiError as exc:
                if exc.code == 410:  # (4)
                    await self._expired(exc)
                    continue
                await self._failed(exc)  # (5)
            except ApiUnreachable as exc:
                await self._unreachable(exc)  # (5)
            except ApiUnavailable as exc:
                await self._failed(exc)  # (5)

    async def _list(self) -> str:
        since, self._relist_from = self._relist_from, ""
        items: Items | None
        answer = None
        if since and self._relists is not None:
            query = self.query
            answer = await self._relists.check(query.kind, query.namespace, query.name, since)
        if answer is not None:  # no list of its own: gone, or as it was (nothing to deliver)
            items, version = ([] if answer.gone else None), answer.version
        else:
            items, version = await self._list_since(since)
            self.stats.lists += 1
        log.debug(
            "listed query=%s items=%s version=%s",
            self.query,
            "unchanged" if items is None else len(items),
            version,
        )
        horizon = self._client.horizon
        if behind_horizon(horizon, self.query.kind, version):  # (4): not this server's
            del horizon[self.query.kind]
        self.refused = ""
        if items is not None:
            await self._handler.on_replace(items)
        self.synced = raised(self.synced)
        self.settled = raised(self.settled)
        if self._backoff is not None:
            self._backoff.reset()
        return str(version)

    async def _list_since(self, since: str) -> tuple[Items, str]:
        try:
            return await self._list_from(since or "0")  # (1): the watch cache's, any
        except ApiError as exc:
            if not since or exc.code not in (410, 504):
                raise
            log.debug("relist from %s refused, reading etcd query=%s: %s", since, self.query, exc)
            return await self._list_from("")

    async def _list_from(self, resource_version: str) -> tuple[Items, str]:
        return await self._client.list(
            self.query.kind,
            namespace=self.query.namespace,
            field_selector=self.query.field_selector,
            label_selector=self.query.label_selector,
            resource_version=resource_version,
        )

    def close(self) -> None:
        """Close the watch (a parked reflector's: it has no task to cancel). Idempotent."""
        self.started = raised(self.started)
        if (stream := self._stream) is not None:
            self._stream = None
            stream.close()

    async def _open(self) -> WatchStream:
        stream = await self._client.open_watch(
            self.query.kind,
            namespace=self.query.namespace,
            field_selector=self.query.field_selector,
            resource_version=self._version,
            timeout_s=random.randrange(*WATCH_TIMEOUT_S),
            label_selector=self.query.label_selector,
        )
        self.stats.watches += 1
        return stream

    async def _follow(self) -> bool:
        """Follow the open watch, moving `_version` on with every event, until it ends (3):
        False; or until it waits for the server with `resume` given (parked), or an event's
        handler closed it: True."""
        stream = self._stream
        assert stream is not None
        try:
            while self._stream is stream:
                if self._resume is not None and not stream.ready():
                    stream.park(self._resume)
                    self.started = raised(self.started)
                    return True
                if (event := await stream.next_event()) is None:  # (3)
                    break
                await self._take(event)
                del event  # not held while the next is awaited: for minutes, by thousands
            else:
                return True
        except BaseException:
            self.close()
            raise
        self.close()
        return False

    async def _take(self, event: Obj) -> None:
        """One event of the watch (2)."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            code = int(obj.get("code") or 0)
            raise ApiError(code, obj.get("reason", ""), obj.get("message", ""))
        version = str(obj.get("metadata", {}).get("resourceVersion") or self._version)
        self._version = self.stats.resource_version = version
        if self._backoff is not None:
            self._backoff.reset()
        self._expiring = False
        self._expiry_backoff = None
        if kind == "BOOKMARK":
            self.stats.bookmarks += 1
            return
        self.stats.events += 1
        await self._handler.on_event(str(kind), obj)

    async def _expired(self, exc: ApiError) -> None:
        self.stats.expired += 1
        self._relist_from, self._version = self._version, ""
        if not self._expiring:
            self._expiring = True
            if learn_horizon(self._client.horizon, self.query.kind, exc):
                log.info(
                    "the API server's watch cache starts later: watches of %ss from before it "
                    "relist (query=%s: %s)",
                    self.query.kind.value.lower(),
                    self.query,
                    exc,
                )
            else:
                log.log(
                    logging.DEBUG if TOO_OLD.search(str(exc)) else logging.INFO,
                    "watch expired, relisting query=%s: %s",
                    self.query,
                    exc,
                )
            return
        if self._expiry_backoff is None:
            backoff = self._failing()
            self._expiry_backoff = Backoff(backoff.initial_s, backoff.max_s)
        delay = self._expiry_backoff.next_delay()
        log.debug("watch expired again, relisting query=%s in=%.1fs: %s", self.query, delay, exc)
        await trio.sleep(delay)

    def _failing(self) -> Backoff:
        if self._backoff is None:
            self._backoff = Backoff()
        return self._backoff

    async def _unreachable(self, exc: ApiUnreachable) -> None:
        """(5) when nothing could be sent: until the client reaches the server again."""
        self.stats.failures += 1
        self._failing().failures += 1
        log.debug("API server unreachable query=%s error=%s", self.query, exc)
        await self._client.wait_reachable()
        await trio.sleep(random.uniform(0, RESUME_JITTER_S))

    async def _failed(self, exc: Exception) -> None:
        self.stats.failures += 1
        # this object's own trouble, maybe: not the turn of others
        self.started = raised(self.started)
        backoff = self._failing()
        delay = backoff.next_delay()
        first = backoff.failures <= 1
        if isinstance(exc, ApiError) and exc.code in (401, 403):
            self.refused = str(exc)
            self.settled = raised(self.settled)
            level = logging.ERROR if first else logging.DEBUG
            log.log(level, "read refused query=%s retry_in=%.1fs error=%s", self.query, delay, exc)
        else:  # a connection lost under all its streams was said once, by the client
            said = isinstance(exc, ApiUnavailable) and exc.said
            level = logging.WARNING if first and not said else logging.DEBUG
            log.log(level, "watch failed query=%s retry_in=%.1fs error=%s", self.query, delay, exc)
        await trio.sleep(delay)
