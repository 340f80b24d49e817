"""Relists: the watches of one kind and namespace that relist together ask the server once.

After an API server restart, every watch of the agent gets its 410 within a second or two (the new
server's watch cache starts later than any of them, `reflector` (4)), and each would relist its one
object: 6000 LISTs at 3000 pods, for objects of which almost none changed while the server was away.
A reflector of one named object that relists asks `Relists.check` first. The first of a kind and
namespace waits `GATHER_S` for the others, then one LIST of the namespace's metadata (names and
resourceVersions, never an object's data: `KubeClient.list_versions`), no older than the newest
version any of them saw, answers every one of them:

- *unchanged*: its object's resourceVersion is not newer than the last its watch saw (so it has
  the object as it is now): the watch resumes from the list's version, the object is not read;
- *gone*: not in the list: deleted while the watch was away, as an empty list of its own says;
- *changed*, or anything else: the reflector lists its object itself.

When fewer than `BATCH_MIN` wait, or the namespace has more than `SIZE_RATIO` times as many objects
as relists wait (the list asks for at most that many, and a namespace found larger is not asked
again for as few), each lists its own object: a lone relist after a compaction stays one small LIST,
`GATHER_S` later. One list of a kind and namespace is in flight at a time; who comes meanwhile waits
for the next. A failed list answers nobody (each lists itself, and meets the failure there with its
own backoff); a refused one (403: a node's identity may list no namespace, only read its pods'
objects; a Role may allow some namespaces only) is never asked again for that kind and namespace.
The list carries every object's metadata (labels and annotations too, where `kubectl apply` keeps a
copy of what it applied: a Secret's data among them), which the agent may list anyway (its
ClusterRole): decoded one item at a time, only the names and versions kept, nothing logged. The
objects' resourceVersions are compared as numbers, as the reflector's horizon compares them (etcd's
revisions); a version that is not a number is left to its reflector.

Excludes: the reflector's steps (`reflector`), the request itself (`client`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from fusevol.kube.errors import ApiError, ApiUnavailable

if TYPE_CHECKING:
    from fusevol.kube.client import KubeClient
    from fusevol.model import Kind

log = logging.getLogger(__name__)

GATHER_S = 0.5
"""How long the first relist of a kind and namespace waits for others to join it: the reflectors'
jitter after the server is back (`reflector.RESUME_JITTER_S`), within which a restart's relists
come."""
BATCH_MIN = 8
"""Fewer relists than this list their objects one by one."""
SIZE_RATIO = 32
"""A namespace's metadata list costs about what this many lists of one object cost (its items are
decoded, a request is sent): it is asked for at most that many times the relists waiting (a
`limit`: a namespace of 50000 Secrets read for 8 relists would cost a node more than the 8
lists, and the API server 50000 objects for each node), never again for as few once found
larger."""


@dataclass(frozen=True, slots=True)
class Answer:
    """What the list says of one object."""

    version: str
    """The list's resourceVersion: where the watch resumes."""
    gone: bool


@dataclass(slots=True)
class _Batch:
    waiting: dict[str, int] = field(default_factory=dict)
    """The relisting watches' names, and the last version each saw."""
    versions: dict[str, str] | None = None
    """The list's answer: every object's version by name (None: no answer, each lists itself)."""
    version: str = ""
    done: trio.Event = field(default_factory=trio.Event)


class Relists:
    """The relists of one client's watches of named objects, by kind and namespace."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client
        self._gathering: dict[tuple[Kind, str | None], _Batch] = {}
        self._listing: dict[tuple[Kind, str | None], trio.Lock] = {}
        self._sizes: dict[tuple[Kind, str | None], int] = {}
        """Each namespace's object count at its last list."""
        self._refused: set[tuple[Kind, str | None]] = set()
        """Where the server refused the list (403): never asked again."""
        self.lists = 0
        """Metadata lists sent."""
        self.answered = 0
        """Relists that needed no list of their own."""

    async def check(
        self, kind: Kind, namespace: str | None, name: str, since: str
    ) -> Answer | None:
        """Whether the object `name` needs no list of its own, its watch having last seen
        resourceVersion `since`: the list's answer, or None (list it)."""
        key = (kind, namespace)
        if key in self._refused or not since.isdigit():
            return None
        batch = self._gathering.get(key)
        if batch is None:
            batch = self._gathering[key] = _Batch()
            batch.waiting[name] = int(since)
            await self._lead(key, batch)
        else:
            batch.waiting[name] = int(since)
            await batch.done.wait()
        if batch.versions is None:
            return None
        version = batch.versions.get(name)
        if version is not None and not (version.isdigit() and int(version) <= int(since)):
            return None  # changed
        self.answered += 1
        return Answer(batch.version, gone=version is None)

    async def _lead(self, key: tuple[Kind, str | None], batch: _Batch) -> None:
        """Gather, then list for everyone in `batch` (once the list before it is done)."""
        try:
            await trio.sleep(GATHER_S)
            async with self._listing.setdefault(key, trio.Lock()):
                del self._gathering[key]  # who comes now waits for the next
                if len(batch.waiting) >= max(BATCH_MIN, self._sizes.get(key, 0) / SIZE_RATIO):
                    await self._list(key, batch)
        finally:
            if self._gathering.get(key) is batch:  # cancelled while gathering
                del self._gathering[key]
            batch.done.set()

    async def _list(self, key: tuple[Kind, str | None], batch: _Batch) -> None:
        kind, namespace = key
        newest = str(max(batch.waiting.values()))
        self.lists += 1
        try:
            listed = await self._client.list_versions(
                kind,
                namespace=namespace,
                resource_version=newest,
                limit=SIZE_RATIO * len(batch.waiting),
            )
        except ApiError as exc:
            if exc.code == 403:
                self._refused.add(key)
                log.info(
                    "the API server refuses to list %ss namespace=%s: their watches relist one "
                    "at a time: %s",
                    kind.value.lower(),
                    namespace,
                    exc,
                )
            else:
                log.debug("metadata list of %s namespace=%s failed: %s", kind, namespace, exc)
            return
        except ApiUnavailable as exc:
            log.debug("metadata list of %s namespace=%s failed: %s", kind, namespace, exc)
            return
        self._sizes[key] = listed.total
        log.debug(
            "relisting %d watches of %ss namespace=%s: a list of %d of %d",
            len(batch.waiting),
            kind.value.lower(),
            namespace,
            len(listed.names),
            listed.total,
        )
        if listed.total == len(listed.names):  # else too large for them: each lists its own
            batch.versions, batch.version = listed.names, listed.resource_version
