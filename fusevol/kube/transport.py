"""Transport: how a request reaches the API server, and its answer comes back as bytes.

Made from the client configuration (`configuration`): the server's address, HTTP/2 connections
(`http2`) with the configuration's TLS (`tls`), and the `Authorization` header of each request
(`credentials`). Requests are awaited on the trio thread, every one a stream of the same
connection, so a thousand watches cost one connection and no thread; at most REQUESTS_IN_FLIGHT
are sent and unanswered at once. A failure is one of `errors`: an error Status `ApiError`, no
answer `ApiUnavailable`, no connection `ApiUnreachable`; nothing is retried here. Every request
is counted by its method and the status code of its answer, as client-go counts them for
`rest_client_requests_total` (`statistics().responses`).

Authentication is a seam: a `Transport` authenticates with the configuration's bearer token or
client certificate (in its TLS context: a node's kubelet credentials, whose file kubelet rotates,
is read again for every new connection); `with_token(token)` and `with_authorization(value)` are
clients for the same connections that send another bearer token (a pod's service account's); a
client certificate is a TLS identity, so another one needs its own client (its own connections).

Excludes: the API's calls and their JSON (`client`: a `KubeClient` is a `Transport`), HTTP/2
itself (`http2`).
"""

from __future__ import annotations

import collections
import functools
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Self

import trio

import fusevol
from fusevol.base.errors import FusevolError
from fusevol.kube.configuration import load_configuration
from fusevol.kube.credentials import CallableCredentials, ConfiguredCredentials, Credentials
from fusevol.kube.errors import ApiUnavailable, ApiUnreachable, api_error
from fusevol.kube.http2.errors import ConnectionLost, Unreachable
from fusevol.kube.http2.pool import Pool
from fusevol.kube.tls import TlsContexts, ssl_context

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from fusevol.kube.http2.response import Response
    from fusevol.kube.http2.state import Header
    from fusevol.kube.kubelet_credentials import ClientCertificate

CONNECT_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 30.0
"""For lists, gets and posts, and for a watch to start (its response headers); an open watch
lasts until the server ends it, and a dead connection is found by its PINGs (`http2`)."""
UNANSWERED = "<error>"
"""The code of a request that got no answer (no connection, or it was lost before the headers),
as client-go counts it."""
REQUESTS_IN_FLIGHT = 64
"""Requests sent and not yet answered (a watch: until its headers), at most: thousands of
watches opened at once are a queue, not a burst that the server's priority and fairness would
answer with 429s, and they stay within one connection's streams."""


class Transport:
    """Requests to the API server, awaited on the trio thread; see the module docstring."""

    def __init__(self, *, kubeconfig: Path | ClientCertificate | None) -> None:
        config = load_configuration(kubeconfig)
        self.host: str = config.host
        url = urllib.parse.urlsplit(config.host)
        if url.scheme not in ("https", "http") or not url.hostname:
            raise FusevolError(f"Kubernetes client configuration: bad server {config.host!r}")
        tls = url.scheme == "https"
        self._prefix = url.path.rstrip("/")
        self._authority = url.netloc.rpartition("@")[2].encode()
        self._scheme = url.scheme.encode()
        pool = functools.partial(
            Pool,
            host=url.hostname,
            port=url.port or (443 if tls else 80),
            server_hostname=getattr(config, "tls_server_name", None) or None,
            connect_timeout_s=CONNECT_TIMEOUT_S,
        )
        self._pool = pool(ssl_context=TlsContexts(config) if tls else None)
        self._bearer_pool = self._pool
        """Where bearer tokens of others go: with a client certificate, connections that
        present none (kube-apiserver authenticates a connection's certificate before any token:
        a pod's token sent over the node's connection would read as the node)."""
        if tls and config.cert_file:
            self._bearer_pool = pool(ssl_context=ssl_context(config, client_certificate=False))
        self._credentials: Credentials = ConfiguredCredentials(config)
        self._in_flight = trio.Semaphore(REQUESTS_IN_FLIGHT)
        self._responses: collections.Counter[tuple[str, str]] = collections.Counter()
        """Answers by (method, status code), `UNANSWERED` for none: client-go's
        `rest_client_requests_total`. One counter for this client and those made from it."""

    def with_token(self, token: str) -> Self:
        """A client for the same server and connections that authenticates as `token`'s
        owner (a bearer token: a service account's, a TokenRequest's answer)."""
        return self.with_authorization(lambda: f"Bearer {token}")

    def with_authorization(self, value: Callable[[], str]) -> Self:
        """A client for the same server and connections whose `Authorization` header is
        `value()`, asked for every request (the freshest of tokens that change)."""
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        other._pool = self._bearer_pool
        other._credentials = CallableCredentials(value)
        return other

    async def wait_reachable(self) -> None:
        """After `ApiUnreachable`: until a connection to the API server is open again (one
        dialer for all the agent's waiters, jittered, every 2 s at most)."""
        await self._pool.wait_reachable()

    def statistics(self) -> ClientStatistics:
        return ClientStatistics(
            connections=self._pool.connections,
            connections_made=self._pool.connections_made,
            streams=self._pool.streams(),
            requests=sum(pool.requests for pool in {self._pool, self._bearer_pool}),
            host=self._authority.decode(),
            responses=tuple(
                (method, code, n) for (method, code), n in sorted(self._responses.items())
            ),
        )

    def close(self) -> None:
        """Close the connections (requests made after it open new ones)."""
        self._pool.close()
        self._bearer_pool.close()

    async def _read(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        data: bytes | None = None,
        content_type: str = "application/json",
        *,
        accept: bytes = b"application/json",
    ) -> bytes:
        """One request and its whole answer, within REQUEST_TIMEOUT_S."""
        response: Response | None = None
        try:
            async with self._in_flight:
                with trio.fail_after(REQUEST_TIMEOUT_S):
                    response = await self._send(
                        method, path, query, data, content_type, accept=accept
                    )
                    try:
                        return await response.read()
                    except ConnectionLost as exc:
                        raise ApiUnavailable(str(exc), said=exc.said) from None
                    finally:
                        response.close()
        except trio.TooSlowError:
            if response is None:
                self._unanswered(method)
            raise ApiUnavailable(f"{self.host}: {method} {path}: timed out") from None

    def _unanswered(self, method: str) -> None:
        """A request of `method` got no answer in time (`responses`)."""
        self._responses[method, UNANSWERED] += 1

    async def _send(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        data: bytes | None,
        content_type: str,
        *,
        accept: bytes = b"application/json",
    ) -> Response:
        """Send the request; its response once it has headers and a success status (the
        caller bounds the time and holds `_in_flight`)."""
        target = self._prefix + path
        if params := {k: v for k, v in query.items() if v}:
            target += "?" + urllib.parse.urlencode(params)
        headers: list[Header] = [
            (b":method", method.encode()),
            (b":scheme", self._scheme),
            (b":authority", self._authority),
            (b":path", target.encode()),
            (b"accept", accept),
            (b"user-agent", _USER_AGENT),
        ]
        if authorization := await self._credentials.authorization():
            headers.append((b"authorization", authorization.encode()))
        if data is not None:
            headers += [
                (b"content-type", content_type.encode()),
                (b"content-length", b"%d" % len(data)),
            ]
        try:
            response = await self._pool.request(headers, data)
            self._responses[method, str(response.status)] += 1
            if response.status < 400:
                return response
            try:
                text = await response.read()
            finally:
                response.close()
        except Unreachable as exc:
            self._unanswered(method)
            raise ApiUnreachable(str(exc)) from None
        except ConnectionLost as exc:
            self._unanswered(method)
            raise ApiUnavailable(str(exc), said=exc.said) from None
        raise api_error(response.status, text)


@dataclass(frozen=True, slots=True)
class ClientStatistics:
    connections: int
    """Open now."""
    connections_made: int
    """Since the start, the open ones included."""
    streams: int
    """Requests and watches open now."""
    requests: int = 0
    """Since the start (watches included)."""
    host: str = ""
    """The API server's host[:port]."""
    responses: tuple[tuple[str, str, int], ...] = ()
    """Answers since the start by method and status code (`UNANSWERED`: none came):
    (method, code, count)."""


_USER_AGENT = f"fusevol/{fusevol.__version__}".encode()
