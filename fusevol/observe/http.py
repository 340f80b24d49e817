"""The agent's HTTP endpoints: `/healthz`, `/readyz`, `/metrics`, `/status`.

A deliberately small HTTP/1.1 server on trio (one request per connection, GET only, 8 KiB of
request head at most, 5 s for the whole exchange, MAX_CONNECTIONS open at once: one more closes
the oldest, so a caller that opens many and sends nothing holds neither the agent's descriptors
nor its probes). It runs on the agent's own trio loop, so `/healthz` answering *is* the liveness
check: a loop that froze (docs/fuse.md fact 9) stops answering, and the kubelet or systemd
watchdog restarts the agent. A request whose answer raises gets a 500 and one log line; no
request ends the server or the agent.

    /healthz   200 "ok" while the loop runs and the FUSE session is up, else 503
    /readyz    200 once every source has been read completely and a reconcile pass followed
    /metrics   Prometheus text format (fusevol.observe.metrics)
    /status    the status snapshot (`fusevol status --json` adds `agent` and `mounts` to it)

`/metrics` and `/status` answer root on this node, and another caller only if the API server says
it may (`fusevol.observe.auth`; as kubelet's API, loopback callers included): 401 or 403
otherwise.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from fusevol.base.errors import FusevolError
from fusevol.observe.peer import Connection

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from fusevol.observe.auth import Authorizer
    from fusevol.observe.metrics import Metrics

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 8192
READ_TIMEOUT_S = 5.0
"""For the whole exchange: the request, its answer, and sending it."""
MAX_CONNECTIONS = 128
"""Open at once. kubelet's probes and a scraper or two need a handful; each open one costs a
descriptor and a task."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


_REASONS = {
    200: "OK",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    400: "Bad Request",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class HealthServer:
    def __init__(
        self,
        *,
        host: str,
        port: int,
        metrics: Metrics,
        healthy: Callable[[], bool],
        ready: Callable[[], bool],
        status: Callable[[], Awaitable[bytes]],
        authorizer: Authorizer | None = None,
    ) -> None:
        """`authorizer`: who may read `/metrics` and `/status` (None: anyone)."""
        self._authorizer = authorizer
        self._host = host
        self._port = port

        async def status_json() -> Response:
            # Made in steps, with a checkpoint after each (`StatusReporter.encoded`).
            return Response(200, await status(), "application/json")

        self._routes: dict[str, Callable[[], Awaitable[Response]]] = {
            "/healthz": _at_once(lambda: _check(healthy(), "ok", "unhealthy")),
            "/readyz": _at_once(lambda: _check(ready(), "ok", "not ready")),
            "/metrics": _at_once(
                lambda: Response(200, metrics.render(), "text/plain; version=0.0.4; charset=utf-8")
            ),
            "/status": status_json,
        }
        self.port: int | None = None
        """The port actually bound (useful with port 0)."""
        self._open: dict[int, trio.CancelScope] = {}
        """The connections being answered, oldest first, by their scope's id."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            listeners = await trio.open_tcp_listeners(self._port, host=self._host)
        except OSError as exc:
            raise FusevolError(
                f"--http-host {self._host} --http-port {self._port}: cannot listen: "
                f"{exc.strerror or exc}; choose another with --http-host/--http-port "
                "(--http-port -1: no HTTP endpoints)"
            ) from None
        self.port = listeners[0].socket.getsockname()[1]
        log.info("http listening address=%s:%d", self._host, self.port)
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        scope = trio.move_on_after(READ_TIMEOUT_S)
        if len(self._open) >= MAX_CONNECTIONS:  # the oldest goes: it has had the most time
            self._open.pop(next(iter(self._open))).cancel()
            log.debug("http: %d connections open, the oldest closed", MAX_CONNECTIONS)
        self._open[id(scope)] = scope
        try:
            with scope:
                caller = Connection.of(stream.socket)
                head = await _read_head(stream)
                await stream.send_all(_encode(await self._answer(head, caller)))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the caller went away
        finally:
            self._open.pop(id(scope), None)
            await trio.aclose_forcefully(stream)

    async def _answer(self, head: _Head | None, caller: Connection) -> Response:
        try:
            return await self._respond(head, caller)
        except Exception as exc:  # a fault of ours: the caller hears of it, the server goes on
            path = _path(head) if head is not None else ""
            log.error(
                "http request failed path=%s error=%s: %s",
                path if path in self._routes else "-",
                type(exc).__name__,
                str(exc).replace("\n", " "),
            )
            return Response(500, b"internal error\n")

    async def _respond(self, head: _Head | None, caller: Connection) -> Response:
        if head is None:
            return Response(400, b"bad request\n")
        if head.line.partition(b" ")[0] != b"GET":
            return Response(405, b"GET only\n")
        path = _path(head)
        route = self._routes.get(path)
        if route is None:
            return Response(404, b"not found\n")
        if self._authorizer is not None:
            denied = await self._authorizer.check(path, caller, head.authorization)
            if denied is not None:
                return Response(denied.status, f"{denied.message}\n".encode())
        return await route()


def _path(head: _Head) -> str:
    """The request's path, without its query."""
    target = head.line.partition(b" ")[2].partition(b" ")[0]
    return target.split(b"?", 1)[0].decode("ascii", "replace")


def _at_once(answer: Callable[[], Response]) -> Callable[[], Awaitable[Response]]:
    async def route() -> Response:
        return answer()

    return route


def _check(ok: bool, yes: str, no: str) -> Response:
    return Response(200, f"{yes}\n".encode()) if ok else Response(503, f"{no}\n".encode())


@dataclass(frozen=True, slots=True)
class _Head:
    line: bytes
    """The request line."""
    authorization: str
    """The Authorization header's value, or ""."""


async def _read_head(stream: trio.SocketStream) -> _Head | None:
    data = b""
    while b"\r\n\r\n" not in data and b"\n\n" not in data:
        chunk = await stream.receive_some(4096)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_HEAD_BYTES:
            return None
    line, *fields = data.replace(b"\r\n", b"\n").split(b"\n\n", 1)[0].split(b"\n")
    authorization = ""
    for field in fields:
        name, _, value = field.partition(b":")
        if name.strip().lower() == b"authorization":
            authorization = value.strip().decode("latin-1")
    return _Head(line, authorization) if line.strip() else None


def _encode(response: Response) -> bytes:
    head = (
        f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Unknown')}\r\n"
        f"Content-Type: {response.content_type}\r\n"
        f"Content-Length: {len(response.body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + response.body
