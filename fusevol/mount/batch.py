"""Blocking calls run in batches: one worker-thread hop for all the calls that arrive while the
previous batch runs (a group commit).

A pod with 100 volumes asks for 100 binds at once. Each in a `trio.to_thread.run_sync` of its
own, they made up to 40 threads that woke one another and the trio thread (binds of 100 volumes:
~0.5 ms each, against ~20 us of system calls). Here the first caller runs every call queued so
far in one thread, in order of arrival, then the calls queued meanwhile, and so on; the others
wait for their batch. A call is never abandoned: its caller records what it did (the mount
table), so a cancelled caller whose call has started waits for it. Only calls that cannot hang
belong here: one stuck call holds up every call behind it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

import outcome
import trio

if TYPE_CHECKING:
    from collections.abc import Callable

_T = TypeVar("_T")


class _Call(Generic[_T]):
    __slots__ = ("fn", "result", "started")

    def __init__(self, fn: Callable[[], _T]) -> None:
        self.fn = fn
        self.started = False
        self.result: outcome.Outcome[_T] | None = None


class Batches:
    def __init__(self) -> None:
        self._queued: list[_Call[object]] = []
        self._running = False
        self._batch_done = trio.Event()
        self.batches = 0
        """Thread hops made so far (a test can tell batching from one hop per call)."""

    async def run_sync(self, fn: Callable[[], _T]) -> _T:
        """`fn()` in a worker thread, with the calls queued beside it; its result or exception."""
        call: _Call[_T] = _Call(fn)
        self._queued.append(call)  # type: ignore[arg-type]
        try:
            await trio.lowlevel.checkpoint()  # the calls of this scheduling round join it
        except BaseException:
            if not call.started:
                self._queued.remove(call)  # type: ignore[arg-type]
            raise
        while call.result is None:
            if self._running:
                await self._wait(call)
            else:
                await self._run_batch()
        return call.result.unwrap()

    async def _wait(self, call: _Call[_T]) -> None:
        done = self._batch_done
        if call.started:  # shielded: its effect must reach the caller
            with trio.CancelScope(shield=True):
                await done.wait()
            return
        try:
            await done.wait()
        except BaseException:
            if not call.started:  # never run: as if never asked
                self._queued.remove(call)  # type: ignore[arg-type]
            raise

    async def _run_batch(self) -> None:
        batch, self._queued = self._queued, []
        for call in batch:
            call.started = True
        self._running = True
        try:
            with trio.CancelScope(shield=True):  # started calls run and reach their callers
                await trio.to_thread.run_sync(_run_all, batch)
        finally:
            self._running = False
            self.batches += 1
            done, self._batch_done = self._batch_done, trio.Event()
            done.set()


def _run_all(batch: list[_Call[object]]) -> None:
    for call in batch:
        call.result = outcome.capture(call.fn)
