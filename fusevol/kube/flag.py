"""Flag: set once, awaited by some, at the least cost a flag can have: a reflector (one for each
of thousands of watched objects) has three (synced, settled, started), set within a second of its
start and almost never awaited.

Excludes: what a flag says (`reflector`).
"""

from __future__ import annotations

import trio


class Flag:
    """Set once, awaited by some: a `trio.Event` made only when someone waits before it is set
    (a reflector per watched object has one, and almost nobody waits for most of them)."""

    __slots__ = ("_event", "_set")

    def __init__(self) -> None:
        self._set = False
        self._event: trio.Event | None = None

    def set(self) -> None:
        self._set = True
        if self._event is not None:
            self._event.set()  # its waiters are woken; nobody needs it any more
            self._event = None

    def is_set(self) -> bool:
        return self._set

    async def wait(self) -> None:
        if not self._set:
            if self._event is None:
                self._event = trio.Event()
            await self._event.wait()


_SET = Flag()
_SET.set()


def raised(flag: Flag) -> Flag:
    """Set `flag` (its waiters wake) and give the one flag all reflectors share once theirs is
    set, to hold in its stead: three flags of 48 bytes on each of thousands of reflectors, set
    for good within a second of their start."""
    flag.set()
    return _SET
