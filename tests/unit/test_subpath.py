"""fusevol.node.container_mounts (a container's mounts resolved as kubelet resolves them) and the
pure parts of fusevol.cli.runtime (`fusevol wait`/`fusevol mounts`): pods decoded from real
manifests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fusevol.base.errors import FusevolError
from fusevol.cli import runtime
from fusevol.decode.manifest import parse_manifest
from fusevol.model import Pod
from fusevol.node.container_mounts import (
    SubPathError,
    container_mounts,
    expand,
    mount_subpath,
    resolve,
)

UID = "aaaaaaaa-0000-4000-8000-000000000001"
"""The pod's uid, as POD has it."""
POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: prod
  uid: aaaaaaaa-0000-4000-8000-000000000001
  labels: {tier: front}
  annotations: {"example.com/d": "by-annotation"}
spec:
  nodeName: node-a
  containers:
    - name: app
      env:
        - {name: TIER, valueFrom: {fieldRef: {fieldPath: "metadata.labels['tier']"}}}
        - {name: NOTE, valueFrom: {fieldRef: {fieldPath: "metadata.annotations['example.com/d']"}}}
        - {name: POD, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
        - {name: IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
        - {name: SECRETIVE, valueFrom: {secretKeyRef: {name: s, key: k}}}
        - {name: BASE, value: conf}
        - {name: EMPTY, value: ""}
        - {name: DERIVED, value: "$(BASE)-$(TIER)"}
      volumeMounts:
        - {name: config, mountPath: /etc/config}
        - {name: config, mountPath: /etc/app.properties, subPath: app.properties}
        - {name: config, mountPath: /etc/conf, subPathExpr: "$(TIER)/$(POD)",
           mountPropagation: HostToContainer}
        - {name: data, mountPath: /data, subPath: "logs//app/", readOnly: true}
        - {name: config, mountPath: /x, subPathExpr: "$(IP)"}
  volumes:
    - {name: config, configMap: {name: app}}
    - {name: data, emptyDir: {}}
"""


def _pod(text: str = POD) -> Pod:
    [pod] = parse_manifest(text.encode(), origin="pod.yaml")
    assert isinstance(pod, Pod)
    return pod


def test_env_and_mount_fields_are_decoded() -> None:
    container = _pod().containers[0]
    assert [v.name for v in container.env][:3] == ["TIER", "NOTE", "POD"]
    assert container.env[4].other == "secretKeyRef"
    assert container.volume_mounts[2].sub_path_expr == "$(TIER)/$(POD)"
    assert container.volume_mounts[2].mount_propagation == "HostToContainer"


def test_an_unknown_mount_propagation_is_an_error_naming_the_field() -> None:
    bad = POD.replace("mountPropagation: HostToContainer", "mountPropagation: Sideways")
    with pytest.raises(Exception, match=r"volumeMounts\[2\]\.mountPropagation.*Sideways"):
        _pod(bad)


def test_expansion_follows_the_kubernetes_rules() -> None:
    values = {"A": "x", "E": ""}
    assert expand("$(A)/$$(A)/$(", values) == ("x/$(A)/$(", [])
    assert expand("a$b$", values) == ("a$b$", [])
    assert expand("$(A)-$(B)-$(E)", values) == ("x-$(B)-", ["B", "E"])


def test_subpath_expr_uses_literal_values_and_pod_field_refs() -> None:
    pod = _pod()
    container = pod.containers[0]
    assert mount_subpath(pod, container, 0) == ""
    assert mount_subpath(pod, container, 1) == "app.properties"
    assert mount_subpath(pod, container, 2) == "front/web"
    assert mount_subpath(pod, container, 3) == "logs/app"
    with pytest.raises(SubPathError, match=r"container 'app' volumeMount 4 .*missing value for IP"):
        mount_subpath(pod, container, 4)


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("/etc/$(BASE)", "must not be an absolute path"),
        ("$(BASE)/../..", "must not contain '..'"),
        ("$(SECRETIVE)", "missing value for SECRETIVE"),
        ("$(EMPTY)x", "missing value for EMPTY"),
    ],
)
def test_subpath_errors_name_the_container_the_mount_and_the_reason(
    expr: str, message: str
) -> None:
    pod = _pod(POD.replace('"$(TIER)/$(POD)"', f'"{expr}"'))
    with pytest.raises(SubPathError) as caught:
        mount_subpath(pod, pod.containers[0], 2)
    assert "container 'app' volumeMount 2 (config at /etc/conf)" in str(caught.value)
    assert message in str(caught.value)


def test_an_env_value_may_use_earlier_values() -> None:
    pod = _pod(POD.replace('"$(TIER)/$(POD)"', '"$(DERIVED)"'))
    assert mount_subpath(pod, pod.containers[0], 2) == "conf-front"


def _status_entry(pod: Pod, **states: str) -> dict[str, Any]:
    return {
        "uid": pod.uid,
        "namespace": pod.namespace,
        "name": pod.name,
        "desired": True,
        "volumes": [
            {
                "name": "config",
                "type": "configmap",
                "state": states.get("config", "mounted"),
                "path": f"/r/pods/{UID}/volumes/kubernetes.io~configmap/config",
                "last_error": 'configmap "app" not found' if "config" in states else None,
            },
            {
                "name": "data",
                "type": "empty-dir",
                "state": "mounted",
                "path": f"/r/pods/{UID}/volumes/kubernetes.io~empty-dir/data",
                "last_error": None,
                "read_only": False,
            },
        ],
        "containers": container_mounts(pod),
    }


def test_resolve_binds_served_volumes_rslave_and_subpaths_through_their_views() -> None:
    pod = _pod(POD.replace('"$(IP)"', '"$(BASE)"'))
    mounts = resolve("/r", _status_entry(pod), "app")
    assert [(m.destination, m.source, m.options) for m in mounts] == [
        (
            "/etc/config",
            f"/r/pods/{UID}/volumes/kubernetes.io~configmap/config",
            ["rbind", "ro", "rslave"],
        ),
        (
            "/etc/app.properties",
            f"/r/pods/{UID}/volume-subpaths/config/app/1",
            ["rbind", "ro", "rslave"],
        ),
        ("/etc/conf", f"/r/pods/{UID}/volume-subpaths/config/app/2", ["rbind", "ro", "rslave"]),
        (
            "/data",
            f"/r/pods/{UID}/volumes/kubernetes.io~empty-dir/data/logs/app",
            ["rbind", "ro", "rprivate"],
        ),
        ("/x", f"/r/pods/{UID}/volume-subpaths/config/app/4", ["rbind", "ro", "rslave"]),
    ]
    assert mounts[0].ctr() == (
        f"type=bind,src=/r/pods/{UID}/volumes/kubernetes.io~configmap/config,dst=/etc/config,"
        "options=rbind:ro:rslave"
    )
    assert mounts[3].oci()["options"] == ["rbind", "ro", "rprivate"]
    # A mount of a read-only volume (a claim with readOnly) is read-only too, as under kubelet.
    writable = POD.replace('subPath: "logs//app/", readOnly: true', 'subPath: "logs"')
    entry = _status_entry(_pod(writable.replace('"$(IP)"', '"$(BASE)"')))
    assert resolve("/r", entry, "app")[3].options == ["rbind", "rw", "rprivate"]
    entry["volumes"][1]["read_only"] = True
    assert resolve("/r", entry, "app")[3].options == ["rbind", "ro", "rprivate"]


def test_resolve_errors() -> None:
    pod = _pod()
    with pytest.raises(SubPathError, match=r"volumeMount 4 .*missing value for IP"):
        resolve("/r", _status_entry(pod), "app")
    fixed = _pod(POD.replace('"$(IP)"', '"$(BASE)"'))
    with pytest.raises(
        SubPathError,
        match=r"container 'app' volumeMount 0 \(config at /etc/config\): volume 'config' not "
        r'ready \(failed\): configmap "app" not found',
    ):
        resolve("/r", _status_entry(fixed, config="failed"), "app")
    with pytest.raises(SubPathError, match="no container 'db' \\(containers: app\\)"):
        resolve("/r", _status_entry(fixed), "db")


def test_durations() -> None:
    assert runtime.parse_duration("2m") == 120
    assert runtime.parse_duration("1m30s") == 90
    assert runtime.parse_duration("500ms") == 0.5
    assert runtime.parse_duration("7") == 7
    with pytest.raises(FusevolError, match="not a duration"):
        runtime.parse_duration("2 minutes")


def test_a_pod_is_found_by_name_or_uid_and_the_timeout_names_each_volume() -> None:
    pod = _pod()
    snapshot = {"pods": [_status_entry(pod, config="failed")]}
    assert runtime.find_pod(snapshot, "prod/web") is snapshot["pods"][0]
    assert runtime.find_pod(snapshot, UID) is snapshot["pods"][0]
    assert runtime.find_pod(snapshot, "prod/other") is None
    problems = runtime.not_ready(Path("/r"), snapshot["pods"][0])
    assert problems == ["volume 'config': failed: configmap \"app\" not found"]
    assert runtime.wait_message("prod/web", 2, problems).splitlines() == [
        "pod prod/web: timed out after 2s waiting for its volumes: unmounted volumes=[config]",
        "  volume 'config': failed: configmap \"app\" not found",
    ]
