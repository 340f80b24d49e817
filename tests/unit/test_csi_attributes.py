"""fusevol.csi.attributes: a NodePublishVolume request -> what to serve, or the CsiError a
cluster user reads in the pod's FailedMount event. The example pod of examples/kubernetes is
parsed here as kubelet would send it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fusevol.csi.attributes import Code, CsiError, parse, volume_handle
from fusevol.model import (
    ConfigMapVolumeSource,
    DownwardAPIProjection,
    ProjectedVolumeSource,
    SecretVolumeSource,
    ServiceAccountTokenProjection,
)

REPO = Path(__file__).resolve().parents[2]
UID = "eeeeeeee-0000-4000-8000-000000000001"


def context(**attributes: str) -> dict[str, str]:
    return {
        **attributes,
        "csi.storage.k8s.io/pod.name": "web",
        "csi.storage.k8s.io/pod.namespace": "shop",
        "csi.storage.k8s.io/pod.uid": UID,
        "csi.storage.k8s.io/serviceAccount.name": "default",
        "csi.storage.k8s.io/ephemeral": "true",
    }


def request(tmp_path: Path, volume: str = "config", **overrides: Any) -> dict[str, Any]:
    kubelet = tmp_path / "kubelet"
    target = kubelet / "pods" / UID / "volumes" / "kubernetes.io~csi" / volume / "mount"
    target.parent.mkdir(parents=True, exist_ok=True)
    return {
        "volume_id": volume_handle(UID, volume),
        "target_path": str(target),
        "context": context(configMap="app"),
        "volume_mount_group": "",
        "kubelet_dir": kubelet,
        **overrides,
    }


def refused(code: Code, **kwargs: Any) -> str:
    with pytest.raises(CsiError) as failed:
        parse(**kwargs)
    assert failed.value.code is code, failed.value
    return str(failed.value)


def test_the_example_pods_volumes_parse(tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all((REPO / "examples/kubernetes/csi-pod.yaml").read_text()))
    [pod] = [d for d in docs if d["kind"] == "Pod"]
    sources = {}
    for volume in pod["spec"]["volumes"]:
        args = request(tmp_path, volume["name"])
        args["context"] = context(**volume["csi"]["volumeAttributes"])
        sources[volume["name"]] = parse(**args).volume.source
    assert sources["config"] == ConfigMapVolumeSource("app-config")
    assert sources["credentials"] == SecretVolumeSource("app-credentials")
    projected = sources["podinfo"]
    assert isinstance(projected, ProjectedVolumeSource)
    assert projected.default_mode == 0o444
    assert isinstance(projected.sources[0], DownwardAPIProjection)
    assert projected.sources[2] == ServiceAccountTokenProjection("vault-token", "vault", 3600)


def test_identity_tokens_and_mount_group(tmp_path: Path) -> None:
    tokens = {"vault": {"token": "t0ken", "expirationTimestamp": "2030-01-01T00:00:00Z"}}
    args = request(tmp_path, volume_mount_group="2000")
    args["context"]["csi.storage.k8s.io/serviceAccount.tokens"] = json.dumps(tokens)
    publication = parse(**args)
    assert (publication.pod.namespace, publication.pod.name, publication.pod.uid) == (
        "shop",
        "web",
        UID,
    )
    assert publication.fs_group == 2000
    assert publication.tokens == {"vault": b"t0ken"}
    assert "t0ken" not in repr(publication)
    assert "csi.storage.k8s.io/serviceAccount.tokens" not in publication.attributes


def test_refusals(tmp_path: Path) -> None:
    args = request(tmp_path)
    no_uid = {k: v for k, v in args["context"].items() if not k.endswith("pod.uid")}
    message = refused(Code.INVALID_ARGUMENT, **{**args, "context": no_uid})
    assert "podInfoOnMount: true" in message
    persistent = {**args["context"], "csi.storage.k8s.io/ephemeral": "false"}
    assert "inline ephemeral volumes only" in refused(
        Code.INVALID_ARGUMENT, **{**args, "context": persistent}
    )
    assert "not a group id" in refused(Code.INVALID_ARGUMENT, **{**args, "volume_mount_group": "x"})
    bad_tokens = {**args["context"], "csi.storage.k8s.io/serviceAccount.tokens": "[1]"}
    assert "map of audience to token" in refused(
        Code.INVALID_ARGUMENT, **{**args, "context": bad_tokens}
    )
    # Targets: '..', relative, a symlinked parent.
    dotted = args["target_path"].replace("/pods/", "/pods/../pods/")
    refused(Code.INVALID_ARGUMENT, **{**args, "target_path": dotted})
    refused(Code.INVALID_ARGUMENT, **{**args, "target_path": "pods/x/mount"})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link_parent = Path(request(tmp_path, "linked")["target_path"]).parent
    link_parent.rmdir()
    link_parent.symlink_to(elsewhere)
    linked = request(tmp_path, "linked")
    assert "symlink" in refused(Code.INVALID_ARGUMENT, **linked)
    # Namespaces other than the pod's.
    other = context(configMap="app", namespace="kube-system")
    assert "own namespace 'shop'" in refused(Code.PERMISSION_DENIED, **{**args, "context": other})
    nested = json.dumps(
        {"projected": {"sources": [{"secret": {"name": "s", "namespace": "kube-system"}}]}}
    )
    refused(Code.PERMISSION_DENIED, **{**args, "context": context(volume=nested)})
    same = context(configMap="app", namespace="shop")
    assert parse(**{**args, "context": same}).volume.source == ConfigMapVolumeSource("app")
