"""helm/fusevol's audit of reads (`audit` in values.yaml): the audit DaemonSet, the agent's flags,
and the webhook's permission to read namespaces, rendered by Helm's engine, linted and validated
like the rest of the chart (tests/deploy/test_helm.py). The agent's arguments are read by
fusevol's own parser; the audit server's flags are checked against its own `--help`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import helm_python as helm
import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from fusevol.cli.parser import build_parser
from tests.deploy.test_helm import CHART, KUBE_VERSIONS, NAMESPACE, merged, named, render

if TYPE_CHECKING:
    from collections.abc import Iterator

Obj = dict[str, Any]
SECRETS: Obj = {"audit": {"default": "secrets"}}
ENABLED: Obj = {"audit": {"enabled": True}}
API: Obj = {"source": {"kubernetes": True, "manifests": {"hostPath": ""}}}
WEBHOOK: Obj = {**API, "csi": {"enabled": True}, "webhook": {"enabled": True}}
CUSTOM: Obj = {
    "root": "/srv/fusevol",
    "fullnameOverride": "fv",
    "image": {"repository": "registry.example/fusevol", "tag": "dev"},
    "imagePullSecrets": [{"name": "registry"}],
    "priorityClassName": "node-critical",
    "nodeSelector": {"fusevol.example/agent": "yes"},
    "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "audit": {
        "default": "all",
        "stdout": True,
        "runtimeState": "/run/k3s/containerd",
        "resources": {"limits": {"memory": "512Mi"}},
    },
}
OFF_SETS = [
    pytest.param({}, id="default"),
    pytest.param(WEBHOOK, id="webhook"),
    pytest.param({"audit": {"default": False}}, id="bare-yaml-off"),
]
ON_SETS = [
    pytest.param(SECRETS, id="secrets"),
    pytest.param(ENABLED, id="enabled"),
    pytest.param(CUSTOM, id="custom"),
    pytest.param({**WEBHOOK, **SECRETS}, id="webhook"),
]


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def component(objs: list[Obj], name: str) -> list[Obj]:
    """The DaemonSets of a component: node-agent, holder or audit."""
    return [
        o
        for o in objs
        if o["kind"] == "DaemonSet"
        and o["metadata"]["labels"].get("app.kubernetes.io/component") == name
    ]


def pods(objs: list[Obj]) -> list[Obj]:
    """The pod spec of every workload rendered."""
    return [
        o["spec"]["template"]["spec"]
        for o in objs
        if o["kind"] in ("DaemonSet", "Deployment", "StatefulSet", "Job")
    ]


def agent_args(objs: list[Obj], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The agent's command line, read by its own parser (no FUSEVOL_* variable of the tests')."""
    [agent] = component(objs, "node-agent")
    [container] = agent["spec"]["template"]["spec"]["containers"]
    for name in [name for name in os.environ if name.startswith("FUSEVOL_")]:
        monkeypatch.delenv(name)
    argv = [
        arg.replace("$(NODE_NAME)", "node-7").replace("$(POD_IP)", "10.0.0.7")
        for arg in container["args"]
    ]
    return build_parser().parse_args(argv)


@pytest.mark.parametrize("values", OFF_SETS)
def test_audit_off_renders_nothing_of_it_and_no_host_pid(
    chart: helm.Chart, values: Obj, monkeypatch: pytest.MonkeyPatch
) -> None:
    objs = render(chart, values)
    assert component(objs, "audit") == []
    assert not [o for o in objs if o["metadata"]["name"].endswith("audit")]
    assert all(not pod.get("hostPID") for pod in pods(objs))
    [agent] = component(objs, "node-agent")
    args = agent["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith(("--audit-stdout", "--container-runtime-state"))]
    # No server of its own in the agent's pod (a rollout would take it away): a volume that asks
    # for an audit fails, saying so.
    parsed = agent_args(objs, monkeypatch)
    assert (parsed.audit, parsed.audit_server) == ("off", "none")


@pytest.mark.parametrize("values", ON_SETS)
def test_the_audit_daemonset(chart: helm.Chart, values: Obj) -> None:
    want = merged(values)
    root, state = want["root"], want["audit"]["runtimeState"]
    objs = render(chart, values)
    [daemonset] = component(objs, "audit")
    [agent] = component(objs, "node-agent")
    fullname = want["fullnameOverride"] or "fusevol"
    assert daemonset["metadata"]["name"] == f"{fullname}-audit"
    assert daemonset["metadata"]["namespace"] == NAMESPACE
    # Never updated by an upgrade: its pod serves the audited volumes' FUSE connection.
    assert daemonset["spec"]["updateStrategy"] == {"type": "OnDelete"}
    pod = daemonset["spec"]["template"]["spec"]
    agent_pod = agent["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert not agent_pod.get("hostPID")  # only the audit server's pods
    assert pod["automountServiceAccountToken"] is False
    [container] = pod["containers"]
    assert container["command"] == ["python", "-m", "fusevol.fuse.audit"]
    assert container["args"] == ["--root", root, "--runtime-state", state, "--stay"]
    assert container["securityContext"] == {"privileged": True}
    assert container["resources"] == want["audit"]["resources"]
    [agent_container] = agent_pod["containers"]
    assert container["image"] == agent_container["image"]
    assert container["imagePullPolicy"] == agent_container["imagePullPolicy"]

    # The root shared both ways (its mount reaches the agent), /dev/fuse, the runtime's state
    # read-only at the same path.
    volumes, mounts = pod["volumes"], container["volumeMounts"]
    assert named(mounts, "root") == {
        "name": "root",
        "mountPath": root,
        "mountPropagation": "Bidirectional",
    }
    assert named(volumes, "root")["hostPath"] == named(agent_pod["volumes"], "root")["hostPath"]
    assert named(volumes, "dev-fuse")["hostPath"] == {"path": "/dev/fuse", "type": "CharDevice"}
    assert named(mounts, "dev-fuse")["mountPath"] == "/dev/fuse"
    assert named(volumes, "runtime-state")["hostPath"]["path"] == state
    assert named(mounts, "runtime-state") == {
        "name": "runtime-state",
        "mountPath": state,
        "readOnly": True,
        "mountPropagation": "HostToContainer",
    }
    assert len(volumes) == len(mounts) == 3

    # On the agent's nodes, as critical as the agent.
    for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName", "hostNetwork"):
        assert pod.get(key) == agent_pod.get(key), key
    assert pod.get("imagePullSecrets") == (want["imagePullSecrets"] or None)
    # Its selector picks no other DaemonSet's pods, and no other selector picks its pods.
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    selector = daemonset["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    for other in [o for o in objs if o["kind"] == "DaemonSet" and o is not daemonset]:
        theirs = other["spec"]["template"]["metadata"]["labels"]
        assert not selector.items() <= theirs.items()
        assert not other["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_the_audit_servers_flags_are_its_own() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fusevol.fuse.audit", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    for flag in ("--root", "--runtime-state", "--stay"):
        assert flag in result.stdout


@pytest.mark.parametrize(
    ("values", "level"),
    [
        pytest.param(SECRETS, "secrets", id="secrets"),
        pytest.param(ENABLED, "off", id="enabled-default-off"),
        pytest.param(CUSTOM, "all", id="custom"),
    ],
)
def test_the_agent_binds_from_the_audit_daemonsets_server(
    chart: helm.Chart, values: Obj, level: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = merged(values)
    args = agent_args(render(chart, values), monkeypatch)
    assert args.audit == level
    assert args.audit_stdout is want["audit"]["stdout"]
    assert args.audit_server == "external"
    assert args.container_runtime_state == Path(want["audit"]["runtimeState"])


@pytest.mark.parametrize("values", [{}, WEBHOOK, {**WEBHOOK, **SECRETS}])
def test_the_webhook_alone_may_read_namespaces(chart: helm.Chart, values: Obj) -> None:
    """The webhook reads namespaces' annotations whatever `audit` says (values.yaml): with it, a
    ClusterRole of namespaces get, list, watch bound to its ServiceAccount; nothing else of the
    release may read namespaces."""
    objs = render(chart, values)
    readers = [
        o
        for o in objs
        if o["kind"] == "ClusterRole"
        and any("namespaces" in rule["resources"] for rule in o["rules"])
    ]
    if not values.get("webhook"):
        assert readers == []
        return
    [role] = readers
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]}
    ]
    [binding] = [
        o
        for o in objs
        if o["kind"] == "ClusterRoleBinding" and o["roleRef"]["name"] == role["metadata"]["name"]
    ]
    [account] = [
        o["spec"]["template"]["spec"]["serviceAccountName"]
        for o in objs
        if o["kind"] == "Deployment"
    ]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    ]


@pytest.mark.parametrize("values", ON_SETS + OFF_SETS)
@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_valid_kubernetes_and_lint_clean(chart: helm.Chart, values: Obj, kube_version: str) -> None:
    for obj in render(chart, values):
        if obj["apiVersion"] != "cert-manager.io/v1":  # a CRD the validator does not know
            kubernetes_validate.validate(obj, kube_version, strict=True)
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{kube_version}")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param({"audit": {"default": "secret"}}, "/audit/default", id="level"),
        pytest.param({"audit": {"default": True}}, "/audit/default", id="bare-yaml-on"),
        pytest.param(
            {"audit": {"runtimeState": "run/containerd"}}, "/audit/runtimeState", id="rel"
        ),
        pytest.param({"audit": {"stdout": "yes"}}, "/audit/stdout", id="stdout"),
    ],
)
def test_the_values_schema_refuses(chart: helm.Chart, values: Obj, message: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=message):
        chart.render(values, name="fusevol", namespace=NAMESPACE)
