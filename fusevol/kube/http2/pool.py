"""The connections to one origin (`Pool`), as Go's `http2.Transport` keeps them for client-go.

A request takes a stream on the first connection with room under the server's
`SETTINGS_MAX_CONCURRENT_STREAMS`; only when every connection is full is one more made, so the
connections are ceil(streams / the server's limit): one for up to 250 watches at kube-apiserver's
default limit (`--http2-max-streams-per-connection`). Requests that find no room while a
connection is being made wait for it instead of dialling their own, and share its failure
(`Unreachable`: nothing was sent). `wait_reachable` is how the callers of a failed dial wait for
the server's return: one task dials for all of them, jittered, every 2 s at most, so that an API
server that is away costs each agent one refused connection per try, and its return is seen
within 2 s; after an API server restart every watch of the agent comes back over one new
connection.

Excludes: what happens on a connection once made (`connection`).
"""

from __future__ import annotations

import logging
import random
import ssl
from typing import TYPE_CHECKING

import trio

from fusevol.kube.http2.connection import Connection
from fusevol.kube.http2.errors import ConnectionLost, Unreachable

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from fusevol.kube.http2.response import Response
    from fusevol.kube.http2.state import Header

log = logging.getLogger(__name__)

REACH_BACKOFF_S = (0.25, 2.0)
"""`wait_reachable`'s dials: the first after 0.25 s, doubling to 2 s, each up to half sooner at
random (the agents of a cluster do not dial a returning API server at the same instant)."""


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
                connection = Connection(stream, label, on_closed=self._forget)
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
