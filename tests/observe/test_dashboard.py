"""The chart's Grafana dashboard (helm/fusevol/files/dashboard.json): valid JSON Grafana loads
(a datasource variable, panels that read it, a node variable), every query valid PromQL as
Prometheus' own `promtool` parses it, and the panels an on-call engineer asks for: per node,
update latency, volumes by state, set-up and tear-down rates and errors, the API server's
answers and connections, memory per object, FUSE requests, the webhook's conversions. (That
each queried name exists: tests/observe/test_metric_names.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from tests.observe.promql import names
from tests.observe.test_rules import promtool

DASHBOARD = Path(__file__).resolve().parents[2] / "helm" / "fusevol" / "files" / "dashboard.json"
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$node": ".*"}
"""What Grafana puts in place of its variables before it sends a query."""
WANTED = {
    "update latency": "fusevol_update_propagation_seconds_bucket",
    "volumes by state": "volume_manager_total_volumes",
    "set-up and tear-down rates": "storage_operation_duration_seconds_count",
    "API requests by code": "rest_client_requests_total",
    "API connections": "fusevol_api_connections",
    "memory": "process_resident_memory_bytes",
    "objects": "fusevol_objects",
    "FUSE requests": "fusevol_fuse_requests_total",
    "failing volumes by pod": "fusevol_volume_failures",
    "frozen volumes by pod": "fusevol_frozen_volumes",
    "webhook conversions": "fusevol_webhook_conversions_total",
    "webhook answer time": "fusevol_webhook_admission_duration_seconds_bucket",
}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def targets() -> list[tuple[str, dict[str, Any]]]:
    return [
        (panel["title"], target)
        for panel in dashboard()["panels"]
        for target in panel.get("targets", ())
    ]


def test_the_dashboard_is_what_grafanas_sidecar_loads() -> None:
    board = dashboard()
    assert board["uid"] == "fusevol"
    assert board["title"] == "fusevol"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert "node" in variables
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["description"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each query, as a recording rule, with Grafana's variables in place."""
    rules = []
    for i, (_, target) in enumerate(targets()):
        expr = target["expr"]
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, expr
        rules.append({"record": f"fusevol:dashboard_query_{i}", "expr": expr})
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_the_panels_an_on_call_engineer_asks_for() -> None:
    queried = {name for _, target in targets() for name, _ in names(target["expr"])}
    assert {topic: name for topic, name in WANTED.items() if name not in queried} == {}
    errors = [t["expr"] for _, t in targets() if 'status="fail-unknown"' in t["expr"]]
    assert errors, "no panel of failed volume operations (kubelet's status fail-unknown)"


def test_the_agents_panels_are_per_node() -> None:
    """Every query of the agents follows the node variable and keeps the node apart (or is a
    table of series that carry it)."""
    for title, target in targets():
        expr = target["expr"]
        if 'job="fusevol"' not in expr:
            continue
        assert expr.count('node=~"$node"') == expr.count('job="fusevol"'), (title, expr)
        grouped = re.findall(r"\bby \(([^)]*)\)", expr)
        assert all("node" in group for group in grouped) or title.startswith("Agents"), title
