"""Bad input and confinement of the CSI node plugin: anyone who may create a pod writes its
`volumeAttributes`, so nothing in them may reach beyond what a `configMap:`/`secret:` volume of
the pod could; every refusal is a clear gRPC error, and nothing else is disturbed."""

from __future__ import annotations

import copy
import json
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from tests.agent import mounts_below
from tests.csi.conftest import UID, csi_volume, pod
from tests.csi.kubelet import volume_handle

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests.csi.kubelet import Kubelet
    from tests.helpers.apiserver import ApiServer

OTHER_UID = "dddddddd-0000-4000-8000-000000000002"


def refused(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as failed:
        call()
    return failed.value.code(), str(failed.value.details())


def with_attributes(web: dict[str, Any], name: str, attributes: dict[str, str]) -> dict[str, Any]:
    changed = copy.deepcopy(web)
    entry = next(v for v in changed["spec"]["volumes"] if v["name"] == name)
    entry["csi"]["volumeAttributes"] = attributes
    return changed


def test_bad_attributes_targets_and_handles_are_refused_and_disturb_nothing(
    api: ApiServer, csi_agent: Callable[..., Any], kubelet_dir: Path, tmp_path: Path
) -> None:
    api.create({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "1"}})
    api.create(
        {
            "kind": "ConfigMap",
            "metadata": {"name": "app", "namespace": "other"},
            "data": {"a": "other"},
        }
    )
    names = ["good", "bad"]
    web = pod(volumes=[csi_volume(name, configMap="app") for name in names])
    api.create(web)
    stranger = pod("stranger", OTHER_UID, volumes=[csi_volume("bad", configMap="app")])
    with csi_agent() as (_agent, kubelet):
        _agent.expect_log('mount failed .*configmap "Not_A_Name!" not found')
        good = kubelet.publish(web, "good")
        assert (good / "a").read_text() == "1"
        k: Kubelet = kubelet

        def publish_bad(**attributes: str) -> tuple[grpc.StatusCode, str]:
            return refused(lambda: k.publish(with_attributes(web, "bad", attributes), "bad"))

        # Attributes: unknown, none, two, malformed, another type, a bad field: INVALID_ARGUMENT
        # naming the attribute (and the field).
        code, message = publish_bad(configMap="app", colour="blue")
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "'colour' is not known" in message
        code, message = publish_bad()
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "exactly one of configMap, secret, volume" in message
        code, message = publish_bad(configMap="app", secret="s")
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "(got configMap, secret)" in message
        code, message = publish_bad(volume="{configMap: [")
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "'volume' is not YAML or JSON" in message
        code, message = publish_bad(volume=json.dumps({"hostPath": {"path": "/etc"}}))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "configMap, secret, downwardAPI, projected" in message
        items = {"configMap": {"name": "app", "items": [{"key": "a", "path": "../escape"}]}}
        code, message = publish_bad(volume=json.dumps(items))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "volumeAttributes 'volume'" in message
        assert "configMap.items[0].path: invalid value" in message
        # A name the API would not have: looked up like any other, and not found.
        code, message = publish_bad(configMap="Not_A_Name!")
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert message == 'configmap "Not_A_Name!" not found'

        # Another namespace: PERMISSION_DENIED, as attribute or inside `volume`.
        code, message = publish_bad(configMap="app", namespace="other")
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "only from the pod's own namespace 'default'" in message
        inside = {"configMap": {"name": "app", "namespace": "other"}}
        code, message = publish_bad(volume=json.dumps(inside))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "names namespace 'other'" in message

        # Targets: outside --kubelet-dir, another pod's, a path with '..': INVALID_ARGUMENT.
        outside = (
            tmp_path
            / "elsewhere"
            / "pods"
            / UID
            / "volumes"
            / "kubernetes.io~csi"
            / "bad"
            / "mount"
        )
        code, message = refused(lambda: k.publish(web, "bad", forged_target=outside))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "--kubelet-dir" in message
        other_pod = (
            kubelet_dir / "pods" / OTHER_UID / "volumes" / "kubernetes.io~csi" / "bad" / "mount"
        )
        code, _ = refused(lambda: k.publish(web, "bad", forged_target=other_pod))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert not outside.exists()  # refused before anything was made there
        # A handle that is not kubelet's for this pod volume.
        code, message = refused(
            lambda: k.publish(web, "bad", forged_handle=volume_handle(UID, "good"))
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "not kubelet's handle" in message

        # A pod the API source does not know on this node: PERMISSION_DENIED, saying why.
        code, message = refused(lambda: k.publish(stranger, "bad"))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert (
            "pod default/stranger is not a pod of node test-node known to the API source" in message
        )
        impostor = copy.deepcopy(web)
        impostor["spec"]["serviceAccountName"] = "admin"
        code, message = refused(lambda: k.publish(impostor, "bad"))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "service account 'default', not 'admin'" in message

        # The same handle again with other attributes: ALREADY_EXISTS; the volume is unchanged.
        code, message = refused(
            lambda: k.publish(with_attributes(web, "good", {"configMap": "other-map"}), "good")
        )
        assert code == grpc.StatusCode.ALREADY_EXISTS
        assert "other attributes" in message

        # Nothing else disturbed: the good volume as it was, no other mount, no stray directory.
        assert (good / "a").read_text() == "1"
        assert mounts_below(kubelet_dir) == [str(good)]
        csi_dirs = kubelet_dir / "pods" / UID / "volumes" / "kubernetes.io~csi"
        assert sorted(p.name for p in csi_dirs.iterdir()) == ["good"]
        kubelet.unpublish(web, "good")
        assert mounts_below(kubelet_dir) == []


def test_a_volume_as_the_api_server_stores_it_publishes_and_a_bad_one_fails_alone(
    api: ApiServer, csi_agent: Callable[..., Any]
) -> None:
    """The source in `volume` as kube-apiserver stores it (`divisor: "0"`, `defaultMode: 420`,
    `apiVersion: v1`) publishes, divided by 1; a volume the agent cannot serve fails alone with
    INVALID_ARGUMENT naming its field. The pod's own spec, stored the same way, is no obstacle."""

    def downward(divisor: str) -> str:
        ref = {"containerName": "c", "resource": "limits.cpu", "divisor": divisor}
        item = {"path": "cpu", "resourceFieldRef": ref}
        return json.dumps({"downwardAPI": {"items": [item], "defaultMode": 420}})

    web = pod(
        volumes=[
            csi_volume("info", volume=downward("0")),
            csi_volume("bad", volume=downward("3")),
            {"name": "own", **json.loads(downward("0"))},
        ],
        containers=[{"name": "c", "resources": {"limits": {"cpu": "1500m"}}}],
    )
    api.create(web)
    with csi_agent() as (_agent, kubelet):
        code, message = refused(lambda: kubelet.publish(web, "bad"))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert message == (
            "volumeAttributes 'volume': pod default/web: downwardAPI.items[0].resourceFieldRef."
            'divisor: invalid value "3": only divisor\'s values 1m and 1 are supported with the '
            "cpu resource"
        )
        info = kubelet.publish(web, "info")
        assert (info / "cpu").read_text() == "2"
        assert oct((info / "cpu").stat().st_mode & 0o777) == "0o644"
        kubelet.unpublish(web, "info")
