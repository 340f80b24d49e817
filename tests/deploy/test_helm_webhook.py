"""helm/fusevol with `webhook.enabled`: the webhook's Deployment, Service, PodDisruptionBudget,
permissions, TLS (Helm's certificate, or cert-manager's) and MutatingWebhookConfiguration,
rendered by Helm's engine, linted and validated like the rest of the chart (tests/deploy/
test_helm.py); the webhook's arguments read by fusevol's own parser, and the certificate checked
with openssl(1) against the names the API server asks for."""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import helm_python as helm
import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from fusevol.cli.parser import build_parser
from tests.deploy.test_helm import CHART, KUBE_VERSIONS, named, one, render

if TYPE_CHECKING:
    from collections.abc import Iterator

Obj = dict[str, Any]
NAMESPACE = "kube-system"  # test_helm's render namespace
CSI: Obj = {"source": {"kubernetes": True, "manifests": {"hostPath": ""}}, "csi": {"enabled": True}}
WEBHOOK: Obj = {**CSI, "webhook": {"enabled": True}}
CERT_MANAGER: Obj = {**CSI, "webhook": {"enabled": True, "certManager": {"enabled": True}}}
KINDS = {
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Deployment",
    "Service",
    "PodDisruptionBudget",
    "MutatingWebhookConfiguration",
}


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def webhook_objects(objs: list[Obj]) -> list[Obj]:
    return [o for o in objs if o["metadata"]["name"].startswith("fusevol-webhook")]


def test_no_webhook_unless_enabled(chart: helm.Chart) -> None:
    assert webhook_objects(render(chart, CSI)) == []


@pytest.mark.parametrize(
    ("values", "kinds"),
    [(WEBHOOK, KINDS | {"Secret"}), (CERT_MANAGER, KINDS | {"Issuer", "Certificate"})],
    ids=["helm-certificate", "cert-manager"],
)
def test_the_webhooks_objects_are_valid_kubernetes(
    chart: helm.Chart, values: Obj, kinds: set[str]
) -> None:
    objs = webhook_objects(render(chart, values))
    assert sorted(o["kind"] for o in objs) == sorted(kinds)
    for kube_version in KUBE_VERSIONS:
        for obj in objs:
            if obj["apiVersion"] != "cert-manager.io/v1":  # a CRD the validator does not know
                kubernetes_validate.validate(obj, kube_version, strict=True)
    for kube_version in KUBE_VERSIONS:
        report = helm.lint(CHART, values, strict=True, kube_version=f"v{kube_version}")
        assert report["errors"] == []
        assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_the_deployment(chart: helm.Chart, monkeypatch: pytest.MonkeyPatch) -> None:
    objs = render(chart, WEBHOOK)
    deployment = one(objs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    for name in [name for name in os.environ if name.startswith("FUSEVOL_")]:
        monkeypatch.delenv(name)
    args = build_parser().parse_args(
        [a.replace("$(POD_NAMESPACE)", NAMESPACE) for a in container["args"]]
    )
    assert args.command == "webhook"
    assert args.exclude_namespace == [NAMESPACE]  # its own, beside kube-system always
    assert (args.tls_cert.parent, args.port) == (Path("/etc/fusevol-webhook"), 8443)
    assert named(container["env"], "POD_NAMESPACE")["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}
    }
    mount = named(container["volumeMounts"], "tls")
    assert mount["mountPath"] == "/etc/fusevol-webhook"
    assert named(pod["volumes"], "tls")["secret"]["secretName"] == "fusevol-webhook-tls"
    # Nothing of the agent's power: its own account, no privilege, no host path, no root.
    accounts = [o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount"]
    assert pod["serviceAccountName"] == "fusevol-webhook"
    assert sorted(accounts) == ["fusevol", "fusevol-webhook"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert "hostNetwork" not in pod
    assert all("hostPath" not in v for v in pod["volumes"])
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "https", "scheme": "HTTPS"}
    [role] = [
        o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "fusevol-webhook"
    ]
    assert role["rules"] == [
        {
            "apiGroups": ["storage.k8s.io"],
            "resources": ["csidrivers"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    # A PodDisruptionBudget and a Service over the very pods of the Deployment.
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    budget = one(objs, "PodDisruptionBudget")["spec"]
    assert budget["maxUnavailable"] == 1
    assert budget["selector"]["matchLabels"].items() <= labels.items()
    service = one(objs, "Service")["spec"]
    assert service["selector"].items() <= labels.items()
    assert service["ports"] == [
        {"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}
    ]
    # Neither the agent's DaemonSets nor the webhook's selector picks the other's pods.
    for daemonset in [o for o in objs if o["kind"] == "DaemonSet"]:
        theirs = daemonset["spec"]["template"]["metadata"]["labels"]
        assert not budget["selector"]["matchLabels"].items() <= theirs.items()
        assert not daemonset["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_the_webhook_configuration(chart: helm.Chart) -> None:
    [webhook] = one(render(chart, WEBHOOK), "MutatingWebhookConfiguration")["webhooks"]
    assert webhook["failurePolicy"] == "Ignore"
    assert webhook["sideEffects"] == "None"
    assert webhook["reinvocationPolicy"] == "Never"
    assert webhook["timeoutSeconds"] == 5
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert webhook["clientConfig"]["service"] == {
        "name": "fusevol-webhook",
        "namespace": NAMESPACE,
        "path": "/mutate",
        "port": 443,
    }
    assert webhook["namespaceSelector"] == {
        "matchExpressions": [
            {"key": "fusevol.io/inject", "operator": "In", "values": ["enabled"]},
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": ["kube-system", NAMESPACE],
            },
        ]
    }
    assert webhook["objectSelector"] == {
        "matchExpressions": [
            {"key": "fusevol.io/inject", "operator": "NotIn", "values": ["disabled"]}
        ]
    }


def test_helms_certificate_is_for_the_service_and_signed_by_the_bundle(
    chart: helm.Chart, tmp_path: Path
) -> None:
    objs = render(chart, WEBHOOK)
    secret = one(objs, "Secret")
    assert secret["type"] == "kubernetes.io/tls"
    [webhook] = one(objs, "MutatingWebhookConfiguration")["webhooks"]
    for name, data in [
        ("tls.crt", secret["data"]["tls.crt"]),
        ("tls.key", secret["data"]["tls.key"]),
        ("bundle.crt", webhook["clientConfig"]["caBundle"]),
    ]:
        (tmp_path / name).write_bytes(base64.b64decode(data))
    # What the API server checks: the chain up to the caBundle, and the Service's name.
    verify = subprocess.run(
        ["openssl", "verify", "-CAfile", str(tmp_path / "bundle.crt"),
         "-verify_hostname", f"fusevol-webhook.{NAMESPACE}.svc", str(tmp_path / "tls.crt")],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr
    pair = [
        subprocess.run(
            ["openssl", kind, "-in", str(tmp_path / name), *flags],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
        for kind, name, flags in (
            ("x509", "tls.crt", ["-noout", "-pubkey"]),
            ("pkey", "tls.key", ["-pubout"]),
        )
    ]  # fmt: skip
    assert pair[0] == pair[1]
    # Renewed at every render (install, upgrade).
    again = one(render(chart, WEBHOOK), "Secret")
    assert again["data"]["tls.crt"] != secret["data"]["tls.crt"]


def test_cert_managers_certificate(chart: helm.Chart) -> None:
    objs = render(chart, CERT_MANAGER)
    configuration = one(objs, "MutatingWebhookConfiguration")
    assert configuration["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"{NAMESPACE}/fusevol-webhook"
    }
    [webhook] = configuration["webhooks"]
    assert "caBundle" not in webhook["clientConfig"]
    certificate = one(objs, "Certificate")["spec"]
    assert certificate["secretName"] == "fusevol-webhook-tls"
    assert f"fusevol-webhook.{NAMESPACE}.svc" in certificate["dnsNames"]
    assert certificate["issuerRef"] == {"kind": "Issuer", "name": "fusevol-webhook"}
    assert one(objs, "Issuer")["spec"] == {"selfSigned": {}}
    issuer = {"name": "corp-ca", "kind": "ClusterIssuer"}
    own = {
        **CSI,
        "webhook": {"enabled": True, "certManager": {"enabled": True, "issuerRef": issuer}},
    }
    objs = render(chart, own)
    assert "Issuer" not in [o["kind"] for o in objs]
    assert one(objs, "Certificate")["spec"]["issuerRef"] == issuer


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param(
            {"webhook": {"enabled": True}}, "set csi.enabled and source.kubernetes", id="no-csi"
        ),
        pytest.param(
            {**CSI, "webhook": {"enabled": True, "certManager": {"enabled": "yes"}}},
            "/webhook/certManager/enabled",
            id="cert-manager-value",
        ),
        pytest.param(
            {**CSI, "webhook": {"enabled": True, "port": 443}}, "/webhook/port", id="port"
        ),
    ],
)
def test_bad_values_fail_the_render(chart: helm.Chart, values: Obj, message: str) -> None:
    with pytest.raises((helm.HelmRenderError, helm.HelmValuesError), match=message):
        chart.render(values, name="fusevol", namespace=NAMESPACE)
