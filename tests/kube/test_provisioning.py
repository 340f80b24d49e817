"""Local PVs provisioned on first use (`fusevol.io/hostpath`) with the Kubernetes API source.

The agent creates the PV through the API; the claim is bound by the test server's stand-in for the
PV controller (`tests.helpers.apiserver.PvController`), and the pod gets the volume through the
ordinary path: claim bound -> PV read -> local-PV bind mount.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.agent import mounts_below, wait_for
from tests.kube.conftest import UID, pod

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.agent import AgentProcess
    from tests.helpers.apiserver import ApiServer

OTHER_UID = "cccccccc-0000-4000-8000-000000000002"
PROVISIONER = "fusevol.io/hostpath"
CLAIM_VOLUME = {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}


def storage_class(base: Path, policy: str) -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": "local"},
        "provisioner": PROVISIONER,
        "reclaimPolicy": policy,
        "volumeBindingMode": "WaitForFirstConsumer",
        "parameters": {"basePath": str(base)},
    }


def claim() -> dict[str, Any]:
    return {
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data"},
        "spec": {
            "storageClassName": "local",
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
        },
        "status": {"phase": "Pending"},
    }


def other_nodes_released_pv(base: Path) -> dict[str, Any]:
    """Provisioned by fusevol on another node, its claim gone: that node's to delete."""
    return {
        "kind": "PersistentVolume",
        "metadata": {
            "name": "pvc-other",
            "labels": {"fusevol.io/node": "other-node"},
            "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER},
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "local",
            "local": {"path": str(base / "pvc-other")},
            "claimRef": {"namespace": "default", "name": "gone", "uid": "0000-gone"},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": ["other-node"],
                                }
                            ]
                        }
                    ]
                }
            },
        },
    }


def mounted(agent: AgentProcess, uid: str) -> Path:
    agent.wait_state(uid, "data", "mounted", timeout_s=10)
    return Path(str(agent.volume_status(uid, "data")["path"]))


WAITING = (
    "mount failed .*PVC default/data is not bound to a volume",
    'mount failed .*persistentvolume "pvc-[^"]*" not found',
)
"""A first-use volume's set-up fails (one ERROR line each) while its claim waits to be
provisioned, then for the binding, then for the new PV to reach the agent's cache."""


def pv_names(api: ApiServer) -> list[str]:
    listed = api._list("persistentvolumes", None, {})
    return [item["metadata"]["name"] for item in listed["items"]]


def test_delete_policy_created_through_the_api_bound_shared_then_deleted(
    api: ApiServer, kube_agent: Callable[..., Any], tmp_path: Path
) -> None:
    base = tmp_path / "base"
    api.create(storage_class(base, "Delete"))
    created_claim = api.create(claim())
    api.create(other_nodes_released_pv(base))
    with kube_agent(expect_log=WAITING) as agent:
        time.sleep(0.3)  # ready, and no consumer: nothing is provisioned
        assert pv_names(api) == ["pvc-other"]  # another node's to delete, not this one's
        assert not base.exists()
        (watch,) = [r for r in api.requests if r.path == "/api/v1/persistentvolumes" and r.watch]
        assert watch.query["labelSelector"] == "fusevol.io/node=test-node"

        api.create(pod(volumes=[CLAIM_VOLUME]))
        first = mounted(agent, UID)
        (name,) = set(pv_names(api)) - {"pvc-other"}
        assert name == f"pvc-{created_claim['metadata']['uid']}"
        directory = base / name
        pv = api.get("PersistentVolume", "", name)
        assert pv is not None
        assert pv["metadata"]["annotations"] == {"pv.kubernetes.io/provisioned-by": PROVISIONER}
        assert pv["metadata"]["labels"] == {"fusevol.io/node": "test-node"}
        assert pv["spec"]["local"] == {"path": str(directory)}
        assert pv["spec"]["capacity"] == {"storage": "1Gi"}
        assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Delete"
        assert pv["spec"]["storageClassName"] == "local"
        assert pv["spec"]["accessModes"] == ["ReadWriteOnce"]
        assert pv["spec"]["claimRef"] == {
            "kind": "PersistentVolumeClaim",
            "namespace": "default",
            "name": "data",
            "uid": created_claim["metadata"]["uid"],
        }
        (term,) = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
        assert term["matchExpressions"] == [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["test-node"]}
        ]
        assert pv["status"]["phase"] == "Bound"  # by the PV controller, not by the agent
        bound = api.get("PersistentVolumeClaim", "default", "data")
        assert bound is not None
        assert bound["spec"]["volumeName"] == name
        assert bound["status"]["phase"] == "Bound"
        # The pod's volume: a bind mount of the directory, named after the PV.
        assert first == agent.volume(UID, "local-volume", name)
        assert str(first) in mounts_below(agent.root)
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o777
        (first / "hello").write_text("from pod 1")
        assert (directory / "hello").read_text() == "from pod 1"

        # The pod goes; the claim keeps its volume; the next pod sees the data.
        api.delete("Pod", "default", "web")
        wait_for(lambda: not (agent.root / "pods" / UID).exists(), timeout_s=5)
        time.sleep(0.3)  # no pod of this node uses the claim: it exists, so nothing is reclaimed
        assert (directory / "hello").read_text() == "from pod 1"
        assert sorted(pv_names(api)) == sorted(["pvc-other", name])
        api.create(pod("second", OTHER_UID, volumes=[CLAIM_VOLUME]))
        second = mounted(agent, OTHER_UID)
        assert second.name == name
        assert (second / "hello").read_text() == "from pod 1"
        assert api.count("POST", "persistentvolumes") == 1

        # The pod, then the claim go (pvc-protection's order): the PV controller marks the PV
        # Released, the agent removes the directory and deletes the PV.
        api.delete("Pod", "default", "second")
        wait_for(lambda: not (agent.root / "pods" / OTHER_UID).exists(), timeout_s=5)
        api.delete("PersistentVolumeClaim", "default", "data")
        wait_for(lambda: f"volume deleted pv={name}" in agent.log_text(), timeout_s=5)
        assert pv_names(api) == ["pvc-other"]
        assert not directory.exists()
        assert api.count("DELETE", "persistentvolumes") == 1


def test_retain_policy_survives_a_restart_and_keeps_data_and_pv(
    api: ApiServer, kube_agent: Callable[..., Any], tmp_path: Path
) -> None:
    base = tmp_path / "base"
    api.create(storage_class(base, "Retain"))
    api.create(claim())
    api.create(pod(volumes=[CLAIM_VOLUME]))
    with kube_agent(expect_log=WAITING) as agent:
        path = mounted(agent, UID)
        (path / "kept").write_text("data")
        (name,) = pv_names(api)
    # A new agent: the PV exists and the claim is bound to it; nothing is created again.
    with kube_agent(expect_log=WAITING) as agent:
        path = mounted(agent, UID)
        assert path.name == name
        assert (path / "kept").read_text() == "data"
        assert api.count("POST", "persistentvolumes") == 1

        api.delete("Pod", "default", "web")
        wait_for(lambda: not (agent.root / "pods" / UID).exists(), timeout_s=5)
        api.delete("PersistentVolumeClaim", "default", "data")
        wait_for(lambda: f"volume released, retained pv={name}" in agent.log_text(), timeout_s=5)
        time.sleep(0.3)
        pv = api.get("PersistentVolume", "", name)
        assert pv is not None
        assert pv["status"]["phase"] == "Released"
        assert (base / name / "kept").read_text() == "data"
        assert api.count("DELETE", "persistentvolumes") == 0


@pytest.mark.parametrize("strategy", ["Get"])
def test_storage_class_and_claim_fetched_by_the_get_strategy(
    api: ApiServer, kube_agent: Callable[..., Any], tmp_path: Path, strategy: str
) -> None:
    """Without watches: the class and the claim are fetched; the binding arrives at a sync, and
    meanwhile the claim, provisioned already, is not provisioned again and again."""
    base = tmp_path / "base"
    api.create(storage_class(base, "Delete"))
    api.create(claim())
    api.create(pod(volumes=[CLAIM_VOLUME]))
    with kube_agent(
        "--change-detection", strategy, "--sync-period", "0.3", expect_log=WAITING
    ) as agent:
        path = mounted(agent, UID)
        (name,) = pv_names(api)
        assert path == agent.volume(UID, "local-volume", name)
        assert api.open_watches("storageclasses") == []
        assert api.count("GET", "storageclasses") >= 1
        time.sleep(0.3)  # the status file is written after the pass that mounted it
        operations = agent.snapshot()["statistics"]["executor"]["started"]
        assert operations < 10, operations  # provision, a few failed mounts, the mount


def test_a_claim_the_scheduler_selected_this_node_for_is_provisioned_before_its_pod_is_placed(
    api: ApiServer, kube_agent: Callable[..., Any], tmp_path: Path
) -> None:
    """The scheduler (played by the test) places a WaitForFirstConsumer pod only once its claim
    is bound: it annotates the claim with the node it chose, and waits."""
    base = tmp_path / "base"
    api.create(storage_class(base, "Delete"))
    selected = claim()
    selected["metadata"]["annotations"] = {"volume.kubernetes.io/selected-node": "test-node"}
    api.create(selected)
    elsewhere = claim()
    elsewhere["metadata"] = {
        "name": "elsewhere",
        "annotations": {"volume.kubernetes.io/selected-node": "other-node"},
    }
    api.create(elsewhere)
    api.create(pod(node="", volumes=[CLAIM_VOLUME]))  # pending: no node yet
    with kube_agent(expect_log=WAITING) as agent:

        def bound() -> str:
            current = api.get("PersistentVolumeClaim", "default", "data") or {}
            return str((current.get("spec") or {}).get("volumeName", ""))

        name = wait_for(bound, timeout_s=5)
        assert pv_names(api) == [name]  # not for the claim selected for another node
        assert (base / name).is_dir()
        # The scheduler binds the pod to this node; it gets its volume.
        placed = pod(volumes=[CLAIM_VOLUME])
        api.update(placed)
        path = mounted(agent, UID)
        assert path == agent.volume(UID, "local-volume", name)
        assert api.count("POST", "persistentvolumes") == 1
