"""WatchStream: one open watch, read as the events it carries.

A watch's answer is a stream of JSON objects, one a line (`{type, object}`), lasting until the
server ends it; it is one stream of the client's HTTP/2 connection (`http2`), so an idle watch
holds no thread, and a reader that holds no task while its watch is idle parks a callback on it
(`park`; the reflector's parking).

Excludes: starting a watch (`KubeClient.open_watch`), what its events mean (`reflector`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from fusevol.kube.errors import ApiUnavailable
from fusevol.kube.http2.errors import ConnectionLost

if TYPE_CHECKING:
    from collections.abc import Callable

    from fusevol.kube.http2.response import Response


class WatchStream:
    """One open watch: `next_event()` awaits the next event; `close()` (idempotent, never
    blocks) ends it. A reader that holds no task while the watch is idle asks `ready()`, and
    when it is not, `park(callback)`: `callback()` is called once it is."""

    __slots__ = ("_buffer", "_response")

    def __init__(self, response: Response) -> None:
        self._response = response
        self._buffer = b""

    async def next_event(self) -> dict[str, Any] | None:
        """The next `{type, object}`; None when the server ended the watch."""
        while True:
            line, newline, rest = self._buffer.partition(b"\n")
            if newline:
                self._buffer = rest
                if not line.strip():
                    continue
                try:
                    event: dict[str, Any] = json.loads(line)
                except ValueError as exc:
                    raise ApiUnavailable(f"watch: undecodable event: {exc}") from None
                return event
            try:
                data = await self._response.receive()
            except ConnectionLost as exc:
                raise ApiUnavailable(f"watch: {exc}", said=exc.said) from None
            if not data:
                if self._buffer.strip():
                    raise ApiUnavailable("watch: the stream ended in the middle of an event")
                return None
            self._buffer += data

    def ready(self) -> bool:
        """Whether `next_event()` has something to work on without waiting for the server: an
        event, the end, an error, or data (that may still be the start of an event only)."""
        return b"\n" in self._buffer or self._response.ready()

    def park(self, callback: Callable[[], None]) -> None:
        """Call `callback()` (once, from the connection's task: it must not block) when
        `ready()`; while it is not. Closing the stream drops it."""
        self._response.park(callback)

    def close(self) -> None:
        self._response.close()
