"""A count of changes that can be waited on: the one way the caches tell that they changed.

`bump()` after each change; a reader notes `value`, and later either compares it or awaits
`wait_changed(noted)`, which returns as soon as anything changed since. No lost wake-ups: a change
made between the reading and the wait makes the wait return at once. Trio thread only.
"""

from __future__ import annotations

import trio


class Changes:
    def __init__(self) -> None:
        self.value = 0
        """How many changes so far."""
        self._event = trio.Event()

    def bump(self) -> None:
        self.value += 1
        self._event.set()
        self._event = trio.Event()

    async def wait_changed(self, since: int) -> None:
        """Return as soon as `value` differs from `since`."""
        while self.value == since:
            await self._event.wait()
