"""ObjectStore: the authoritative in-memory mirror of every object the sources deliver.

One copy of each object, however many pods and volumes use it: payloads are built from the bytes
held here and the FUSE tree shares them. A plain dict that never evicts (a cache that could forget
an object would make a served volume lose its content).

Sources change the store through `upsert()` and `delete()`; both return whether anything changed,
so a source may re-deliver an unchanged object for free. Every change bumps `generation` and wakes
`wait_changed()`. `mark_synced()` records that a source has delivered its complete initial list
(`synced`, `wait_synced()`); the reconciler tears nothing down before the populator has added the
pods of every source (`Populator.has_added_pods`), so a restart never unmounts a volume whose pod
simply has not been read yet.

All calls happen on the trio thread; there are no locks.
"""

from __future__ import annotations

import collections
import itertools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar, overload

import trio

from fusevol.model import (
    ConfigMap,
    Kind,
    KubeObject,
    ObjectKey,
    PersistentVolume,
    PersistentVolumeClaim,
    Pod,
    Secret,
    ServiceAccountToken,
    StorageClass,
)
from fusevol.volumemanager.cache.changes import Changes

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

_T = TypeVar(
    "_T",
    Pod,
    ConfigMap,
    Secret,
    PersistentVolume,
    PersistentVolumeClaim,
    ServiceAccountToken,
    StorageClass,
)


@dataclass(frozen=True, slots=True)
class StoreStatistics:
    objects_by_kind: dict[str, int]
    generation: int
    synced: bool
    data_bytes: int = 0
    """The ConfigMaps' and Secrets' keys and values held, in bytes (`data_bytes`)."""


class ObjectStore:
    def __init__(self) -> None:
        self._objects: dict[ObjectKey, KubeObject] = {}
        self._changed_at: dict[ObjectKey, float] = {}
        self._changed_in: dict[ObjectKey, int] = {}
        """Each changed key's generation at its last change, oldest change first: the keys
        changed since a generation are read from its end (`changed_since`)."""
        self._changes = Changes()
        self._synced = trio.Event()
        self._data_bytes = 0
        """`data_bytes()` of every object held, kept as they come and go."""

    # -- verbs used by sources ---------------------------------------------------------------------

    def upsert(self, obj: KubeObject, key: ObjectKey | None = None) -> bool:
        """Store `obj`, replacing the object with the same key. False if it was already stored.
        `key`: `obj.key`, the caller's own (the key object of its table: one for thousands of
        objects, not one made for each table)."""
        if key is None:
            key = obj.key  # one key object for the three tables
        old = self._objects.get(key)
        if old == obj:
            return False
        self._objects[key] = obj
        self._data_bytes += data_bytes(obj) - (data_bytes(old) if old is not None else 0)
        self._changed_at[key] = time.monotonic()
        self._bump(key)
        return True

    def delete(self, key: ObjectKey) -> bool:
        """Forget the object at `key`. No-op (False) if there is none."""
        old = self._objects.pop(key, None)
        if old is None:
            return False
        self._data_bytes -= data_bytes(old)
        self._changed_at.pop(key, None)  # else every pod ever seen would stay here
        self._bump(key)
        return True

    def mark_synced(self) -> None:
        """The source has delivered its complete initial state. Idempotent."""
        if not self._synced.is_set():
            self._synced.set()
            self._bump()

    # -- readers -----------------------------------------------------------------------------------

    @overload
    def get(self, key: ObjectKey, kind: type[_T]) -> _T | None: ...
    @overload
    def get(self, key: ObjectKey) -> KubeObject | None: ...

    def get(self, key: ObjectKey, kind: type[_T] | None = None) -> KubeObject | None:
        obj = self._objects.get(key)
        if kind is not None and obj is not None and not isinstance(obj, kind):
            return None
        return obj

    def list(self, kind: Kind) -> tuple[KubeObject, ...]:
        return tuple(obj for key, obj in self._objects.items() if key.kind is kind)

    def pods(self) -> Iterable[Pod]:
        return tuple(obj for obj in self._objects.values() if isinstance(obj, Pod))

    def changed_at(self, key: ObjectKey) -> float | None:
        """`time.monotonic()` of the last change of `key` (None: never seen)."""
        return self._changed_at.get(key)

    @property
    def generation(self) -> int:
        """Counts changes; compare two readings to learn whether anything changed in between."""
        return self._changes.value

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    async def wait_changed(self, since: int) -> None:
        """Return as soon as `generation` differs from `since`."""
        await self._changes.wait_changed(since)

    def statistics(self) -> StoreStatistics:
        # By member, named once per kind: an enum's `.value` is a property, slow on 9000 keys
        # (3000 pods), read at every scrape of /metrics.
        counts = collections.Counter(key.kind for key in self._objects)
        by_kind = {kind.value: n for kind, n in counts.items()}
        return StoreStatistics(by_kind, self._changes.value, self.synced, self._data_bytes)

    def changed_since(self, generation: int) -> tuple[ObjectKey, ...]:
        """The keys of the objects added or changed after `generation` (and not deleted since),
        newest first."""
        newest_first = reversed(self._changed_in.items())
        since = itertools.takewhile(lambda change: change[1] > generation, newest_first)
        return tuple(key for key, _ in since)

    def _bump(self, key: ObjectKey | None = None) -> None:
        self._changes.bump()
        if key is not None:
            self._changed_in.pop(key, None)  # moved to the end: the newest change
            if key in self._objects:
                self._changed_in[key] = self._changes.value


def data_bytes(obj: KubeObject) -> int:
    """What a ConfigMap's or Secret's data weighs: its keys (UTF-8) and values, in bytes; 0 for
    any other object. What the agent must hold for it at least (`fusevol_object_data_bytes`)."""
    maps: tuple[Mapping[str, bytes], ...]
    if isinstance(obj, ConfigMap):
        maps = (obj.data, obj.binary_data)
    elif isinstance(obj, Secret):
        maps = (obj.data,)
    else:
        return 0
    return sum(len(key.encode()) + len(value) for data in maps for key, value in data.items())
