"""FirstSeen: when this node's agent first saw each pod, kept across agent restarts.

kubelet stamps every pod it accepts with `kubernetes.io/config.seen`, the time it first saw it,
and keeps that value for the life of the pod (docs/pod-annotations.md). fusevol does the same
(the populator adds the annotation), and a downward API file that shows it must not change just
because the agent restarted; so the times are kept in a small record in the agent's state,
`<root>/fusevol/seen.json`: `{"seen": {"<pod uid>": "<config.seen value>"}}`. It holds pod uids and
times only, never an object's content.

- `seen(uid)` returns the pod's recorded value, recording the current time first for a pod seen
  for the first time. The value is stored formatted, so it reads back byte for byte.
- `retain(uids)` forgets every other pod (the populator calls it once the sources are synced:
  before that, a pod not delivered yet is not gone).
- `save()` writes the record if it changed: a temporary file renamed over it, so a reader (the
  next agent) finds the old record or the new one. No fsync: the record has to outlive the agent
  process, which the page cache does; after a crash of the node itself the pods' containers start
  again anyway, and a pod whose time was lost gets a new one, as under a restarted kubelet.

The record is read at the first call, which the agent makes after it holds its root's lock. A
record that cannot be read or parsed is logged and replaced (the pods get new times); one that
cannot be written is logged and kept in memory.

Excludes: the annotations themselves and when they are applied (`fusevol.volumemanager.populator`).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fusevol.base.fsutil import replace_file
from fusevol.model import PodUID

if TYPE_CHECKING:
    from collections.abc import Callable, Collection
    from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FirstSeenStatistics:
    pods: int
    saves: int


class FirstSeen:
    def __init__(self, *, path: Path | None, clock: Callable[[], int] = time.time_ns) -> None:
        """`path`: the record (None: kept in memory only); `clock`: nanoseconds since the epoch."""
        self._path = path
        self._clock = clock
        self._seen: dict[PodUID, str] | None = None
        self._dirty = False
        self._saves = 0

    def seen(self, uid: PodUID) -> str:
        """The pod's `kubernetes.io/config.seen`: recorded now if the pod is new."""
        seen = self._loaded()
        value = seen.get(uid)
        if value is None:
            value = seen[uid] = go_timestamp(self._clock())
            self._dirty = True
        return value

    def retain(self, uids: Collection[PodUID]) -> None:
        """Forget every pod but `uids` (idempotent)."""
        seen = self._loaded()
        for uid in [uid for uid in seen if uid not in uids]:
            del seen[uid]
            self._dirty = True

    def save(self) -> None:
        """Write the record if it changed since the last save. No-op without a path."""
        if not self._dirty or self._path is None or self._seen is None:
            return
        document = {"seen": dict(sorted(self._seen.items()))}
        try:
            replace_file(self._path, json.dumps(document, indent=1).encode())
        except OSError as exc:
            log.error("cannot record first-seen times path=%s error=%s", self._path, exc)
            return
        self._dirty = False
        self._saves += 1

    def statistics(self) -> FirstSeenStatistics:
        return FirstSeenStatistics(len(self._seen or ()), self._saves)

    def _loaded(self) -> dict[PodUID, str]:
        if self._seen is None:
            self._seen = self._read()
        return self._seen

    def _read(self) -> dict[PodUID, str]:
        if self._path is None:
            return {}
        try:
            document = json.loads(self._path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning(
                "first-seen record unreadable, starting afresh path=%s error=%s", self._path, exc
            )
            return {}
        seen = document.get("seen") if isinstance(document, dict) else None
        if not isinstance(seen, dict):
            log.warning("first-seen record malformed, starting afresh path=%s", self._path)
            return {}
        return {
            PodUID(uid): value
            for uid, value in seen.items()
            if isinstance(uid, str) and isinstance(value, str)
        }


def go_timestamp(ns: int) -> str:
    """kubelet's `Timestamp.GetString()`: Go's `time.Now().Format(RFC3339NanoFixed)`, i.e. the
    local time with all nine digits of the fraction (trailing zeros kept) and the zone as
    `Z07:00` (`Z` when the offset is zero, else `+hh:mm`/`-hh:mm`)."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    local = time.localtime(seconds)
    offset = local.tm_gmtoff
    if offset == 0:
        zone = "Z"
    else:
        sign = "+" if offset > 0 else "-"
        minutes = abs(offset) // 60
        zone = f"{sign}{minutes // 60:02d}:{minutes % 60:02d}"
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', local)}.{fraction:09d}{zone}"
