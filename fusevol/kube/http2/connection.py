"""One HTTP/2 connection (`Connection`), made by the pool: its streams, its tasks, its flow
control and its health.

- Tasks: a reader task reads frames and hands each stream its own (`Response`); a writer task
  sends what the HTTP/2 state machine (`state`, the `h2` library, sans-IO) has queued, so every
  other operation is synchronous and never waits for the socket. Both are trio system tasks,
  so that the pool serves any task of the agent whatever nursery it runs in.
- Flow control: the server's data on a stream is acknowledged (WINDOW_UPDATE) as the caller
  consumes it, so a slow reader makes the server wait instead of the agent's memory grow; Go's
  windows (4 MiB a stream, 1 GiB the connection). A request's body waits for the server's window.
- Health (client-go's `ReadIdleTimeout` and `PingTimeout`): nothing read for 30 s sends a PING; no
  answer within 15 s closes the connection, failing every stream on it, as a dead peer that never
  sent a FIN must. A connection without streams for 90 s is closed (Go's `IdleConnTimeout`).
- GOAWAY (an API server shutting down, or its `--goaway-chance`): the connection ends there (h2
  takes GOAWAY as the end of the connection's state), its streams fail retryably
  (`ConnectionLost`), and new requests go to a new connection; the reflectors resume their
  watches from where they were.

Excludes: which connection a request goes to, and dialling one (`pool`).
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

import h2.errors
import h2.events
import h2.exceptions
import trio

from fusevol.kube.http2.errors import ConnectionLost
from fusevol.kube.http2.response import Response
from fusevol.kube.http2.state import new_state, outbound

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from fusevol.kube.http2.state import Header

log = logging.getLogger(__name__)

CONNECTION_WINDOW = (1 << 30) - 65535
"""Go's transportDefaultConnFlow (1 GiB), above the 64 KiB every connection starts with."""
READ_IDLE_S = 30.0
"""client-go's HTTP/2 ReadIdleTimeout: silence this long sends a PING."""
PING_TIMEOUT_S = 15.0
"""client-go's PingTimeout: a PING unanswered this long closes the connection."""
IDLE_CONNECTION_S = 90.0
"""Go's IdleConnTimeout: a connection without a stream this long is closed."""
READ_SIZE = 1 << 16
_MAX_STREAM_ID = (1 << 31) - 1


class Connection:
    """One HTTP/2 connection. Made by `Pool`; see the module docstring."""

    def __init__(
        self, stream: trio.abc.Stream, label: str, *, on_closed: Callable[[Connection], None]
    ) -> None:
        """`on_closed(self)` once it is closed (the pool forgets it)."""
        self._stream = stream
        self._on_closed = on_closed
        self.label = label
        self._h2 = new_state()
        self._responses: dict[int, Response] = {}
        self._send_wakeup = trio.Event()
        self._window_wakeup = trio.Event()
        self._settings = trio.Event()
        self._closed = False
        self._error = ""
        self._idle_since = trio.current_time()
        self.streams_opened = 0
        self.said = False
        """Its loss was logged (`close(lost=<level>)` with streams open)."""

    # -- for the pool ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Send the preface, start the tasks, wait for the server's SETTINGS (its stream limit)."""
        self._h2.initiate_connection()
        self._h2.increment_flow_control_window(CONNECTION_WINDOW)
        trio.lowlevel.spawn_system_task(self._serve, name=f"http2 {self.label}")
        self._wake_writer()
        await self._settings.wait()
        if self._closed:
            raise ConnectionLost(self._error)

    def has_room(self) -> bool:
        if self._closed or not self._settings.is_set():
            return False
        if (self._h2.highest_outbound_stream_id or 0) >= _MAX_STREAM_ID - 2:
            return False  # stream ids used up: the next request goes to a new connection
        return len(self._responses) < self._h2.remote_settings.max_concurrent_streams

    @property
    def streams(self) -> int:
        return len(self._responses)

    async def request(self, headers: Sequence[Header], body: bytes | None) -> Response:
        """Send one request on a new stream (the pool saw `has_room()`, and nothing was
        awaited since); return when its response headers have come."""
        try:
            stream_id = self._h2.get_next_available_stream_id()
            self._h2.send_headers(stream_id, outbound(headers), end_stream=not body)
        except h2.exceptions.H2Error as exc:
            raise ConnectionLost(f"{self.label}: {exc!r}") from None
        response = Response(self, stream_id)
        self._responses[stream_id] = response
        self.streams_opened += 1
        self._wake_writer()
        try:
            if body:
                await self._send_body(stream_id, body)
            while not response.status:
                if response._error:
                    raise ConnectionLost(response._error, said=self.said)
                if response._ended:
                    raise ConnectionLost(f"{self.label}: stream {stream_id} ended without headers")
                await response._wait()
        except BaseException:
            response.close()
            raise
        return response

    def close(self, reason: str, *, lost: int = 0) -> None:
        """Fail every stream and stop taking new ones; the connection's tasks end and close
        the socket. `lost`: the level of a log line saying so, if streams were open (one line
        for all of them)."""
        if self._closed:
            return
        self._closed = True
        self._error = f"{self.label}: {reason}"
        if lost and self._responses:
            log.log(
                lost,
                "http2 connection lost connection=%s streams=%d reason=%s",
                self.label,
                len(self._responses),
                reason,
            )
            self.said = True
        responses, self._responses = self._responses, {}  # a woken reader may close its own
        for response in responses.values():
            response._error = response._error or self._error
            response._wake()
        self._settings.set()
        self._window_wakeup.set()
        self._on_closed(self)
        self._wake_writer()

    # -- for the responses -------------------------------------------------------------------------

    def _consumed(self, stream_id: int, flow: int) -> None:
        if flow and not self._closed:
            with contextlib.suppress(h2.exceptions.H2Error):  # the connection is ending
                self._h2.acknowledge_received_data(flow, stream_id)
            self._wake_writer()

    def _close_stream(self, response: Response, unread: int) -> None:
        if self._responses.pop(response.id, None) is None:
            return
        if not self._responses:
            self._idle_since = trio.current_time()
        if self._closed:
            return
        if not response._ended and not response._error:
            with contextlib.suppress(h2.exceptions.H2Error):  # closed by the server meanwhile
                self._h2.reset_stream(response.id, h2.errors.ErrorCodes.CANCEL)
        if unread:
            with contextlib.suppress(h2.exceptions.H2Error):
                self._h2.acknowledge_received_data(unread, response.id)
        self._h2.forget(response.id)
        self._wake_writer()

    async def _send_body(self, stream_id: int, body: bytes) -> None:
        view = memoryview(body)
        while view:
            room = min(
                self._h2.local_flow_control_window(stream_id), self._h2.max_outbound_frame_size
            )
            if room <= 0:
                self._window_wakeup = trio.Event()
                await self._window_wakeup.wait()
                if self._closed:
                    raise ConnectionLost(self._error)
                continue
            chunk, view = view[:room], view[room:]
            try:
                self._h2.send_data(stream_id, bytes(chunk), end_stream=not view)
            except h2.exceptions.H2Error as exc:
                raise ConnectionLost(f"{self.label}: {exc!r}") from None
            self._wake_writer()

    # -- the connection's tasks --------------------------------------------------------------------

    def _wake_writer(self) -> None:
        self._send_wakeup.set()

    async def _serve(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write_loop)
                await self._read_loop()
                nursery.cancel_scope.cancel()
        except* (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as lost:
            self.close(f"connection lost: {_first(lost)}", lost=logging.WARNING)
        except* h2.exceptions.ProtocolError as broken:
            self.close(f"HTTP/2 protocol error: {_first(broken)!r}", lost=logging.WARNING)
        except* Exception as failed:  # a system task must not raise: it would end the agent
            log.error("http2 connection failed connection=%s", self.label, exc_info=failed)
            self.close(f"failed: {_first(failed)!r}", lost=logging.WARNING)
        finally:
            self.close("closed")
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await trio.aclose_forcefully(self._stream)

    async def _write_loop(self) -> None:
        while True:
            await self._send_wakeup.wait()
            self._send_wakeup = trio.Event()
            data = self._h2.data_to_send()
            if data:
                await self._stream.send_all(data)
            if self._closed:
                return

    async def _read_loop(self) -> None:
        pinged: float | None = None
        read_at = trio.current_time()
        while not self._closed:
            # One cancel scope for all the reads until the deadline, not one a read (thousands
            # a second while watches relist): when it comes, it is checked against the last read.
            deadline = read_at + READ_IDLE_S if pinged is None else pinged + PING_TIMEOUT_S
            with trio.CancelScope(deadline=deadline):
                while not self._closed:
                    data = await self._stream.receive_some(READ_SIZE)
                    if not data:
                        self.close("closed by the server", lost=logging.WARNING)
                        return
                    read_at = trio.current_time()
                    for event in self._h2.receive_data(data):
                        self._dispatch(event)
                    self._wake_writer()
                    if pinged is not None:
                        break  # whatever came answers the PING: READ_IDLE_S again
            if pinged is not None and read_at > pinged:
                pinged = None
                continue
            if self._closed or trio.current_time() - read_at < READ_IDLE_S:
                continue  # read since the deadline was set
            if pinged is not None:
                self.close(f"no answer to a PING in {PING_TIMEOUT_S:g}s", lost=logging.WARNING)
                return
            if self._idle_expired():
                log.debug("http2 connection idle, closing connection=%s", self.label)
                self._h2.close_connection()
                self.close("idle")
                return
            self._h2.ping(b"fusevol!")
            self._wake_writer()
            pinged = trio.current_time()

    def _idle_expired(self) -> bool:
        return not self._responses and (trio.current_time() - self._idle_since >= IDLE_CONNECTION_S)

    def _dispatch(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            response = self._responses.get(event.stream_id)
            if response is not None:
                status = next((v for k, v in event.headers or () if k == b":status"), b"0")
                response.status = int(status)
                response._wake()
        elif isinstance(event, h2.events.DataReceived):
            response = self._responses.get(event.stream_id)
            if response is None:  # reset by us meanwhile: give the window back
                self._h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            else:
                response._received(event.data, event.flow_controlled_length)
        elif isinstance(event, h2.events.StreamEnded):
            if (response := self._responses.get(event.stream_id)) is not None:
                response._ended = True
                response._wake()
        elif isinstance(event, h2.events.StreamReset):
            if (response := self._responses.get(event.stream_id)) is not None:
                code = _error_name(event.error_code)
                response._error = f"{self.label}: stream reset by the server ({code})"
                response._wake()
        elif isinstance(event, h2.events.ConnectionTerminated):
            code = _error_name(event.error_code)
            log.debug("http2 GOAWAY connection=%s error=%s", self.label, code)
            self.close(f"GOAWAY ({code})", lost=logging.INFO)
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self._settings.set()
        elif isinstance(event, h2.events.WindowUpdated):
            self._window_wakeup.set()


def _first(group: BaseExceptionGroup[Exception]) -> Exception:
    """The first exception of a (nested) group: what a nursery of the connection raised."""
    first: BaseException = group
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    assert isinstance(first, Exception)
    return first


def _error_name(code: object) -> str:
    try:
        return h2.errors.ErrorCodes(code).name  # type: ignore[arg-type]
    except ValueError:
        return str(code)
