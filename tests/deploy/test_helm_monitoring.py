"""helm/fusevol's monitoring (`metrics.*`): the ServiceMonitors or PodMonitors that scrape the
agents and the webhook, the token they send, the PrometheusRule made of files/alerts.yaml and the
dashboard's ConfigMap; rendered by Helm's engine, linted, the core objects validated as the rest of
the chart (tests/deploy/test_helm.py), the operator's objects held to the fields its CRDs have
(monitoring.coreos.com/v1), and what they scrape held to what the agent serves: its port, its
path, the permission its `/metrics` asks of a caller (fusevol/observe/auth.py)."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import helm_python as helm
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from fusevol.observe.auth import PROTECTED
from tests.deploy.test_helm import (
    CHART,
    KUBE_VERSIONS,
    NAMESPACE,
    RELEASE,
    agent,
    one,
    render,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

Obj = dict[str, Any]
API: Obj = {"source": {"kubernetes": True, "manifests": {"hostPath": ""}}}
SERVICE_MONITOR: Obj = {**API, "metrics": {"serviceMonitor": {"enabled": True}}}
POD_MONITOR: Obj = {
    **API,
    "metrics": {"podMonitor": {"enabled": True}, "scrapeAuth": "serviceAccount"},
}
WEBHOOK: Obj = {**API, "csi": {"enabled": True}, "webhook": {"enabled": True}}
EVERYTHING: Obj = {
    **WEBHOOK,
    "metrics": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {"enabled": True},
        "dashboard": {"enabled": True},
    },
}
TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"
MONITORING = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}

ENDPOINT_FIELDS = {
    "authorization", "basicAuth", "bearerTokenFile", "bearerTokenSecret", "enableHttp2",
    "filterRunning", "followRedirects", "honorLabels", "honorTimestamps", "interval",
    "metricRelabelings", "noProxy", "oauth2", "params", "path", "port", "proxyConnectHeader",
    "proxyFromEnvironment", "proxyUrl", "relabelings", "scheme", "scrapeTimeout", "targetPort",
    "tlsConfig", "trackTimestampsStaleness",
}  # fmt: skip
"""A ServiceMonitor endpoint's fields (monitoring.coreos.com/v1). A PodMonitor's have
`portNumber` and no `bearerTokenFile`."""
POD_ENDPOINT_FIELDS = ENDPOINT_FIELDS - {"bearerTokenFile"} | {"portNumber"}
TLS_FIELDS = {"ca", "cert", "insecureSkipVerify", "keySecret", "serverName"}
RELABEL_FIELDS = {"sourceLabels", "separator", "targetLabel", "regex", "modulus", "replacement",
                  "action"}  # fmt: skip


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def of_kind(objs: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


def named(objs: list[Obj], name: str) -> Obj:
    [obj] = [o for o in objs if o["metadata"]["name"] == name]
    return obj


def endpoints(monitor: Obj) -> list[Obj]:
    spec = monitor["spec"]
    found: list[Obj] = spec.get("endpoints") or spec["podMetricsEndpoints"]
    return found


def check_operator_fields(monitor: Obj) -> None:
    """The fields the operator's CRD has, and the relabelings Prometheus accepts."""
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
    allowed = POD_ENDPOINT_FIELDS if monitor["kind"] == "PodMonitor" else ENDPOINT_FIELDS
    for endpoint in endpoints(monitor):
        assert set(endpoint) <= allowed, set(endpoint) - allowed
        assert set(endpoint.get("tlsConfig", {})) <= TLS_FIELDS
        for relabeling in endpoint["relabelings"] + endpoint.get("metricRelabelings", []):
            assert set(relabeling) <= RELABEL_FIELDS, relabeling
            re.compile(relabeling.get("regex", "(.*)"))
        assert re.fullmatch(r"(\d+[smh])+", endpoint["interval"])
        assert re.fullmatch(r"(\d+[smh])+", endpoint["scrapeTimeout"])


def relabel(relabeling: Obj, labels: dict[str, str]) -> dict[str, str]:
    """One `replace` relabeling applied as Prometheus applies it (anchored regex, ${n})."""
    value = ";".join(labels.get(name, "") for name in relabeling.get("sourceLabels", []))
    match = re.fullmatch(relabeling.get("regex", "(.*)"), value)
    if match is None:
        return labels
    result = re.sub(r"\$\{(\d+)\}|\$(\d+)", lambda m: match[int(m[1] or m[2])], relabeling.get(
        "replacement", "$1"))  # fmt: skip
    return {**labels, relabeling["targetLabel"]: result}


def target(endpoint: Obj, labels: dict[str, str]) -> dict[str, str]:
    for relabeling in endpoint["relabelings"]:
        assert relabeling.get("action", "replace") == "replace"
        labels = relabel(relabeling, labels)
    return labels


def test_nothing_of_monitoring_unless_enabled(chart: helm.Chart) -> None:
    objs = render(chart, {**WEBHOOK, "metrics": {"scrapeAuth": "serviceAccount"}})
    assert {o["kind"] for o in objs} & MONITORING == set()
    assert not [o for o in objs if o["metadata"]["name"].endswith(("-metrics", "-dashboard"))]
    assert not [o for o in objs if "metrics-reader" in o["metadata"]["name"]]


def test_the_service_monitor_scrapes_each_agent_with_prometheus_token(chart: helm.Chart) -> None:
    """The agents' pods behind a headless Service (not-ready ones too), scraped at httpPort over
    plain HTTP with Prometheus' own ServiceAccount token, as kube-prometheus scrapes kubelet."""
    objs = render(chart, SERVICE_MONITOR)
    [service] = of_kind(objs, "Service")
    [monitor] = of_kind(objs, "ServiceMonitor")
    check_operator_fields(monitor)
    pod_labels = agent(objs)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"].items() <= pod_labels.items()
    [port] = service["spec"]["ports"]
    assert port["targetPort"] == port["port"] == 9842  # httpPort: where the agent listens
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    [endpoint] = endpoints(monitor)
    assert endpoint["port"] == port["name"]
    assert (endpoint["path"], endpoint["scheme"]) == ("/metrics", "http")
    assert endpoint["bearerTokenFile"] == TOKEN_FILE
    assert "authorization" not in endpoint
    assert endpoint["honorLabels"] is True  # a frozen volume's pod stays its own
    assert target(endpoint, {"__meta_kubernetes_pod_node_name": "node-a"}) == {
        "__meta_kubernetes_pod_node_name": "node-a",
        "node": "node-a",
        "job": "fusevol",  # what files/alerts.yaml selects
    }
    for kube_version in KUBE_VERSIONS:
        kubernetes_validate.validate(service, kube_version, strict=True)


def test_the_pod_monitor_makes_the_address_and_sends_the_charts_token(chart: helm.Chart) -> None:
    """On the host network the agents declare no port: the PodMonitor makes each target's address
    from the pod's IP (v4 or v6) and httpPort; it sends the token of a ServiceAccount the chart
    allows `get nodes/metrics`, the permission the agent's /metrics asks of a remote caller."""
    objs = render(chart, {**POD_MONITOR, "httpPort": 19842})
    assert of_kind(objs, "ServiceMonitor") == []
    assert not [o for o in of_kind(objs, "Service") if o["metadata"]["name"].endswith("-metrics")]
    [monitor] = of_kind(objs, "PodMonitor")
    check_operator_fields(monitor)
    pod_labels = agent(objs)["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    [endpoint] = endpoints(monitor)
    for ip, address in (("10.0.0.7", "10.0.0.7:19842"), ("fd00::7", "[fd00::7]:19842")):
        scraped = target(endpoint, {"__meta_kubernetes_pod_ip": ip, "__address__": ip})
        assert scraped["__address__"] == address
    reader_name = f"{RELEASE}-metrics-reader"
    reader = named(of_kind(objs, "ServiceAccount"), reader_name)
    [secret] = of_kind(objs, "Secret")
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["annotations"] == {
        "kubernetes.io/service-account.name": reader["metadata"]["name"]
    }
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": secret["metadata"]["name"], "key": "token"},
    }
    role = named(of_kind(objs, "ClusterRole"), reader_name)
    assert role["rules"] == [
        {"apiGroups": [""], "resources": [f"nodes/{PROTECTED['/metrics']}"], "verbs": ["get"]}
    ]
    binding = named(of_kind(objs, "ClusterRoleBinding"), reader_name)
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": reader["metadata"]["name"], "namespace": NAMESPACE}
    ]
    for kube_version in KUBE_VERSIONS:
        for obj in (reader, secret, role, binding):
            kubernetes_validate.validate(obj, kube_version, strict=True)


def test_without_http_auth_no_token_is_sent(chart: helm.Chart) -> None:
    objs = render(chart, {**SERVICE_MONITOR, "httpAuth": "none"})
    [endpoint] = endpoints(one(objs, "ServiceMonitor"))
    assert {"bearerTokenFile", "authorization"} & set(endpoint) == set()


def test_the_webhooks_monitors_check_its_certificate(chart: helm.Chart) -> None:
    """The webhook's /metrics over its own TLS: the name its certificate is for, and the CA of
    the Secret its pods serve (Helm's, with a ca.crt; cert-manager's writes one too)."""
    values = {**WEBHOOK, "metrics": {"serviceMonitor": {"enabled": True}}}
    objs = render(chart, values)
    hook_name = f"{RELEASE}-webhook"
    hook = named(of_kind(objs, "ServiceMonitor"), hook_name)
    check_operator_fields(hook)
    service = named(of_kind(objs, "Service"), hook_name)
    assert hook["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    [endpoint] = endpoints(hook)
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert (endpoint["path"], endpoint["scheme"]) == ("/metrics", "https")
    assert {"bearerTokenFile", "authorization"} & set(endpoint) == set()  # open, like the probes
    tls = endpoint["tlsConfig"]
    assert tls["serverName"] == f"{hook['metadata']['name']}.{NAMESPACE}.svc"
    [secret] = of_kind(objs, "Secret")
    assert tls["ca"] == {"secret": {"name": secret["metadata"]["name"], "key": "ca.crt"}}
    assert "ca.crt" in secret["data"]
    assert target(endpoint, {})["job"] == "fusevol-webhook"
    metrics = {"podMonitor": {"enabled": True}, "scrapeAuth": "serviceAccount"}
    pod_hook = named(
        of_kind(render(chart, {**WEBHOOK, "metrics": metrics}), "PodMonitor"), hook_name
    )
    check_operator_fields(pod_hook)
    [pod_endpoint] = endpoints(pod_hook)
    assert pod_endpoint["tlsConfig"] == tls
    assert pod_endpoint["port"] == "https"  # the container's port name


def test_the_prometheus_rule_is_files_alerts_yaml(chart: helm.Chart) -> None:
    """The alerts of files/alerts.yaml as they are (tests/observe tests them with promtool), the
    webhook's only with the webhook, each runbook_url under metrics.prometheusRule.runbookURL."""
    alerts = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())["groups"]
    rule = one(render(chart, {**EVERYTHING}), "PrometheusRule")
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert rule["spec"]["groups"] == alerts
    agents_only = {**API, "metrics": {"prometheusRule": {"enabled": True}}}
    assert one(render(chart, agents_only), "PrometheusRule")["spec"]["groups"] == [
        group for group in alerts if group["name"] != "fusevol-webhook"
    ]
    url = "https://git.example/fusevol/blob/main/README.md"
    moved = {**API, "metrics": {"prometheusRule": {"enabled": True, "runbookURL": url}}}
    [*groups] = one(render(chart, moved), "PrometheusRule")["spec"]["groups"]
    urls = [r["annotations"]["runbook_url"] for g in groups for r in g["rules"]]
    assert urls
    assert all(u == f"{url}#{u.rpartition('#')[2]}" for u in urls)
    assert urls[0] == f"{url}#fusevolagentdown"


def test_the_dashboard_configmap_is_files_dashboard_json(chart: helm.Chart) -> None:
    """What Grafana's sidecar loads: a ConfigMap with its label, holding files/dashboard.json."""
    configmap = one(render(chart, EVERYTHING), "ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["namespace"] == NAMESPACE
    [(name, text)] = configmap["data"].items()
    assert name.endswith(".json")
    assert text == (CHART / "files" / "dashboard.json").read_text().rstrip("\n")
    assert json.loads(text)["uid"] == "fusevol"
    values = {**API, "metrics": {"dashboard": {"enabled": True, "namespace": "monitoring",
                                               "labels": {"dashboards": "fusevol"}}}}  # fmt: skip
    moved = one(render(chart, values), "ConfigMap")
    assert moved["metadata"]["namespace"] == "monitoring"
    assert moved["metadata"]["labels"]["dashboards"] == "fusevol"
    for kube_version in KUBE_VERSIONS:
        kubernetes_validate.validate(configmap, kube_version, strict=True)


def test_everything_enabled_lints_clean(chart: helm.Chart) -> None:
    objs = render(chart, EVERYTHING)
    kinds = [o["kind"] for o in objs]
    assert kinds.count("ServiceMonitor") == 2
    assert "PrometheusRule" in kinds
    assert "ConfigMap" in kinds
    for monitor in of_kind(objs, "ServiceMonitor"):
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    for kube_version in KUBE_VERSIONS:
        report = helm.lint(CHART, EVERYTHING, strict=True, kube_version=f"v{kube_version}")
        assert report["errors"] == []
        assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param(
            {**SERVICE_MONITOR, "httpHost": "127.0.0.1"},
            "the agents listen on httpHost 127.0.0.1",
            id="loopback",
        ),
        pytest.param(
            {"metrics": {"serviceMonitor": {"enabled": True}}},
            "with the manifests source the agents answer /metrics to root on the node only",
            id="manifests-source",
        ),
        pytest.param(
            {**API, "metrics": {"podMonitor": {"enabled": True}}},
            "a PodMonitor cannot send Prometheus' own token",
            id="pod-monitor-token-file",
        ),
    ],
)
def test_a_scrape_that_cannot_work_fails_the_render(
    chart: helm.Chart, values: Obj, message: str
) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param({"metrics": {"scrapeAuth": "token"}}, "/metrics/scrapeAuth", id="auth"),
        pytest.param(
            {"metrics": {"serviceMonitor": {"interval": "30 seconds"}}},
            "/metrics/serviceMonitor/interval",
            id="interval",
        ),
        pytest.param(
            {"metrics": {"dashboard": {"labels": {"grafana_dashboard": 1}}}},
            "/metrics/dashboard/labels/grafana_dashboard",
            id="label-not-a-string",
        ),
    ],
)
def test_the_values_schema_refuses_bad_monitoring_values(
    chart: helm.Chart, values: Obj, message: str
) -> None:
    with pytest.raises(helm.HelmValuesError, match=re.escape(message)):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
