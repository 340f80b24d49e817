"""One stream's answer (`Response`), as its caller reads it: the status, then the body as it
comes, each piece given back to the flow-control windows once read, so that a slow reader makes
the server wait instead of the agent's memory grow.

The connection fills it (`Connection`: the status, data, the end, an error) and is told what
was read and when it is done with (`Carrier`, what a response asks of the connection it is on).
Excludes: the frames, the windows' sizes and the socket (`connection`, `state`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import trio

from fusevol.kube.http2.errors import ConnectionLost

if TYPE_CHECKING:
    from collections.abc import Callable


class Carrier(Protocol):
    """The connection a `Response` came on (`Connection`), as the response sees it."""

    @property
    def said(self) -> bool:
        """Its loss was logged once, for every stream on it."""

    def _consumed(self, stream_id: int, flow: int) -> None:
        """`flow` bytes of the stream's data were read: the windows take them back."""

    def _close_stream(self, response: Response, unread: int) -> None:
        """The response is done with: reset its stream if the answer has not ended, and give
        back `unread`, what was received and never read."""


class Response:
    """One stream's answer: `status` once `Pool.request` returns; the body by `receive()` (or
    `read()` whole). `close()` (idempotent, never blocks) resets the stream if the answer has
    not ended, and gives its unread data back to the flow-control windows.

    Thousands are open at once (a watch each), so each is small: no headers kept (nothing
    reads them), no buffer until data waits unread, and its reader parked directly on the
    trio task, without an Event, or not waiting at all: `park(callback)`."""

    __slots__ = ("_chunks", "_connection", "_ended", "_error", "_waiter", "id", "status")

    def __init__(self, connection: Carrier, stream_id: int) -> None:
        self._connection = connection
        self.id = stream_id
        self.status = 0
        self._chunks: list[tuple[bytes, int]] | None = None
        """Data received and not yet read, with its flow-controlled length."""
        self._ended = False
        self._error = ""
        self._waiter: trio.lowlevel.Task | Callable[[], None] | None = None

    async def receive(self) -> bytes:
        """The next data of the body; b"" at its end."""
        while not self.ready():
            await self._wait()
        if not self._chunks:
            if self._error:
                raise ConnectionLost(self._error, said=self._connection.said)
            return b""  # ended
        data, flow = self._chunks.pop(0)
        self._connection._consumed(self.id, flow)
        return data

    async def read(self) -> bytes:
        parts = []
        while data := await self.receive():
            parts.append(data)
        return b"".join(parts)

    def ready(self) -> bool:
        """Whether `receive()` would return (or raise) without waiting."""
        return bool(self._chunks) or self._ended or bool(self._error)

    def park(self, callback: Callable[[], None]) -> None:
        """Call `callback()` once `ready()`, from the connection's task (it must not block),
        instead of a task waiting in `receive()`; `close()` drops it."""
        assert not self.ready(), "parked with something to read"
        self._waiter = callback

    def close(self) -> None:
        chunks, self._chunks = self._chunks or (), None
        if not isinstance(self._waiter, trio.lowlevel.Task):
            self._waiter = None  # a parked reader's callback (a waiting task is cancelled)
        self._connection._close_stream(self, sum(flow for _, flow in chunks))

    def _received(self, data: bytes, flow: int) -> None:
        if self._chunks is None:
            self._chunks = []
        self._chunks.append((data, flow))
        self._wake()

    async def _wait(self) -> None:
        """Until `_wake()` (data, the end, an error); one reader at a time."""
        self._waiter = trio.lowlevel.current_task()
        await trio.lowlevel.wait_task_rescheduled(self._abort)

    def _abort(self, _: object) -> trio.lowlevel.Abort:
        self._waiter = None
        return trio.lowlevel.Abort.SUCCEEDED

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if isinstance(waiter, trio.lowlevel.Task):
            trio.lowlevel.reschedule(waiter)
        elif waiter is not None:
            waiter()
