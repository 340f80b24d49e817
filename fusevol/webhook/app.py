"""`fusevol webhook`: the CSIDriver and namespace watches and the HTTPS server, run until SIGTERM
or SIGINT.

Started in order: (1) the TLS certificate (a missing or bad one fails the start, one line); (2)
the API client, the CSIDriver watch and the namespace watch, each in a thread of its own (the
server is ready once the CSIDriver watch has listed; the namespaces are not waited for: a
namespace not listed yet is read when a pod of it is converted); (3) the server, on the main
thread. SIGTERM (a pod being deleted) first makes `/readyz`
answer 503 and keeps serving for `shutdown_delay_s`, so that the Service's endpoints drop the pod
before it stops answering (the API server would otherwise send it reviews it cannot answer, and
their pods would be admitted unconverted); SIGINT stops at once.
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from fusevol.observe.metrics import WebhookMetrics
from fusevol.webhook import cluster
from fusevol.webhook.admission import review
from fusevol.webhook.server import Certificate, WebhookServer

if TYPE_CHECKING:
    from pathlib import Path
    from types import FrameType

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WebhookSettings:
    tls_cert: Path
    """The serving certificate (PEM, chain allowed), read again when it changes."""
    tls_key: Path
    host: str = "0.0.0.0"
    """Where the API server reaches it: all addresses of the pod."""
    port: int = 8443
    """Not 443: the webhook runs as a user without privileges."""
    kubeconfig: Path | None = None
    """None: in-cluster in a pod, else the standard kubeconfig."""
    excluded_namespaces: frozenset[str] = frozenset({"kube-system"})
    """Never converted, whatever the webhook configuration sends (the chart adds its own)."""
    shutdown_delay_s: float = 5.0
    """How long SIGTERM keeps serving with /readyz failing: longer than the endpoints take to
    drop the pod (a few seconds)."""


def serve(settings: WebhookSettings) -> int:
    certificate = Certificate(settings.tls_cert, settings.tls_key)  # (1)
    client = cluster.api_client(settings.kubeconfig)  # (2)
    watch = cluster.DriverWatch(client)
    threading.Thread(target=watch.run, name="csidriver-watch", daemon=True).start()
    namespaces = cluster.NamespaceWatch(client)
    threading.Thread(target=namespaces.run, name="namespace-watch", daemon=True).start()
    stopping = threading.Event()
    server = WebhookServer(  # (3)
        (settings.host, settings.port),
        certificate=certificate,
        review=lambda body: review(
            body,
            driver=watch.driver(),
            excluded_namespaces=settings.excluded_namespaces,
            namespace_audit=namespaces.level,
        ),
        ready=lambda: watch.listed.is_set() and not stopping.is_set(),
        metrics=WebhookMetrics(),
    )

    def stop(delay_s: float, signum: int, frame: FrameType | None) -> None:
        if stopping.is_set():
            return
        stopping.set()
        log.info("stopping signal=%s in_s=%.1f", signal.Signals(signum).name, delay_s)
        timer = threading.Timer(delay_s, server.shutdown)
        timer.daemon = True
        timer.start()

    signal.signal(signal.SIGTERM, partial(stop, settings.shutdown_delay_s))
    signal.signal(signal.SIGINT, partial(stop, 0.0))
    log.info(
        "webhook serving address=%s:%d excluded=%s",
        settings.host,
        server.port,
        ",".join(sorted(settings.excluded_namespaces)),
    )
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        watch.stop()
        namespaces.stop()
        server.server_close()
    log.info("webhook stopped")
    return 0
