"""helm/fusevol with `csi.enabled`: the CSIDriver object, no registrar sidecar (the agent
registers the driver) and kubelet's directory, rendered by Helm's engine and validated like the
rest of the chart (tests/deploy/test_helm.py), the agent's arguments read by its own parser."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import helm_python as helm
import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from fusevol.cli.parser import build_parser
from fusevol.csi.attributes import DRIVER
from fusevol.csi.server import socket_path
from tests.deploy.test_helm import CHART, KUBE_VERSIONS, agent, named, one, render

if TYPE_CHECKING:
    from collections.abc import Iterator

Obj = dict[str, Any]
KUBERNETES = {"source": {"kubernetes": True, "manifests": {"hostPath": ""}}}
CSI: Obj = {**KUBERNETES, "csi": {"enabled": True}}
CSI_TOKENS: Obj = {
    **KUBERNETES,
    "csi": {
        "enabled": True,
        "kubeletDir": "/data/kubelet",
        "fsGroupPolicy": "None",
        "tokenRequests": [{"audience": "vault", "expirationSeconds": 3600}],
    },
}


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def test_no_csi_driver_unless_enabled(chart: helm.Chart) -> None:
    objs = render(chart, KUBERNETES)
    assert "CSIDriver" not in [o["kind"] for o in objs]
    pod = agent(objs)["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["fusevol"]
    assert "--csi-endpoint" not in pod["containers"][0]["args"]


@pytest.mark.parametrize("values", [CSI, CSI_TOKENS], ids=["defaults", "custom"])
def test_csi_driver_and_kubelet_dir(
    chart: helm.Chart, values: Obj, monkeypatch: pytest.MonkeyPatch
) -> None:
    csi = {"kubeletDir": "/var/lib/kubelet", "fsGroupPolicy": "File", **values["csi"]}
    kubelet_dir = csi["kubeletDir"]
    objs = render(chart, values)
    for kube_version in KUBE_VERSIONS:
        for obj in objs:
            kubernetes_validate.validate(obj, kube_version, strict=True)

    driver = one(objs, "CSIDriver")
    assert driver["metadata"]["name"] == DRIVER
    spec = driver["spec"]
    assert spec["attachRequired"] is False
    assert spec["podInfoOnMount"] is True
    assert spec["volumeLifecycleModes"] == ["Ephemeral"]
    assert spec["fsGroupPolicy"] == csi["fsGroupPolicy"]
    assert spec.get("tokenRequests") == (csi.get("tokenRequests") or None)
    assert spec["requiresRepublish"] is bool(csi.get("tokenRequests"))

    pod = agent(objs)["spec"]["template"]["spec"]
    # One container: the agent registers the driver with kubelet itself (no registrar sidecar,
    # whose stop removed the registration a successor had made).
    [container] = pod["containers"]
    for name in [name for name in os.environ if name.startswith("FUSEVOL_")]:
        monkeypatch.delenv(name)
    args = build_parser().parse_args([a.replace("$(NODE_NAME)", "n") for a in container["args"]])
    socket = Path(kubelet_dir) / "plugins" / DRIVER / "csi.sock"
    assert socket_path(args.csi_endpoint) == socket
    assert args.kubelet_dir == Path(kubelet_dir)
    assert named(container["volumeMounts"], "kubelet-dir") == {
        "name": "kubelet-dir",
        "mountPath": kubelet_dir,
        "mountPropagation": "Bidirectional",
    }
    volumes = pod["volumes"]
    assert named(volumes, "kubelet-dir")["hostPath"] == {"path": kubelet_dir, "type": "Directory"}

    # (the API source as its node: the cluster's CA, kube-root-ca.crt, to check the API server)
    assert {v["name"] for v in volumes} == {"root", "dev-fuse", "kubelet-dir", "cluster-ca"}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param({"csi": {"kubeletDir": "var/lib/kubelet"}}, "/csi/kubeletDir", id="relative"),
        pytest.param({"csi": {"fsGroupPolicy": "Always"}}, "/csi/fsGroupPolicy", id="policy"),
        pytest.param(
            {"csi": {"tokenRequests": [{"audience": "a", "expirationSeconds": 60}]}},
            "/csi/tokenRequests/0/expirationSeconds",
            id="short-token",
        ),
    ],
)
def test_the_values_schema_refuses_bad_csi_values(
    chart: helm.Chart, values: Obj, message: str
) -> None:
    with pytest.raises(helm.HelmValuesError, match=message):
        chart.render(values, name="fusevol", namespace="kube-system")


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_lint_is_clean_with_csi(kube_version: str) -> None:
    report = helm.lint(CHART, CSI_TOKENS, strict=True, kube_version=f"v{kube_version}")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
