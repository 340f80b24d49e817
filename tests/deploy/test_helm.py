"""helm/fusevol: rendered by Helm's own engine, linted, and every object validated.

Helm runs in-process: PyPI's `helm-python-sdk` binds Helm's Go SDK (a shared library in its
wheel) with ctypes, so `Chart.render` is `helm template` and `lint` is `helm lint`, values schema
included, with no `helm` binary. Every rendered object is validated with `kubernetes-validate` in
strict mode (unknown fields are errors) against the Kubernetes schemas of the oldest version
`Chart.yaml` allows and of the newest the validator knows. The DaemonSet's arguments are parsed
by fusevol's own command line parser, so the chart cannot pass a flag the agent lacks.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

import fusevol
from fusevol.agent import app
from fusevol.base.settings import DEFAULT_ROOT
from fusevol.cli.parser import build_parser

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "fusevol"
RELEASE = "fusevol"
NAMESPACE = "kube-system"

Obj = dict[str, Any]

CUSTOM: Obj = {
    "root": "/srv/fusevol",
    "source": {"manifests": {"hostPath": "/srv/manifests"}},
    "httpPort": 19808,
    "httpHost": "127.0.0.1",
    "logLevel": "debug",
    "nodeAllocatable": "cpu=4,memory=8Gi",
    "image": {"repository": "registry.example/fusevol", "tag": "dev", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "registry"}],
    "fullnameOverride": "fv",
    "tolerations": [
        {
            "key": "node-role.kubernetes.io/control-plane",
            "operator": "Exists",
            "effect": "NoSchedule",
        }
    ],
    "nodeSelector": {"fusevol.example/agent": "yes"},
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}
                ]
            }
        }
    },
    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "256Mi"}},
    "extraEnv": [{"name": "TZ", "value": "UTC"}],
    "extraHostPaths": [
        {"name": "local-disks", "path": "/mnt/disks"},
        {"name": "host-data", "path": "/data", "readOnly": True},
    ],
    "hostNetwork": False,
    "dnsPolicy": "ClusterFirst",
    "priorityClassName": "",
    "serviceAccount": {"name": "agent", "annotations": {"team": "storage"}},
    "podAnnotations": {"prometheus.io/scrape": "true"},
    "podLabels": {"tier": "node"},
    "terminationGracePeriodSeconds": 120,
    "livenessProbe": {"periodSeconds": 20, "failureThreshold": 5},
}
NO_RBAC: Obj = {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "existing"}}
SERVICE_ACCOUNT: Obj = {"rbac": {"mode": "serviceaccount"}}
VALUE_SETS = [
    pytest.param({}, id="default"),
    pytest.param(CUSTOM, id="custom"),
    pytest.param(NO_RBAC, id="no-rbac"),
    pytest.param(SERVICE_ACCOUNT, id="serviceaccount"),
]

VIEW = ("get", "list", "watch")
EXPECTED_RULES = {
    ("", "pods", "list"),
    ("", "pods", "watch"),
    *(
        ("", resource, verb)
        for resource in ("configmaps", "secrets", "persistentvolumeclaims", "persistentvolumes")
        for verb in ("get", "list", "watch")
    ),
    ("", "serviceaccounts/token", "create"),
    ("", "events", "create"),
    ("", "events", "patch"),
    *(("storage.k8s.io", "storageclasses", verb) for verb in ("get", "list", "watch")),
    ("", "persistentvolumes", "create"),
    ("", "persistentvolumes", "delete"),
    ("authentication.k8s.io", "tokenreviews", "create"),
    ("authorization.k8s.io", "subjectaccessreviews", "create"),
}
"""What the Kubernetes API source does (list+watch this node's pods, get/list/watch the objects
of their volumes and the classes of their unbound claims, TokenRequest, events, create and delete
the PVs it provisions), and nothing else."""


def _kube_versions() -> list[str]:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    floor = re.fullmatch(r">=\s*(\d+\.\d+\.\d+)(-0)?", chart["kubeVersion"])
    assert floor is not None, chart["kubeVersion"]
    return [floor[1], kubernetes_validate.latest_version()]


KUBE_VERSIONS = _kube_versions()


@pytest.fixture(scope="module")
def chart() -> Any:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render(chart: helm.Chart, values: Obj) -> list[Obj]:
    manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert f"{CHART.name}/templates/NOTES.txt" in manifests
    objs = [
        obj
        for path, text in sorted(manifests.items())
        if path.endswith(".yaml")
        for obj in yaml.safe_load_all(text)
        if obj
    ]
    assert objs, f"the chart rendered no object with {values}"
    return objs


def expected_kinds(values: Obj) -> list[str]:
    """The kinds the chart renders with `values`, sorted: the agent and the holder, unless told
    otherwise its service account, and with rbac.mode serviceaccount its permissions (the node's
    identity, the default, needs none)."""
    if values is NO_RBAC:
        return ["DaemonSet", "DaemonSet"]
    if values is SERVICE_ACCOUNT:
        return ["ClusterRole", "ClusterRoleBinding", "DaemonSet", "DaemonSet", "ServiceAccount"]
    return ["DaemonSet", "DaemonSet", "ServiceAccount"]


def one(objs: list[Obj], kind: str) -> Obj:
    [obj] = [o for o in objs if o["kind"] == kind]
    return obj


def agent(objs: list[Obj]) -> Obj:
    """The agent's DaemonSet (the other is the holder's)."""
    [obj] = [o for o in objs if o["kind"] == "DaemonSet" and not _is_holder(o)]
    return obj


def holder(objs: list[Obj]) -> Obj:
    [obj] = [o for o in objs if o["kind"] == "DaemonSet" and _is_holder(o)]
    return obj


def _is_holder(obj: Obj) -> bool:
    return bool(obj["metadata"]["labels"].get("app.kubernetes.io/component") == "holder")


def named(items: list[Obj], name: str) -> Obj:
    [item] = [i for i in items if i["name"] == name]
    return item


def merged(values: Obj) -> Obj:
    """The chart's defaults with `values` over them, as Helm composes them."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())

    def merge(base: Obj, over: Obj) -> Obj:
        out = copy.deepcopy(base)
        for key, value in over.items():
            both = isinstance(value, dict) and isinstance(out.get(key), dict)
            out[key] = merge(out[key], value) if both else value
        return out

    return merge(defaults, values)


# -- rendering -------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", VALUE_SETS)
def test_renders_the_agent_and_its_permissions(chart: helm.Chart, values: Obj) -> None:
    objs = render(chart, values)
    kinds = sorted(o["kind"] for o in objs)
    assert kinds == expected_kinds(values)
    for obj in objs:
        if obj["kind"] in ("DaemonSet", "ServiceAccount"):
            assert obj["metadata"]["namespace"] == NAMESPACE


@pytest.mark.parametrize("values", VALUE_SETS)
def test_daemonset(chart: helm.Chart, values: Obj, monkeypatch: pytest.MonkeyPatch) -> None:
    want = merged(values)
    root, manifests = want["root"], want["source"]["manifests"]["hostPath"]
    daemonset = agent(render(chart, values))
    pod = daemonset["spec"]["template"]["spec"]
    [container] = pod["containers"]
    volumes, mounts = pod["volumes"], container["volumeMounts"]
    # A rollout overlaps the old and the new pod of a node: the new agent takes the connection.
    assert daemonset["spec"]["updateStrategy"] == want["updateStrategy"]
    if values.get("updateStrategy") is None:
        assert want["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}

    # The command line, read by the agent's own parser.
    assert container["command"] == ["fusevol"]
    for name in [name for name in os.environ if name.startswith("FUSEVOL_")]:
        monkeypatch.delenv(name)
    argv = [
        arg.replace("$(NODE_NAME)", "node-7").replace("$(POD_IP)", "10.0.0.7")
        for arg in container["args"]
    ]
    args = build_parser().parse_args(argv)
    assert args.command == "run"
    assert args.root == Path(root)
    assert args.node_name == "node-7"
    assert args.manifests == Path(manifests)
    assert args.http_port == want["httpPort"]
    # The pod's IP (what probes and scrapers reach) unless told; never the agent's loopback
    # default without the probes following it.
    assert args.http_host == (want["httpHost"] or "10.0.0.7")
    assert args.http_auth == want["httpAuth"] == "kubernetes"  # /status asks the API server
    assert named(container["env"], "POD_IP")["valueFrom"] == {
        "fieldRef": {"fieldPath": "status.podIP"}
    }
    assert args.log_level == want["logLevel"]
    assert args.node_allocatable == want["nodeAllocatable"]
    assert named(container["env"], "NODE_NAME")["valueFrom"] == {
        "fieldRef": {"fieldPath": "spec.nodeName"}
    }

    # Privileged, with /dev/fuse, the root shared both ways, the manifests read-only.
    assert container["securityContext"]["privileged"] is True
    assert named(volumes, "dev-fuse")["hostPath"] == {"path": "/dev/fuse", "type": "CharDevice"}
    assert named(mounts, "dev-fuse")["mountPath"] == "/dev/fuse"
    assert named(volumes, "root")["hostPath"] == {"path": root, "type": "DirectoryOrCreate"}
    assert named(mounts, "root") == {
        "name": "root",
        "mountPath": root,
        "mountPropagation": "Bidirectional",
    }
    assert named(volumes, "manifests")["hostPath"] == {"path": manifests, "type": "Directory"}
    assert named(mounts, "manifests") == {
        "name": "manifests",
        "mountPath": manifests,
        "readOnly": True,
    }
    for extra in want["extraHostPaths"]:
        assert named(volumes, extra["name"])["hostPath"]["path"] == extra["path"]
        assert named(mounts, extra["name"]) == {
            "name": extra["name"],
            "mountPath": extra["path"],
            "readOnly": extra.get("readOnly", False),
            "mountPropagation": "HostToContainer",
        }
    assert len(volumes) == len(mounts) == 3 + len(want["extraHostPaths"])

    # Probes on the agent's HTTP port; declared only off the host network, where it would be a
    # host port and the surge pod of a rollout would not fit beside the old one.
    if want["hostNetwork"]:
        assert "ports" not in container
    else:
        [port] = container["ports"]
        assert port == {"name": "http", "containerPort": want["httpPort"], "protocol": "TCP"}
    for probe in ("startup", "liveness"):
        spec = container[f"{probe}Probe"]
        host = {"host": want["httpHost"]} if want["httpHost"] else {}
        assert spec["httpGet"] == {"path": "/healthz", "port": want["httpPort"], **host}
        assert {k: spec[k] for k in want[f"{probe}Probe"]} == want[f"{probe}Probe"]
    # Ready when this container's agent serves: the file it keeps while it does (the port may be
    # the other pod's during a rollout).
    spec = container["readinessProbe"]
    assert spec["exec"] == {"command": ["test", "-e", "/run/fusevol-ready"]}
    assert args.ready_file == Path("/run/fusevol-ready")
    assert {k: spec[k] for k in want["readinessProbe"]} == want["readinessProbe"]

    # Scheduling and the rest, as asked.
    assert pod.get("tolerations") == (want["tolerations"] or None)
    assert pod.get("nodeSelector") == (want["nodeSelector"] or None)
    assert pod.get("affinity") == (want["affinity"] or None)
    assert container["resources"] == want["resources"]
    assert pod.get("priorityClassName") == (want["priorityClassName"] or None)
    assert pod["hostNetwork"] is want["hostNetwork"]
    assert pod["dnsPolicy"] == want["dnsPolicy"]
    assert pod["terminationGracePeriodSeconds"] > app.STOP_TIMEOUT_S
    assert pod["automountServiceAccountToken"] is False  # the manifests source needs no token
    tag = want["image"]["tag"] or fusevol.__version__
    assert container["image"] == f"{want['image']['repository']}:{tag}"
    labels = daemonset["spec"]["selector"]["matchLabels"]
    assert labels.items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()
    assert want["podLabels"].items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize("values", [SERVICE_ACCOUNT, {**CUSTOM, **SERVICE_ACCOUNT}])
def test_rbac_grants_exactly_what_the_api_source_uses(chart: helm.Chart, values: Obj) -> None:
    objs = render(chart, values)
    role, binding = one(objs, "ClusterRole"), one(objs, "ClusterRoleBinding")
    account = one(objs, "ServiceAccount")
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == EXPECTED_RULES
    assert all(set(rule) == {"apiGroups", "resources", "verbs"} for rule in role["rules"])
    standalone = yaml.safe_load((CHART / "files" / "clusterrole.yaml").read_text())
    assert role["rules"] == standalone["rules"]  # written once, in files/clusterrole.yaml
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
    ]
    pod = agent(objs)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert account["automountServiceAccountToken"] is False


def test_an_existing_service_account_is_used_as_named(chart: helm.Chart) -> None:
    pod = agent(render(chart, NO_RBAC))["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "existing"


def test_the_kubernetes_source_uses_the_api_and_no_host_directory(chart: helm.Chart) -> None:
    values = {
        "source": {"kubernetes": True, "manifests": {"hostPath": ""}, "changeDetection": "Get"},
        **SERVICE_ACCOUNT,
    }
    objs = render(chart, values)
    pod = agent(objs)["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--source") + 1] == "kubernetes"
    assert args[args.index("--change-detection") + 1] == "Get"
    assert "--manifests" not in args
    assert "manifests" not in [v["name"] for v in pod["volumes"]]
    assert "manifests" not in [m["name"] for m in pod["containers"][0]["volumeMounts"]]
    assert pod["automountServiceAccountToken"] is True  # in-cluster configuration needs it
    for obj in objs:
        kubernetes_validate.validate(obj, KUBE_VERSIONS[-1], strict=True)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param(
            {"source": {"kubernetes": True}},
            "set source.manifests.hostPath to",
            id="two-sources",
        ),
        pytest.param(
            {"source": {"manifests": {"hostPath": ""}}},
            "source.manifests.hostPath: set the host directory",
            id="no-source",
        ),
    ],
)
def test_a_missing_source_fails_the_render(chart: helm.Chart, values: Obj, message: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=message):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param({"httpPort": "9842"}, "/httpPort", id="port-type"),
        pytest.param({"httpPort": 0}, "/httpPort", id="port-range"),
        pytest.param({"root": "var/lib/fusevol"}, "/root", id="relative-root"),
        pytest.param({"rooot": "/x"}, "rooot", id="unknown-key"),
        pytest.param(
            {"extraHostPaths": [{"name": "root", "path": "/x"}]},
            "/extraHostPaths/0/name",
            id="volume-name-taken",
        ),
        pytest.param({"logLevel": "verbose"}, "/logLevel", id="log-level"),
    ],
)
def test_the_values_schema_refuses(chart: helm.Chart, values: Obj, message: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=re.escape(message)):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


# -- lint and Kubernetes schemas -------------------------------------------------------------------


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("values", VALUE_SETS)
def test_lint_is_clean(values: Obj, kube_version: str) -> None:
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{kube_version}")
    assert report["errors"] == []
    # Severity 1 is information ("icon is recommended": this project publishes no icon).
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
    assert report["total_charts_linted"] == 1


def test_lint_reports_bad_values() -> None:
    report = helm.lint(CHART, {"httpPort": "x"}, strict=True)
    assert any("/httpPort" in error for error in report["errors"])


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("values", VALUE_SETS)
def test_every_object_is_valid_kubernetes(chart: helm.Chart, values: Obj, kube_version: str):
    objs = render(chart, values)
    assert sorted(o["kind"] for o in objs) == expected_kinds(values)  # none went missing
    for obj in objs:
        kubernetes_validate.validate(obj, kube_version, strict=True)


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_the_standalone_clusterrole_is_valid_kubernetes(kube_version: str) -> None:
    role = yaml.safe_load((CHART / "files" / "clusterrole.yaml").read_text())
    assert role["kind"] == "ClusterRole"
    kubernetes_validate.validate(role, kube_version, strict=True)


def test_the_validator_refuses_a_misspelt_field(chart: helm.Chart) -> None:
    daemonset = agent(render(chart, {}))
    mount = daemonset["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]
    mount["mountPropogation"] = mount.pop("mountPropagation")
    with pytest.raises(kubernetes_validate.ValidationError, match="mountPropogation"):
        kubernetes_validate.validate(daemonset, KUBE_VERSIONS[-1], strict=True)


# -- documentation and agreement with the rest of the project --------------------------------------


def test_every_value_is_documented_and_in_the_schema(chart: helm.Chart) -> None:
    readme = (CHART / "README.md").read_text()
    schema = chart.schema
    assert schema is not None

    def documented(values: Obj, properties: Obj, prefix: str) -> list[str]:
        missing = []
        assert set(values) <= set(properties), f"not in values.schema.json: {prefix}{set(values)}"
        for key, value in values.items():
            nested = properties[key].get("properties")
            if isinstance(value, dict) and nested:
                missing += documented(value, nested, f"{prefix}{key}.")
            elif f"`{prefix}{key}`" not in readme:
                missing.append(prefix + key)
        return missing

    assert documented(chart.values, schema["properties"], "") == []


def test_versions_root_and_port_agree_with_the_agent_and_the_unit(chart: helm.Chart) -> None:
    assert chart.metadata["appVersion"] == fusevol.__version__
    env = dict(
        re.findall(r"^(FUSEVOL_\w+)=(.*)$", (REPO / "systemd/fusevol.env").read_text(), re.M)
    )
    assert chart.values["root"] == DEFAULT_ROOT == env["FUSEVOL_ROOT"]
    assert str(chart.values["httpPort"]) == env["FUSEVOL_HTTP_PORT"]
    assert build_parser().parse_args(["run"]).http_port == chart.values["httpPort"]
    assert build_parser().parse_args(["run"]).http_host == "127.0.0.1"  # loopback unless told


@pytest.mark.parametrize("values", VALUE_SETS)
def test_the_holder(chart: helm.Chart, values: Obj, monkeypatch: pytest.MonkeyPatch) -> None:
    """The holder keeps the agent's FUSE connection while no agent pod runs: `fusevol hold` on
    the agent's root, in a DaemonSet of its own that an upgrade leaves alone (OnDelete), with no
    privilege, no token, and only the agent's directory, whose mounts leave it with the host's.
    Neither DaemonSet's selector picks the other's pods."""
    want = merged(values)
    objs = render(chart, values)
    daemonset, agents = holder(objs), agent(objs)
    assert daemonset["spec"]["updateStrategy"] == {"type": "OnDelete"}
    for one_set, other in ((daemonset, agents), (agents, daemonset)):
        selector = one_set["spec"]["selector"]["matchLabels"].items()
        assert selector <= one_set["spec"]["template"]["metadata"]["labels"].items()
        assert not selector <= other["spec"]["template"]["metadata"]["labels"].items()
    pod = daemonset["spec"]["template"]["spec"]
    [container] = pod["containers"]
    for name in [name for name in os.environ if name.startswith("FUSEVOL_")]:
        monkeypatch.delenv(name)
    args = build_parser().parse_args(container["args"])
    assert container["command"] == ["fusevol"]
    assert (args.command, args.root) == ("hold", Path(want["root"]))
    assert container["image"] == agent(objs)["spec"]["template"]["spec"]["containers"][0]["image"]
    assert container["securityContext"] == {
        "runAsUser": 0,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod["automountServiceAccountToken"] is False
    agent_dir = f"{want['root']}/fusevol"
    assert pod["volumes"] == [
        {"name": "agent-dir", "hostPath": {"path": agent_dir, "type": "DirectoryOrCreate"}}
    ]
    assert container["volumeMounts"] == [
        {"name": "agent-dir", "mountPath": agent_dir, "mountPropagation": "HostToContainer"}
    ]
    assert container["resources"] == want["holder"]["resources"]
    assert pod.get("tolerations") == (want["tolerations"] or None)
    assert pod.get("nodeSelector") == (want["nodeSelector"] or None)

    assert [o for o in render(chart, {"holder": {"enabled": False}}) if _is_holder(o)] == []


@pytest.mark.parametrize("holder_enabled", [True, False])
def test_with_csi_the_holder_answers_kubelets_plugin_registration(
    chart: helm.Chart, holder_enabled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kubelet registers the driver again whenever its registration socket is made anew: the
    holder, which rollouts never restart, answers it, and the agent is told not to. Without the
    holder, the agent answers it."""
    for name in [name for name in os.environ if name.startswith("FUSEVOL_")]:
        monkeypatch.delenv(name)
    kubelet_dir = "/srv/kubelet"
    values = {"csi": {"enabled": True, "kubeletDir": kubelet_dir}}
    objs = render(chart, {**values, "holder": {"enabled": holder_enabled}})
    [container] = agent(objs)["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args([a.replace("$(NODE_NAME)", "n") for a in container["args"]])
    assert args.csi_registration == ("holder" if holder_enabled else "agent")
    if not holder_enabled:
        return
    pod = holder(objs)["spec"]["template"]["spec"]
    [container] = pod["containers"]
    held = build_parser().parse_args(container["args"])
    assert (held.csi_endpoint, held.kubelet_dir) == (args.csi_endpoint, Path(kubelet_dir))
    registry = f"{kubelet_dir}/plugins_registry"
    assert named(pod["volumes"], "plugins-registry")["hostPath"] == {
        "path": registry,
        "type": "DirectoryOrCreate",
    }
    assert named(container["volumeMounts"], "plugins-registry") == {
        "name": "plugins-registry",
        "mountPath": registry,
    }
    # The agent's CSI socket, read-only: whether it answers (a registration offered again).
    sockets = str(Path(held.csi_endpoint.removeprefix("unix://")).parent)
    assert named(pod["volumes"], "csi-socket-dir")["hostPath"] == {
        "path": sockets,
        "type": "DirectoryOrCreate",
    }
    assert named(container["volumeMounts"], "csi-socket-dir") == {
        "name": "csi-socket-dir",
        "mountPath": sockets,
        "readOnly": True,
    }


CONFIG = {("", resource, verb) for resource in ("configmaps", "secrets") for verb in VIEW}
TOKENS = {("", "serviceaccounts/token", "create")}
API: Obj = {"source": {"kubernetes": True, "manifests": {"hostPath": ""}}}
AS_SA: Obj = {**API, "rbac": {"mode": "serviceaccount"}}
NODE_MODE: Obj = {**API, "rbac": {"mode": "node"}}
READ_AS_POD: Obj = {**AS_SA, "csi": {"enabled": True, "readAs": "pod"}}
KUBELETS = {"kubeconfig": "/var/lib/rancher/k3s/agent/kubelet.kubeconfig"}


def as_sa(**values: Obj) -> Obj:
    """`values` with rbac.mode serviceaccount and the API source."""
    return {**AS_SA, **values, "rbac": {**AS_SA["rbac"], **values.get("rbac", {})}}


@pytest.mark.parametrize(
    ("values", "cluster_wide", "namespaced"),
    [
        pytest.param(AS_SA, EXPECTED_RULES, {}, id="serviceaccount"),
        pytest.param(as_sa(csi={"enabled": True}), EXPECTED_RULES - TOKENS, {}, id="csi"),
        pytest.param(
            as_sa(csi={"enabled": True}, rbac={"namespaces": ["team-a", "team-b"]}),
            EXPECTED_RULES - TOKENS - CONFIG,
            {"team-a": CONFIG, "team-b": CONFIG},
            id="csi-namespaces",
        ),
        pytest.param(
            as_sa(rbac={"namespaces": ["team-a"]}),
            EXPECTED_RULES - CONFIG,
            {"team-a": CONFIG},
            id="namespaces",
        ),
        pytest.param(READ_AS_POD, EXPECTED_RULES - TOKENS - CONFIG, {}, id="read-as-pod"),
        pytest.param(
            {**READ_AS_POD, "rbac": {"mode": "serviceaccount", "namespaces": ["team-a"]}},
            EXPECTED_RULES - TOKENS - CONFIG,
            {},
            id="read-as-pod-namespaces",
        ),
        pytest.param(API, None, {}, id="default"),
        pytest.param({**API, "csi": {"enabled": True}}, None, {}, id="node-csi"),
        pytest.param(
            {**API, "rbac": {"node": KUBELETS}, "csi": {"enabled": True}},
            None,
            {},
            id="node-kubeconfig-csi",
        ),
        pytest.param({**API, "rbac": {"node": KUBELETS}}, None, {}, id="node-kubeconfig"),
        pytest.param({**READ_AS_POD, **NODE_MODE}, None, {}, id="node-read-as-pod"),
    ],
)
def test_each_setting_grants_exactly_its_documented_rules(
    chart: helm.Chart,
    values: Obj,
    cluster_wide: set[tuple[str, str, str]] | None,
    namespaced: dict[str, set[tuple[str, str, str]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No extra verb or resource, cluster-wide or in any namespace: with CSI the agent mints
    no token (kubelet passes them, and the agent is told so), with rbac.namespaces ConfigMaps
    and Secrets are readable in those namespaces only, read as the pod (csi.readAs) not at all
    (the pods' tokens read them), and as its node (rbac.mode node) the ServiceAccount gets no
    rule at all: the node's identity is confined by the Node authorizer."""
    objs = render(chart, values)
    bindings = [o for o in objs if o["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    if cluster_wide is None:
        assert [o for o in objs if o["kind"] in ("ClusterRole", "Role")] == []
        assert bindings == []
    else:
        assert granted(one(objs, "ClusterRole")) == cluster_wide
    roles = {o["metadata"]["namespace"]: granted(o) for o in objs if o["kind"] == "Role"}
    assert roles == namespaced
    account = one(objs, "ServiceAccount")["metadata"]["name"]
    bindings = [o for o in objs if o["kind"] == "RoleBinding"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == sorted(namespaced)
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
        ]
    for name in [name for name in os.environ if name.startswith("FUSEVOL_")]:
        monkeypatch.delenv(name)
    pod = agent(objs)["spec"]["template"]["spec"]
    [container] = pod["containers"]
    args = build_parser().parse_args([a.replace("$(NODE_NAME)", "n") for a in container["args"]])
    want = merged(values)
    assert args.csi_token_requests is not want["csi"]["enabled"]
    assert args.csi_read_as == ("pod" if values.get("csi", {}).get("readAs") == "pod" else "agent")
    if want["rbac"]["mode"] == "node":
        check_node_identity(want, pod)
    if args.csi_read_as == "pod":  # kubelet passes the pod's token for the API server
        requests = one(objs, "CSIDriver")["spec"]["tokenRequests"]
        assert {"audience": ""} in requests
    for obj in objs:
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


def check_node_identity(want: Obj, pod: Obj) -> None:
    """As its node the agent has no token; it is given kubelet's kubeconfig and certificate
    directory, read-only, or with none it finds kubelet's credentials below kubelet's directory
    and checks the API server with the cluster's CA (kube-root-ca.crt)."""
    [container] = pod["containers"]
    args = build_parser().parse_args([a.replace("$(NODE_NAME)", "n") for a in container["args"]])
    node, kubelet_dir = want["rbac"]["node"], want["csi"]["kubeletDir"]
    assert pod["automountServiceAccountToken"] is False
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    if node["kubeconfig"]:
        assert args.kubeconfig == Path(node["kubeconfig"])
        for name, path, kind in (
            ("kubelet-kubeconfig", node["kubeconfig"], "File"),
            ("kubelet-certificates", node["certificateDir"], "Directory"),
        ):
            assert volumes[name]["hostPath"] == {"path": path, "type": kind}
            assert (mounts[name]["mountPath"], mounts[name]["readOnly"]) == (path, True)
        assert "cluster-ca" not in volumes
        return
    assert args.kubeconfig == "kubelet"
    assert args.kubelet_dir == Path(kubelet_dir)
    assert volumes["kubelet-dir"]["hostPath"] == {"path": kubelet_dir, "type": "Directory"}
    assert mounts["kubelet-dir"]["mountPath"] == kubelet_dir
    if not want["csi"]["enabled"]:  # (with CSI it is mounted Bidirectional for the targets)
        assert mounts["kubelet-dir"]["readOnly"] is True
    assert volumes["cluster-ca"]["projected"]["sources"] == [
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}
    ]
    assert mounts["cluster-ca"] == {
        "name": "cluster-ca",
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
        "readOnly": True,
    }
    assert not {"kubelet-kubeconfig", "kubelet-certificates"} & volumes.keys()


def test_the_default_install_reads_no_secret_and_mints_no_token(chart: helm.Chart) -> None:
    """The values a cluster user sets and nothing else: no identity of the release may read a
    Secret or ConfigMap outside what the Node authorizer gives the node, nor create a token."""
    values = {**API, "csi": {"enabled": True}, "webhook": {"enabled": True}}
    objs = render(chart, values)
    rules = [
        (group, resource, verb)
        for role in objs
        if role["kind"] in ("ClusterRole", "Role")
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    ]
    assert rules  # (the webhook's own: it reads the CSIDriver)
    for group, resource, verb in rules:
        assert group != "" or resource not in ("secrets", "configmaps", "serviceaccounts/token")
        assert "*" not in (group, resource, verb)
    check_node_identity(merged(values), agent(objs)["spec"]["template"]["spec"])


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param({**API, "csi": {"readAs": "pod"}}, "set csi.enabled", id="pod-without-csi"),
    ],
)
def test_an_identity_that_cannot_work_fails_the_render(
    chart: helm.Chart, values: Obj, message: str
) -> None:
    with pytest.raises(Exception, match=re.escape(message)):
        render(chart, values)


def test_read_as_pod_keeps_a_listed_audience_of_the_api_server(chart: helm.Chart) -> None:
    """The CSIDriver refuses one audience twice: the webhook's kube-api-access entry stays."""
    listed = [{"audience": "", "expirationSeconds": 3607}, {"audience": "vault"}]
    values = {**READ_AS_POD, "csi": {**READ_AS_POD["csi"], "tokenRequests": listed}}
    assert one(render(chart, values), "CSIDriver")["spec"]["tokenRequests"] == listed


def granted(role: Obj) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
