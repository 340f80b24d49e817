"""Calls run in batches: one hop for all the calls that arrive while the previous batch runs
(a group commit).

A pod with 100 volumes asks for 100 binds at once. Each in a `trio.to_thread.run_sync` of its
own, they made up to 40 threads that woke one another and the trio thread (binds of 100 volumes:
~0.5 ms each, against ~20 us of system calls). Here the first caller runs every call queued so
far in one hop, in order of arrival, then the calls queued meanwhile, and so on; the others wait
for their batch. Where a batch runs is the runner's affair: a worker thread (`in_thread`), or the
mount helper process (`fusevol.mount.linux`). A call is never abandoned: its caller records what
it did (the mount table), so a cancelled caller whose call has started waits for it. Only calls
that cannot hang belong here: one stuck call holds up every call behind it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

import outcome
import trio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

_T = TypeVar("_T")


class _Call(Generic[_T]):
    __slots__ = ("request", "result", "started")

    def __init__(self, request: _T) -> None:
        self.request = request
        self.started = False
        self.result: outcome.Outcome[object] | None = None


class Batches(Generic[_T]):
    def __init__(
        self, run: Callable[[Sequence[_T]], Awaitable[Sequence[outcome.Outcome[object]]]]
    ) -> None:
        """`run(requests)`: carry out a batch, one outcome per request, in order."""
        self._run = run
        self._queued: list[_Call[_T]] = []
        self._running = False
        self._batch_done = trio.Event()
        self.batches = 0
        """Hops made so far (a test can tell batching from one hop per call)."""

    async def call(self, request: _T) -> object:
        """Carry out `request` with the others queued beside it; its result or exception."""
        call = _Call(request)
        self._queued.append(call)
        try:
            await trio.lowlevel.checkpoint()  # the calls of this scheduling round join it
            while call.result is None:
                if not self._running:
                    await self._run_batch()
                elif call.started:  # shielded: its effect must reach the caller
                    with trio.CancelScope(shield=True):
                        await self._batch_done.wait()
                else:
                    await self._batch_done.wait()
        except BaseException:
            if not call.started:  # never run: as if never asked
                self._queued.remove(call)
            raise
        return call.result.unwrap()

    async def _run_batch(self) -> None:
        batch, self._queued = self._queued, []
        for call in batch:
            call.started = True
        self._running = True
        try:
            with trio.CancelScope(shield=True):  # started calls run and reach their callers
                try:
                    results = list(await self._run([call.request for call in batch]))
                    if len(results) != len(batch):
                        raise RuntimeError(f"{len(results)} answers to {len(batch)} calls")
                except Exception as exc:  # the runner itself failed: every call with it
                    results = [outcome.Error(exc)] * len(batch)
            for call, result in zip(batch, results, strict=True):
                call.result = result
        finally:
            self._running = False
            self.batches += 1
            done, self._batch_done = self._batch_done, trio.Event()
            done.set()


async def in_thread(requests: Sequence[Callable[[], object]]) -> list[outcome.Outcome[object]]:
    """A runner: call each request (a function of no argument) in one worker thread."""
    return await trio.to_thread.run_sync(_call_all, requests)


def _call_all(requests: Sequence[Callable[[], object]]) -> list[outcome.Outcome[object]]:
    return [outcome.capture(request) for request in requests]
