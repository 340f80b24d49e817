"""The webhook's HTTPS server: `POST /mutate` (AdmissionReview), `GET /healthz`, `GET /readyz`,
`GET /metrics`.

The standard library's threading HTTP/1.1 server (keep-alive, one thread per connection), over
TLS made in the connection's own thread: a client that is slow to shake hands holds up only
itself (the handshake and every read time out after IO_TIMEOUT_S). The certificate and key are
read again when either file changes (a renewed Secret, as kubelet or cert-manager updates it):
each new connection compares their identities (device, inode, size, mtime) with those it was
loaded from, so a renewal needs no restart. A request body is at most MAX_BODY_BYTES (a pod is
at most 1.5 MB in etcd).

    POST /mutate    the AdmissionReview's answer (fusevol.webhook.admission): 200, or 400 for a
                    body that is no AdmissionReview
    GET  /healthz   200 "ok" while the server answers
    GET  /readyz    200 once the CSIDriver has been read (`ready`), else 503
    GET  /metrics   Prometheus text format (`fusevol.observe.metrics.WebhookMetrics`): answers
                    by code, conversions by result, how long answers took; open to any caller,
                    like the probes (counts only, no pod's name), over the same TLS

Excludes: what is answered (`fusevol.webhook.admission`).
"""

from __future__ import annotations

import http.server
import logging
import os
import socket
import ssl
import threading
import time
from typing import TYPE_CHECKING, Any

from fusevol.base.errors import FusevolError
from fusevol.webhook.admission import BadReview

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from fusevol.observe.metrics import WebhookMetrics
    from fusevol.webhook.admission import Answer

log = logging.getLogger(__name__)

IO_TIMEOUT_S = 10.0
MAX_BODY_BYTES = 8 << 20


class Certificate:
    """The server's TLS context, made again when the certificate or key file changes."""

    def __init__(self, cert: Path, key: Path) -> None:
        self._cert, self._key = cert, key
        self._lock = threading.Lock()
        self._identity: tuple[tuple[int, ...], ...] = ()
        self._context = self._load()

    def context(self) -> ssl.SSLContext:
        """The context for a new connection: reloaded first if a file changed (a failed reload
        keeps the old one, logged)."""
        if self._files() != self._identity:
            with self._lock:
                if self._files() != self._identity:
                    try:
                        self._context = self._load()
                        log.info("tls certificate reloaded cert=%s", self._cert)
                    except FusevolError as exc:
                        log.error("tls certificate not reloaded, keeping the old one: %s", exc)
        return self._context

    def _files(self) -> tuple[tuple[int, ...], ...]:
        identities = []
        for path in (self._cert, self._key):
            try:
                st = os.stat(path)
            except OSError:
                return self._identity  # mid-update or gone: keep what we have
            identities.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(identities)

    def _load(self) -> ssl.SSLContext:
        identity = self._files()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        try:
            context.load_cert_chain(self._cert, self._key)
        except (OSError, ssl.SSLError) as exc:
            raise FusevolError(f"TLS certificate {self._cert} and key {self._key}: {exc}") from None
        self._identity = identity
        return context


class WebhookServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(
        self,
        address: tuple[str, int],
        *,
        certificate: Certificate,
        review: Callable[[bytes], Answer],
        ready: Callable[[], bool],
        metrics: WebhookMetrics | None = None,
    ) -> None:
        """`metrics`: what `/metrics` shows, counted as requests are answered (None: no
        `/metrics`, 404)."""
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        try:
            super().__init__(address, _Handler)
        except OSError as exc:
            raise FusevolError(f"cannot listen on {address[0]}:{address[1]}: {exc}") from None
        self.certificate = certificate
        self.review = review
        self.ready = ready
        self.metrics = metrics

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def finish_request(self, request: Any, client_address: Any) -> None:
        """In the connection's thread: the TLS handshake, then HTTP."""
        request.settimeout(IO_TIMEOUT_S)
        try:
            tls = self.certificate.context().wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError) as exc:
            log.debug("tls handshake failed peer=%s error=%s", client_address, exc)
            return
        try:
            _Handler(tls, client_address, self)
        finally:
            tls.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.exception("webhook connection failed peer=%s", client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: WebhookServer
    protocol_version = "HTTP/1.1"
    timeout = IO_TIMEOUT_S

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._send(200, b"ok", "text/plain")
        elif self.path == "/readyz":
            ready = self.server.ready()
            self._send(200 if ready else 503, b"ok" if ready else b"not ready", "text/plain")
        elif self.path == "/metrics" and (metrics := self.server.metrics) is not None:
            self._send(200, metrics.render(), "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._send(404, b"not found", "text/plain")

    def do_POST(self) -> None:
        if self.path.partition("?")[0] != "/mutate":
            self._send(404, b"not found", "text/plain")
            return
        try:
            length = int(self.headers.get("Content-Length") or "")
        except ValueError:
            self._send(411, b"a Content-Length is required", "text/plain")
            return
        if not 0 <= length <= MAX_BODY_BYTES:
            self._send(413, b"the body is too large", "text/plain")
            return
        body = self.rfile.read(length)
        started = time.perf_counter()
        try:
            answer = self.server.review(body)
        except BadReview as exc:
            log.warning("bad admission review peer=%s error=%s", self.client_address[0], exc)
            self._send(400, str(exc).encode(), "text/plain")
            return
        self._send(200, answer.body, "application/json")
        if (metrics := self.server.metrics) is not None:
            metrics.admission_duration.observe(time.perf_counter() - started)
            result = "failed" if answer.failed else "converted" if answer.conversion.patch else ""
            metrics.conversions.labels(result or "unchanged").inc()
        conversion = answer.conversion
        if answer.pod and (conversion.converted or conversion.not_converted):
            log.info(
                "pod admitted pod=%s converted=%s audited=%s not_converted=%s took_ms=%.1f",
                answer.pod,
                ",".join(conversion.converted) or "-",
                ",".join(conversion.audited) or "-",
                ",".join(conversion.not_converted) or "-",
                (time.perf_counter() - started) * 1000,
            )

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        if self.server.metrics is not None and self.path != "/metrics":
            self.server.metrics.requests.labels(str(status)).inc()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s", format % args)
