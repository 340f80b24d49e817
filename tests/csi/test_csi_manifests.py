"""The CSI node plugin with the manifest source: the pods of the manifest directory play the part
of the API's pods (identity, downward API); tokens come from kubelet only."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import grpc
import pytest
import yaml

from tests.agent import mounts_below, running_agent
from tests.csi.kubelet import DRIVER, Kubelet

if TYPE_CHECKING:
    from pathlib import Path

UID = "dddddddd-0000-4000-8000-0000000000aa"
TOKEN_VOLUME = {
    "projected": {
        "sources": [
            {
                "downwardAPI": {
                    "items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]
                }
            },
            {"serviceAccountToken": {"path": "token", "audience": "vault"}},
        ]
    }
}


def test_manifest_pods_get_csi_volumes(tmp_path: Path, kubelet_dir: Path) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    web = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "default", "uid": UID},
        "spec": {
            "containers": [{"name": "c"}],
            "volumes": [
                {
                    "name": "config",
                    "csi": {"driver": DRIVER, "volumeAttributes": {"configMap": "app"}},
                },
                {
                    "name": "info",
                    "csi": {
                        "driver": DRIVER,
                        "volumeAttributes": {"volume": json.dumps(TOKEN_VOLUME)},
                    },
                },
            ],
        },
    }
    app = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "1"}}
    (manifests / "app.yaml").write_text(yaml.safe_dump_all([app, web]))
    socket = tmp_path / "csi.sock"
    extra = ("--csi-endpoint", f"unix://{socket}", "--kubelet-dir", str(kubelet_dir))
    with running_agent(manifests, tmp_path / "root", *extra) as agent:
        kubelet = Kubelet(kubelet_dir, socket, "test-node")
        try:
            config = kubelet.publish(web, "config")
            assert (config / "a").read_text() == "1"
            # No pod directories in CSI mode: what kubelet publishes, nothing else.
            assert mounts_below(agent.root) == [str(agent.fuse_mountpoint())]
            # kubelet's token is served; without it, the manifest source has none to offer.
            with pytest.raises(grpc.RpcError) as failed:
                kubelet.publish(web, "info")
            assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "list it in the tokenRequests of the CSIDriver fusevol.io" in str(
                failed.value.details()
            )
            info = kubelet.publish(web, "info", tokens={"vault": "t0ken"})
            assert (info / "token").read_text() == "t0ken"
            assert (info / "name").read_text() == "web"
            for name in ("config", "info"):
                kubelet.unpublish(web, name)
            assert mounts_below(kubelet_dir) == []
        finally:
            kubelet.close()
