"""Every metric name the chart's alerts (helm/fusevol/files/alerts.yaml) and dashboard panels
(files/dashboard.json) query exists where they query it: in the `/metrics` of a real agent (the
API source, so that its API client's series are there) for job "fusevol", and of the webhook's
server for job "fusevol-webhook". The names come from the queries themselves
(`tests.observe.promql.names`), never from a list; the only series no fusevol process exposes is
`up`, which Prometheus makes for every target it scrapes."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from fusevol.observe.metrics import WebhookMetrics
from fusevol.webhook.admission import review
from fusevol.webhook.server import Certificate, WebhookServer
from tests.agent import HAS_FUSE, NODE, running_agent, wait_for
from tests.helpers.apiserver import running_apiserver
from tests.observe.promql import exposed_names, names
from tests.webhook.test_convert import EVERY_TOKEN
from tests.webhook.test_server import Running, make_certificate

if TYPE_CHECKING:
    from collections.abc import Iterator

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "helm" / "fusevol" / "files" / "alerts.yaml"
DASHBOARD = REPO / "helm" / "fusevol" / "files" / "dashboard.json"
MADE_BY_PROMETHEUS = {"up"}
"""Series Prometheus makes itself for every target (scrape_* and the like are not queried)."""
POD_UID = "dddddddd-0000-4000-8000-000000000001"


def queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every alert expression and every dashboard panel query."""
    found = []
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        found += [(f"alert {rule['alert']}", rule["expr"]) for rule in group["rules"]]
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        found += [(f"panel {panel['title']!r}", t["expr"]) for t in panel.get("targets", ())]
    return found


def test_names_are_read_from_the_queries() -> None:
    """The extraction (tests/observe/promql.py) on the forms the chart uses."""
    expr = (
        'histogram_quantile(0.99, sum by (node, le) (rate(a_bucket{job="x", node=~"$node"}'
        '[$__rate_interval]))) > 2.5 * 1e3 and on (node) b{job="y"} offset 5m'
        ' or sum without (kind) (c) / count(d_total{code=~"4..|<error>"}) unless max(e)'
    )
    assert names(expr) == {("a_bucket", "x"), ("b", "y"), ("c", ""), ("d_total", ""), ("e", "")}
    assert names('absent(up{job="fusevol"} == 1)') == {("up", "fusevol")}
    with pytest.raises(ValueError, match="without a metric name"):
        names('sum({job="x"})')


def test_every_query_selects_a_job_of_fusevol() -> None:
    """A query without its job would read kubelet's series of the same names
    (storage_operation_duration_seconds, process_resident_memory_bytes) too."""
    for where, expr in queries():
        jobs = {job for _, job in names(expr)}
        assert jobs, (where, expr)
        assert jobs <= {"fusevol", "fusevol-webhook"}, (where, expr)


@pytest.fixture
def webhook(tmp_path: Path) -> Iterator[Running]:
    """The webhook's HTTPS server with its metrics, as `fusevol webhook` runs it."""
    cert, key = make_certificate(tmp_path, "webhook")
    server = WebhookServer(
        ("127.0.0.1", 0),
        certificate=Certificate(cert, key),
        review=lambda body: review(body, driver=EVERY_TOKEN, excluded_namespaces=frozenset()),
        ready=lambda: True,
        metrics=WebhookMetrics(),
    )
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield Running(server, cert, key)
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()


def pod(volumes: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"name": "web", "uid": POD_UID},
        "spec": {"nodeName": NODE, "containers": [{"name": "c"}], "volumes": volumes},
    }


@pytest.mark.fuse
@pytest.mark.skipif(not HAS_FUSE, reason="needs root and /dev/fuse")
def test_every_queried_name_is_in_the_metrics_of_a_running_agent_and_webhook(
    tmp_path: Path, webhook: Running
) -> None:
    status, body = webhook.request("GET", "/metrics")
    assert status == 200
    exposed = {"fusevol-webhook": exposed_names(text_string_to_metric_families(body.decode()))}
    with running_apiserver() as api:
        api.create({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "1"}})
        volumes = [
            {"name": "config", "configMap": {"name": "app"}},
            {"name": "missing", "configMap": {"name": "nowhere"}},  # a failing set-up
        ]
        api.create(pod(volumes))
        config = ("--kubeconfig", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        failed = ('mount failed volume=.*missing .*configmap "nowhere" not found',)
        with running_agent(None, tmp_path / "root", *config, expect_log=failed) as agent:
            agent.wait_state(POD_UID, "missing", "failed")
            text = wait_for(lambda: _with(agent.http_get("/metrics"), "fusevol_volume_failures{"))
            exposed["fusevol"] = exposed_names(text_string_to_metric_families(text))
            agent.stop()
    assert "rest_client_requests_total" in exposed["fusevol"]  # the API source's, scraped
    missing = sorted(
        (where, name, job)
        for where, expr in queries()
        for name, job in names(expr)
        if name not in MADE_BY_PROMETHEUS and name not in exposed.get(job, set())
    )
    assert missing == [], "queried, but no such metric in /metrics"


def _with(answer: tuple[int, str], part: str) -> str | None:
    """The answer's body if it is a 200 holding `part`."""
    status, body = answer
    return body if status == 200 and part in body else None
