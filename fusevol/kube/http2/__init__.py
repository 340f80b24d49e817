"""HTTP/2 to one API server over trio: every request of the agent, watches included, as streams
of as few connections as the server allows.

What client-go's transport (Go's `http2.Transport`) does for kubelet, in the parts fusevol needs:

- `Pool`: the connections to one origin. A request takes a stream on the first connection with
  room under the server's `SETTINGS_MAX_CONCURRENT_STREAMS`; only when every connection is full
  is one more made, so the connections are ceil(streams / the server's limit): one for up to 250
  watches at kube-apiserver's default limit (`--http2-max-streams-per-connection`). Requests
  that find no room while a connection is being made wait for it instead of dialling their own,
  and share its failure (`Unreachable`: nothing was sent). `wait_reachable` is how the callers
  of a failed dial wait for the server's return: one task dials for all of them, jittered, every
  2 s at most, so that an API server that is away costs each agent one refused connection per
  try, and its return is seen within 2 s; after an API server restart every watch of the agent
  comes back over one new connection.
- `Connection`: a reader task reads frames and hands each stream its own; a writer task sends
  what the HTTP/2 state machine (the `h2` library, sans-IO) has queued, so every other operation
  is synchronous and never waits for the socket. Flow control: the server's data on a stream is
  acknowledged (WINDOW_UPDATE) as the caller consumes it, so a slow reader makes the server wait
  instead of the agent's memory grow; Go's windows (4 MiB a stream, 1 GiB the connection).
- Health (client-go's `ReadIdleTimeout` and `PingTimeout`): nothing read for 30 s sends a PING; no
  answer within 15 s closes the connection, failing every stream on it, as a dead peer that never
  sent a FIN must. A connection without streams for 90 s is closed (Go's `IdleConnTimeout`).
- GOAWAY (an API server shutting down, or its `--goaway-chance`): the connection ends there (h2
  takes GOAWAY as the end of the connection's state), its streams fail retryably, and new
  requests go to a new connection; the reflectors resume their watches from where they were.

Failures are `ConnectionLost` (nothing, or not all, came back: retryable). Runs on the trio
thread only; a connection's tasks are trio system tasks, so that the pool serves any task of the
agent (the sources, the reconciler's provisioner, the CSI plugin) whatever nursery it runs in.

Excludes: what is sent (`client`: paths, JSON, authentication); HTTP/1.1 (the API server speaks
HTTP/2 to every client that offers it; `kubectl proxy` does not, and is not supported).
"""

from __future__ import annotations

import contextlib
import logging
import random
import ssl
from typing import TYPE_CHECKING, Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import h2.stream
import hpack
import trio

from fusevol.base.errors import FusevolError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)
# hpack logs every header it encodes or decodes at DEBUG: at the agent's debug level, thousands of
# lines a second while watches open, for nothing the agent's own lines do not say.
logging.getLogger("hpack").setLevel(logging.INFO)

STREAM_WINDOW = 4 << 20
"""Go's transportDefaultStreamFlow."""
CONNECTION_WINDOW = (1 << 30) - 65535
"""Go's transportDefaultConnFlow (1 GiB), above the 64 KiB every connection starts with."""
READ_IDLE_S = 30.0
"""client-go's HTTP/2 ReadIdleTimeout: silence this long sends a PING."""
PING_TIMEOUT_S = 15.0
"""client-go's PingTimeout: a PING unanswered this long closes the connection."""
IDLE_CONNECTION_S = 90.0
"""Go's IdleConnTimeout: a connection without a stream this long is closed."""
REACH_BACKOFF_S = (0.25, 2.0)
"""`wait_reachable`'s dials: the first after 0.25 s, doubling to 2 s, each up to half sooner at
random (the agents of a cluster do not dial a returning API server at the same instant)."""
CLOSED_STREAMS_KEPT = 512
"""How many of its closed streams a connection remembers (`_State`): twice the streams
kube-apiserver lets a connection have open at once."""
READ_SIZE = 1 << 16
_MAX_STREAM_ID = (1 << 31) - 1

Header = tuple[bytes, bytes]


class ConnectionLost(FusevolError):
    """The request could not be sent, or its answer was cut (refused, reset, timed out, GOAWAY)."""

    def __init__(self, message: str, *, said: bool = False) -> None:
        super().__init__(message)
        self.said = said
        """The loss of the whole connection, under every stream it carried, was logged once
        (its streams need not each say it again)."""


class Unreachable(ConnectionLost):
    """No connection to the server could be made, and none is open: nothing was sent."""


class Response:
    """One stream's answer: `status` once `Pool.request` returns; the body by `receive()` (or
    `read()` whole). `close()` (idempotent, never blocks) resets the stream if the answer has
    not ended, and gives its unread data back to the flow-control windows.

    Thousands are open at once (a watch each), so each is small: no headers kept (nothing
    reads them), no buffer until data waits unread, and its reader parked directly on the
    trio task, without an Event, or not waiting at all: `park(callback)`."""

    __slots__ = ("_chunks", "_connection", "_ended", "_error", "_waiter", "id", "status")

    def __init__(self, connection: Connection, stream_id: int) -> None:
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


def new_state() -> _State:
    """The HTTP/2 state machine of one client connection, as the agent sets it up: Go's windows,
    no server push, closed streams forgotten at once and a bounded record of resets (`_State`),
    and its headers coded for speed (`_Encoder`, `outbound`). The agent's own headers are
    well-formed and lower-case, and of the server's it reads `:status` only, so h2 neither
    checks nor normalizes them. h2's time per request, `bench/h2_cost.py`: 0.28x that of h2's
    defaults with a service account's token, 0.66x without one."""
    config = h2.config.H2Configuration(
        client_side=True,
        header_encoding=None,
        validate_outbound_headers=False,
        normalize_outbound_headers=False,
        validate_inbound_headers=False,
        normalize_inbound_headers=False,
    )
    state = _State(config)
    state.encoder = _Encoder()
    state.local_settings = h2.settings.Settings(
        client=True,
        initial_values={
            h2.settings.SettingCodes.ENABLE_PUSH: 0,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 1 << 20,
        },
    )
    return state


class _State(h2.connection.H2Connection):
    """h2's state of a connection, which forgets a stream as soon as its response is done with
    (`forget`), and remembers only its last `CLOSED_STREAMS_KEPT` resets, not h2's 65536 closed
    streams.

    h2 keeps how each closed stream was closed, so that the answer to a stream the agent reset
    (a watch no longer wanted, a request given up), its headers already on their way, is
    ignored and does not end the connection as a protocol error. Every closed stream stays, up to
    65536 a connection, about 140 bytes each (a connection's Python heap grew 150 bytes a stream
    closed over 10000 requests, 9 with this bound): a connection of 250 watches, each ended by
    the server every 5-10 minutes and watched again on a new stream, closes some 2000 streams
    an hour, so the record would reach 9 MiB a connection after a day and a half, 220 MiB for
    the 25 connections of 6000 watches. Only a frame that crossed a reset needs the record (a
    late frame of a stream that ended is the server's protocol error, remembered or not): it
    comes within a round trip, and a connection has at most the server's
    `SETTINGS_MAX_CONCURRENT_STREAMS` streams (250 by kube-apiserver's default) to reset at
    once. Go's transport keeps no record at all: it ignores the frames of any stream below its
    next id. On a server that allows a connection more than 512 streams, a late frame of one
    reset among more than 512 at once ends the connection instead; its watches resume from
    their resourceVersion on a new one."""

    MAX_CLOSED_STREAMS = CLOSED_STREAMS_KEPT
    _count_at = 0
    """How many streams h2 may hold (open, and closed but not yet forgotten) before
    `open_outbound_streams` counts them again."""

    def forget(self, stream_id: int) -> None:
        """Drop a stream that is closed, at once: h2 itself drops closed streams only as it counts
        the open ones, and until then each holds its state (about 500 bytes: the stream, its
        state machine, its window), for a connection of watches as many as it has watches
        (`open_outbound_streams`). A reset is remembered, as h2 would (above)."""
        stream = self.streams.get(stream_id)
        if stream is None or not stream.closed:
            return
        del self.streams[stream_id]
        if stream.closed_by in _RESETS:
            self._closed_streams[stream_id] = stream.closed_by

    @property
    def open_outbound_streams(self) -> int:
        """What h2 asks before it opens a stream, to check the server's limit. h2 counts every
        stream of the connection for it, 250 and more on a connection of watches, and forgets the
        closed ones as it counts: 3-4 % of the agent's time while its watches start. The pool
        keeps to the limit itself (`Connection.has_room`, from its own count), so here the count,
        and the forgetting, is made only once the streams held have doubled since the last one;
        h2's check is told 0 in between. Closed streams the pool has not forgotten (`forget`)
        are then as many as the open ones at most, and a count costs a walk for every stream
        opened since the last."""
        if len(self.streams) < self._count_at:
            return 0
        open_streams: int = super().open_outbound_streams  # counts, and forgets closed streams
        self._count_at = 2 * len(self.streams) + 16
        return open_streams


_RESETS = (h2.stream.StreamClosedBy.RECV_RST_STREAM, h2.stream.StreamClosedBy.SEND_RST_STREAM)


def outbound(headers: Sequence[Header]) -> list[Header]:
    """A request's headers for `new_state`'s encoder: the path, new in every request, is never
    indexed, so that it does not push the headers that repeat out of HPACK's dynamic table."""
    return [hpack.NeverIndexedHeaderTuple(*h) if h[0] == b":path" else h for h in headers]


class _Encoder(hpack.Encoder):
    """HPACK for a client whose HPACK is pure Python:

    - No Huffman coding (Go's encoder takes it when shorter; here it costs more time than the
      bytes it saves): the headers that repeat go once per connection, then as an index into the
      dynamic table; what goes whole, the path, is a quarter longer.
    - `authorization` indexed, as Go's client does (golang.org/x/net/http2 writes every header
      field without `Sensitive`), not sent whole in every request: a service account's token is
      a kilobyte. h2 would mark it never-indexed, against compression oracles; but HPACK matches
      whole values only, never a guessed prefix of one.
    """

    def encode(self, headers: Any, huffman: bool = True) -> bytes:  # hpack's own type, passed on
        return super().encode(headers, huffman=False)


class Connection:
    """One HTTP/2 connection. Made by `Pool`; see the module docstring."""

    def __init__(self, stream: trio.abc.Stream, pool: Pool, label: str) -> None:
        self._stream = stream
        self._pool = pool
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
        self._pool._forget(self)
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


class Pool:
    """The connections to one origin; `request` from any task on the trio thread."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | Callable[[], ssl.SSLContext] | None,
        server_hostname: str | None = None,
        connect_timeout_s: float = 10.0,
    ) -> None:
        """`ssl_context` None: h2c with prior knowledge (`http://`); a callable: asked for the
        context of each new connection (a client certificate that is rotated). Its ALPN must
        offer h2."""
        self.host, self.port = host, port
        self._ssl_context = ssl_context
        self._server_hostname = server_hostname or host
        self._connect_timeout_s = connect_timeout_s
        self._connections: list[Connection] = []
        self._dialling: _Dial | None = None
        self._reached: trio.Event | None = None
        """Set once `_reach` has a connection; None while nobody waits for one."""
        self.connections_made = 0
        self.requests = 0
        """Requests asked of the pool since its start (sent or failed)."""

    @property
    def connections(self) -> int:
        return len(self._connections)

    def streams(self) -> int:
        return sum(c.streams for c in self._connections)

    async def request(self, headers: Sequence[Header], body: bytes | None = None) -> Response:
        """Send one request (`headers` with the pseudo-headers); its response once its headers
        have come. `ConnectionLost` if it could not be sent or answered."""
        self.requests += 1
        while True:
            for connection in self._connections:
                if connection.has_room():
                    return await connection.request(headers, body)
            if self._dialling is not None:
                dial = self._dialling
                await dial.done.wait()
                if dial.error is not None:
                    raise type(dial.error)(str(dial.error))  # the dialler's answer, for us too
                continue
            if self._connections:  # all full: a new connection (Go's transport does the same)
                log.debug(
                    "http2 connections full, one more server=%s:%d connections=%d streams=%d",
                    self.host,
                    self.port,
                    len(self._connections),
                    self.streams(),
                )
            await self._dial()

    async def wait_reachable(self) -> None:
        """Until a connection to the server is open (now, or once one of `REACH_BACKOFF_S`'s
        dials succeeds): the wait after an `Unreachable`, shared by every caller."""
        while not self._connections:
            if self._reached is None:
                self._reached = trio.Event()
                trio.lowlevel.spawn_system_task(
                    self._reach, self._reached, name=f"http2 reach {self.host}:{self.port}"
                )
            await self._reached.wait()

    def close(self) -> None:
        for connection in list(self._connections):
            connection.close("closed by the client")

    async def _reach(self, reached: trio.Event) -> None:
        """Dial until a connection is open, with `REACH_BACKOFF_S`; then wake the waiters."""
        first, most = REACH_BACKOFF_S
        tries = 0
        started = trio.current_time()
        log.warning(
            "API server unreachable, dialling until it answers server=%s:%d", self.host, self.port
        )
        try:
            while not self._connections:
                await trio.sleep(min(first * 2**tries, most) * random.uniform(0.5, 1.0))
                tries += 1
                if self._dialling is not None:  # a request's dial: the same answer for us
                    await self._dialling.done.wait()
                    continue
                if not self._connections:
                    try:
                        await self._dial()
                    except ConnectionLost as exc:
                        log.debug(
                            "http2 server unreachable server=%s:%d error=%s",
                            self.host,
                            self.port,
                            exc,
                        )
                    except Exception:  # a system task must not raise: it would end the agent
                        log.exception("http2 dial failed server=%s:%d", self.host, self.port)
            log.info(
                "API server reachable again server=%s:%d after=%.1fs dials=%d",
                self.host,
                self.port,
                trio.current_time() - started,
                tries,
            )
        finally:
            self._reached = None
            reached.set()

    async def _dial(self) -> None:
        """One more connection; `Unreachable` if it fails while none is open."""
        dial = self._dialling = _Dial()
        try:
            connection = await self._connect()
        except ConnectionLost as exc:
            dial.error = (ConnectionLost if self._connections else Unreachable)(str(exc))
            raise dial.error from None
        finally:
            self._dialling = None
            dial.done.set()
        self._connections.append(connection)

    async def _connect(self) -> Connection:
        where = f"{self.host}:{self.port}"
        self.connections_made += 1
        label = f"{where}#{self.connections_made}"
        stream: trio.abc.Stream | None = None
        try:
            with trio.fail_after(self._connect_timeout_s):
                tcp = await trio.open_tcp_stream(self.host, self.port)
                stream = tcp
                if self._ssl_context is not None:
                    context = self._ssl_context
                    tls = trio.SSLStream(
                        tcp,
                        context if isinstance(context, ssl.SSLContext) else context(),
                        server_hostname=self._server_hostname,
                    )
                    stream = tls
                    await tls.do_handshake()
                    if tls.selected_alpn_protocol() != "h2":
                        raise ConnectionLost(
                            f"{where}: the server does not speak HTTP/2 (ALPN "
                            f"{tls.selected_alpn_protocol()!r})"
                        )
                connection = Connection(stream, self, label)
                await connection.start()
        except (OSError, trio.BrokenResourceError, ssl.SSLError) as exc:
            await _close_quietly(stream)
            raise ConnectionLost(f"{where}: {exc}") from None
        except trio.TooSlowError:
            await _close_quietly(stream)
            raise ConnectionLost(f"{where}: connect timed out") from None
        except BaseException:
            await _close_quietly(stream)
            raise
        log.debug("http2 connection made connection=%s", label)
        return connection

    def _forget(self, connection: Connection) -> None:
        if connection in self._connections:
            self._connections.remove(connection)


class _Dial:
    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.error: ConnectionLost | None = None


async def _close_quietly(stream: trio.abc.Stream | None) -> None:
    if stream is not None:
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await trio.aclose_forcefully(stream)


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
