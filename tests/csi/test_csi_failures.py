"""A CSI volume that cannot be set up is named in the agent's `/metrics` as a pod's own volume is:
`fusevol_volume_failures{operation="mount"}`, what FusevolVolumeSetUpFailing reads. The CSI node
forgets a failed first publish (kubelet retries it), so the volume manager's state, where the
gauge looked, never held it: on the cluster kit a pod converted as the webhook converts it, whose
ConfigMap did not exist, failed for ever with no series and no alert. Driven as kubelet
v1.28 drives the driver (tests/csi/kubelet.py), against the real agent and the loopback API
server."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.agent import HAS_FUSE, NODE, running_agent, wait_for
from tests.csi.conftest import csi_volume, pod
from tests.csi.kubelet import DRIVER, Kubelet
from tests.helpers.apiserver import running_apiserver

if TYPE_CHECKING:
    from pathlib import Path

    from tests.agent import AgentProcess

WEB = "dddddddd-0000-4000-8000-000000000001"
GONE = "dddddddd-0000-4000-8000-000000000002"


def failures(agent: AgentProcess) -> dict[tuple[str, str, str], float]:
    """(pod, volume, operation) -> the value of each `fusevol_volume_failures` series."""
    status, body = agent.http_get("/metrics")
    assert status == 200
    found = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == "fusevol_volume_failures":
                labels = sample.labels
                assert labels["namespace"] == "default"
                found[labels["pod"], labels["volume"], labels["operation"]] = sample.value
    return found


def publish_fails(kubelet: Kubelet, obj: dict[str, object], volume: str) -> str:
    with pytest.raises(grpc.RpcError) as failed:
        kubelet.publish(obj, volume)
    assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    return str(failed.value.details())


@pytest.mark.fuse
@pytest.mark.skipif(not HAS_FUSE, reason="needs root and /dev/fuse")
def test_a_failing_csi_volume_is_counted_until_it_publishes_or_its_pod_goes(
    tmp_path: Path, kubelet_dir: Path
) -> None:
    socket = tmp_path / "plugins" / DRIVER / "csi.sock"
    csi = ("--csi-endpoint", f"unix://{socket}", "--kubelet-dir", str(kubelet_dir))
    web = pod("web", WEB, volumes=[csi_volume("config", volume='{"configMap": {"name": "app"}}')])
    gone = pod("gone", GONE, volumes=[csi_volume("config", configMap="nowhere")])
    missing = ('mount failed .*configmap "(app|nowhere)" not found',)
    with running_apiserver() as api:
        api.create(web)
        api.create(gone)
        config = ("--kubeconfig", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        with (
            running_agent(None, tmp_path / "root", *config, *csi, expect_log=missing) as agent,
            contextlib.closing(Kubelet(kubelet_dir, socket, NODE)) as kubelet,
        ):
            agent.wait_reconciled()
            assert failures(agent) == {}
            # kubelet's retries: each failed publish counts, in a row.
            for n in (1.0, 2.0):
                assert publish_fails(kubelet, web, "config") == 'configmap "app" not found'
                assert failures(agent) == {("web", "config", "mount"): n}
            publish_fails(kubelet, gone, "config")
            assert failures(agent)[("gone", "config", "mount")] == 1.0
            # Its pod deleted: kubelet never retries nor unpublishes it; the series goes.
            api.delete("Pod", "default", "gone")
            wait_for(lambda: ("gone", "config", "mount") not in failures(agent))
            # The object appears: the next publish succeeds and the series goes.
            api.create({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "1"}})
            wait_for(lambda: kubelet.publish(web, "config") or True, timeout_s=10)
            assert (kubelet.target(web, "config") / "a").read_text() == "1"
            assert failures(agent) == {}
            kubelet.unpublish(web, "config")
