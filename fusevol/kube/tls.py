"""The TLS of the connections to the API server, made from the client configuration: its CA
(else the system's), its client certificate (a TLS identity: a node's kubelet credentials, whose
file kubelet rotates, read again for every new connection after it changed), whether to verify;
ALPN offers h2 only.

Excludes: reading the configuration (`configuration`), the connections (`transport`, `http2`),
a bearer token (`credentials`).
"""

from __future__ import annotations

import logging
import os
import ssl
from typing import Any

from fusevol.base.errors import FusevolError

log = logging.getLogger(__name__)


class TlsContexts:
    """The TLS context of each new connection: made again when the client certificate's file
    changed (kubelet rotates its client certificate by pointing `kubelet-client-current.pem` at
    a new file), so that connections made after a rotation present the new one."""

    def __init__(self, config: Any) -> None:
        self._config = config
        self._context = ssl_context(config)
        self._version = self._file_version()

    def __call__(self) -> ssl.SSLContext:
        if (version := self._file_version()) != self._version:
            try:
                self._context = ssl_context(self._config)
                self._version = version
            except FusevolError as exc:  # half-written: the old one, and again next time
                log.warning("client certificate not reloaded, keeping the old one: %s", exc)
        return self._context

    def _file_version(self) -> tuple[int, int] | None:
        if not self._config.cert_file:
            return None
        try:
            stat = os.stat(self._config.cert_file)  # through the symlink
        except OSError:
            return None
        return stat.st_ino, stat.st_mtime_ns


def ssl_context(config: Any, *, client_certificate: bool = True) -> ssl.SSLContext:
    """The configuration's TLS: its CA (else the system's), its client certificate (unless
    not `client_certificate`), whether to verify; ALPN offers h2 only."""
    try:
        context = ssl.create_default_context(cafile=config.ssl_ca_cert or None)
        if config.cert_file and client_certificate:
            context.load_cert_chain(config.cert_file, config.key_file or None)
    except (OSError, ssl.SSLError) as exc:
        raise FusevolError(f"Kubernetes client configuration: TLS: {exc}") from None
    if not config.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    return context
