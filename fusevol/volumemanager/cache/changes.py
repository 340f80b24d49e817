"""A count of changes that can be waited on: the one way the caches tell that they changed.

`bump()` after each change; a reader notes `value`, and later either compares it or awaits
`wait_changed(noted)`, which returns as soon as anything changed since. No lost wake-ups: a change
made between the reading and the wait makes the wait return at once. Trio thread only.

A caller that waits for one volume (a CSI publish) subscribes an event under its name instead
(`Subscribers`): a change of that volume sets it, and no other wakes it. Woken by every change,
80 publishes (or unpublishes) at once made 80 wake-ups of each change, each a nursery of three
waits: a tenth of the trio thread's time in such a burst.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from collections.abc import Hashable, Iterable


class Subscribers:
    """Events set when what they were subscribed under changes. No lost wake-ups as long as the
    subscriber looks, then subscribes, with no checkpoint in between."""

    def __init__(self) -> None:
        self._events: dict[Hashable, list[trio.Event]] = {}

    def add(self, key: Hashable, event: trio.Event) -> None:
        self._events.setdefault(key, []).append(event)

    def discard(self, key: Hashable, event: trio.Event) -> None:
        events = self._events.get(key)
        if events is not None and event in events:
            events.remove(event)
            if not events:
                del self._events[key]

    def notify(self, keys: Iterable[Hashable]) -> None:
        """Set the events of `keys` (each once: a set event is removed)."""
        if self._events:
            for key in keys:
                for event in self._events.pop(key, ()):
                    event.set()


class Changes:
    def __init__(self) -> None:
        self.value = 0
        """How many changes so far."""
        self._event = trio.Event()
        self.subscribers = Subscribers()
        """Events set by a change of the key they were added under (`bump`'s `keys`)."""

    def bump(self, *keys: Hashable) -> None:
        """A change, of `keys` (their subscribers are woken)."""
        self.value += 1
        self._event.set()
        self._event = trio.Event()
        self.subscribers.notify(keys)

    async def wait_changed(self, since: int) -> None:
        """Return as soon as `value` differs from `since`."""
        while self.value == since:
            await self._event.wait()
