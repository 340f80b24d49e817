"""The webhook's HTTPS server, over real TLS on loopback (certificates made by openssl(1)): the
routes, keep-alive, a client that never shakes hands holds up no one, and a renewed certificate
is served to the next connection without a restart."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fusevol.base.errors import FusevolError
from fusevol.observe.metrics import WebhookMetrics
from fusevol.webhook import admission
from fusevol.webhook.admission import review
from fusevol.webhook.server import Certificate, WebhookServer
from tests.webhook.test_admission import admission_review
from tests.webhook.test_convert import CONFIG, EVERY_TOKEN, _pod

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


def make_certificate(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for localhost and 127.0.0.1, as the chart's (CA = itself)."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", f"/CN={name}", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


class Running:
    def __init__(self, server: WebhookServer, cert: Path, key: Path) -> None:
        self.server, self.cert, self.key = server, cert, key
        self.ready = False

    def connection(self, cafile: Path | None = None) -> http.client.HTTPSConnection:
        context = ssl.create_default_context(cafile=str(cafile or self.cert))
        return http.client.HTTPSConnection(
            "localhost", self.server.port, context=context, timeout=10
        )

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        connection = self.connection()
        try:
            connection.request(method, path, body=body)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    cert, key = make_certificate(tmp_path, "webhook")
    holder: dict[str, Running] = {}
    server = WebhookServer(
        ("127.0.0.1", 0),
        certificate=Certificate(cert, key),
        review=lambda body: review(body, driver=EVERY_TOKEN, excluded_namespaces=frozenset()),
        ready=lambda: holder["running"].ready,
        metrics=WebhookMetrics(),
    )
    holder["running"] = running = Running(server, cert, key)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield running
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()


def test_mutate_answers_on_one_kept_alive_connection(running: Running) -> None:
    connection = running.connection()
    for _ in range(3):
        connection.request("POST", "/mutate", body=admission_review(_pod(CONFIG)))
        response = connection.getresponse()
        assert response.status == 200
        assert response.getheader("Content-Type") == "application/json"
        answer: Any = json.loads(response.read())
        assert answer["response"]["allowed"] is True
        assert answer["response"]["patchType"] == "JSONPatch"
    connection.close()


def test_health_readiness_and_refusals(running: Running, caplog: pytest.LogCaptureFixture) -> None:
    assert running.request("GET", "/healthz") == (200, b"ok")
    assert running.request("GET", "/readyz") == (503, b"not ready")
    running.ready = True
    assert running.request("GET", "/readyz") == (200, b"ok")
    assert running.request("GET", "/nope")[0] == 404
    assert running.request("POST", "/validate", b"{}")[0] == 404
    status, body = running.request("POST", "/mutate", b'{"kind": "AdmissionReview"}')
    assert (status, body) == (400, b"the body is not an AdmissionReview admission.k8s.io/v1")
    assert "bad admission review peer=127.0.0.1" in caplog.text
    caplog.clear()


def metric_samples(running: Running) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of the webhook's `/metrics`: (name, labels) -> value."""
    status, body = running.request("GET", "/metrics")
    assert status == 200
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def test_metrics_count_answers_conversions_and_their_time(
    running: Running, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """What the chart's alerts and dashboard read of the webhook: every answer by its code, every
    review by what became of the pod, and how long an answer took."""
    running.request("POST", "/mutate", body=admission_review(_pod(CONFIG)))  # converted
    running.request("POST", "/mutate", body=admission_review(_pod()))  # nothing to convert
    running.request("POST", "/mutate", b'{"kind": "AdmissionReview"}')  # 400
    caplog.clear()
    monkeypatch.setattr(admission, "convert_pod", lambda *_, **__: 1 / 0)
    running.request("POST", "/mutate", body=admission_review(_pod(CONFIG)))  # failed: unchanged
    assert "conversion failed, pod admitted unchanged" in caplog.text
    caplog.clear()

    samples = metric_samples(running)
    assert samples[("fusevol_webhook_requests_total", (("code", "200"),))] == 3
    assert samples[("fusevol_webhook_requests_total", (("code", "400"),))] == 1
    for result, count in (("converted", 1), ("unchanged", 1), ("failed", 1)):
        assert samples[("fusevol_webhook_conversions_total", (("result", result),))] == count
    assert samples[("fusevol_webhook_admission_duration_seconds_count", ())] == 3
    assert samples[("process_resident_memory_bytes", ())] > 0


def test_a_client_that_never_shakes_hands_holds_up_no_one(running: Running) -> None:
    with socket.create_connection(("127.0.0.1", running.server.port)):
        started = time.monotonic()
        assert running.request("GET", "/healthz") == (200, b"ok")
        assert time.monotonic() - started < 2


def test_a_renewed_certificate_is_served_to_the_next_connection(
    running: Running, tmp_path: Path
) -> None:
    old = running.connection()
    old.request("GET", "/healthz")
    assert old.getresponse().read() == b"ok"
    new_cert, new_key = make_certificate(tmp_path, "renewed")
    # As a Secret volume is updated: the files change under the same names.
    new_key.replace(running.key)
    new_cert.replace(running.cert)
    assert running.request("GET", "/healthz") == (200, b"ok")  # verified with the new one
    stranger, _ = make_certificate(tmp_path, "stranger")
    with pytest.raises(ssl.SSLCertVerificationError):  # trusting the old one is not enough
        running.connection(cafile=stranger).request("GET", "/healthz")
    old.request("GET", "/healthz")  # the connection made before keeps its session
    assert old.getresponse().read() == b"ok"
    old.close()


def test_a_bad_certificate_fails_the_start_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "c").write_text("not a certificate")
    with pytest.raises(FusevolError, match=r"^TLS certificate .*/c and key .*/k: "):
        Certificate(tmp_path / "c", tmp_path / "k")
