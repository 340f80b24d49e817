"""Local PVs provisioned on demand (`fusevol.io/hostpath`) through the real agent."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fusevol.node import layout
from tests.agent import mounts_below, running_agent, wait_for
from tests.fuse.test_volume_manager import pod, uid

if TYPE_CHECKING:
    from tests.agent import AgentProcess

PROVISIONER = "fusevol.io/hostpath"
CLAIM_VOLUME = "    - {name: data, persistentVolumeClaim: {claimName: data}}"


def storage_class(base: Path, policy: str) -> str:
    return f"""
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: local}}
provisioner: fusevol.io/hostpath
reclaimPolicy: {policy}
volumeBindingMode: WaitForFirstConsumer
parameters: {{basePath: {base}}}
"""


def claim(uid_line: str = "") -> str:
    return f"""
kind: PersistentVolumeClaim
metadata: {{name: data, namespace: default{uid_line}}}
spec:
  storageClassName: local
  accessModes: [ReadWriteOnce]
  resources: {{requests: {{storage: 1Gi}}}}
"""


def recorded(agent: AgentProcess) -> list[dict[str, Any]]:
    path = layout.provisioned_file(agent.root)
    items: list[dict[str, Any]] = json.loads(path.read_text())["items"] if path.exists() else []
    return items


def mounted_path(agent: AgentProcess, i: int) -> Path:
    agent.wait_state(uid(i), "data", "mounted", timeout_s=10)
    return Path(str(agent.volume_status(uid(i), "data")["path"]))


def provisioned_count(agent: AgentProcess) -> int:
    return agent.log_text().count("INFO fusevol.provision.hostpath: volume provisioned ")


WAITING = "mount failed .* is not bound to a volume: waiting for fusevol.io/hostpath"
"""Logged (once) while a pod's claim waits for its first-use volume: expected in these tests."""


def test_delete_policy_first_use_shared_data_then_removed(tmp_path: Path) -> None:
    base = tmp_path / "base"
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "class.yaml").write_text(storage_class(base, "Delete"))
    (manifests / "claim.yaml").write_text(claim())
    with running_agent(
        manifests,
        tmp_path / "root",
        expect_log=(
            "mount failed .* is not bound to a volume: waiting for fusevol.io/hostpath",
            'mount failed .*persistentvolumeclaim "data" not found',
        ),
    ) as agent:
        agent.wait_reconciled()  # nothing is provisioned without a consumer
        assert not base.exists()
        assert recorded(agent) == []

        (manifests / "pod-1.yaml").write_text(pod(1, CLAIM_VOLUME))
        first = mounted_path(agent, 1)
        (pv,) = recorded(agent)
        name = pv["metadata"]["name"]
        directory = base / name
        assert name.startswith("pvc-")
        assert first == agent.volume(uid(1), "local-volume", name)
        assert str(first) in mounts_below(agent.root)
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o777
        assert pv["metadata"]["annotations"] == {"pv.kubernetes.io/provisioned-by": PROVISIONER}
        assert pv["spec"]["local"] == {"path": str(directory)}
        assert pv["spec"]["capacity"] == {"storage": "1Gi"}
        assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Delete"
        assert pv["spec"]["storageClassName"] == "local"
        assert pv["spec"]["claimRef"]["namespace"] == "default"
        assert pv["spec"]["claimRef"]["name"] == "data"
        hostname = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]
        assert hostname["matchExpressions"][0]["values"] == ["test-node"]
        (first / "hello").write_text("from pod 1")
        assert (directory / "hello").read_text() == "from pod 1"

        # The pod goes; the claim keeps its volume; the next pod sees the data.
        (manifests / "pod-1.yaml").unlink()
        wait_for(lambda: not (agent.root / "pods" / uid(1)).exists())
        assert (directory / "hello").read_text() == "from pod 1"
        (manifests / "pod-2.yaml").write_text(pod(2, CLAIM_VOLUME))
        second = mounted_path(agent, 2)
        assert second.name == name
        assert (second / "hello").read_text() == "from pod 1"
        assert provisioned_count(agent) == 1

        # The claim goes while a pod still names it: its mount goes, the data stays until the
        # pod is gone too (pvc-protection), then the directory is deleted.
        (manifests / "claim.yaml").unlink()
        agent.wait_state(uid(2), "data", "failed")
        wait_for(lambda: str(second) not in mounts_below(agent.root))
        agent.wait_reconciled()
        assert (directory / "hello").read_text() == "from pod 1"
        (manifests / "pod-2.yaml").unlink()
        wait_for(lambda: f"volume deleted pv={name}" in agent.log_text())
        assert not directory.exists()
        assert recorded(agent) == []
        assert mounts_below(agent.root / "pods") == []
        agent.stop()


def test_retain_policy_survives_restart_and_is_not_rebound(tmp_path: Path) -> None:
    base = tmp_path / "base"
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    claim_uid = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"
    (manifests / "class.yaml").write_text(storage_class(base, "Retain"))
    (manifests / "claim.yaml").write_text(claim(f", uid: {claim_uid}"))
    (manifests / "pod-1.yaml").write_text(pod(1, CLAIM_VOLUME))
    root = tmp_path / "root"
    directory = base / f"pvc-{claim_uid}"  # external-provisioner's name: pvc-<claim uid>
    with running_agent(manifests, root, expect_log=(WAITING,)) as first_agent:
        path = mounted_path(first_agent, 1)
        assert path.name == directory.name
        (path / "kept").write_text("data")
        first_agent.kill()

        with running_agent(manifests, root, expect_log=(WAITING,)) as agent:
            agent.wait_state(uid(1), "data", "mounted", timeout_s=10)
            assert (path / "kept").read_text() == "data"
            assert provisioned_count(agent) == 1  # the record survived: not provisioned again
            (pv,) = recorded(agent)
            assert pv["spec"]["claimRef"]["uid"] == claim_uid

            (manifests / "pod-1.yaml").unlink()
            (manifests / "claim.yaml").unlink()
            released = f"volume released, retained pv={directory.name}"
            wait_for(lambda: released in agent.log_text())
            assert "claimRef" not in recorded(agent)[0]["spec"]
            assert (directory / "kept").read_text() == "data"  # retained

            # A new claim of the same name gets a volume of its own, not the released one.
            (manifests / "claim.yaml").write_text(claim(f", uid: {claim_uid}"))
            (manifests / "pod-2.yaml").write_text(pod(2, CLAIM_VOLUME))
            fresh = mounted_path(agent, 2)
            assert fresh.name != directory.name
            assert os.listdir(fresh) == []
            assert len(recorded(agent)) == 2
            assert (directory / "kept").read_text() == "data"
            agent.stop()
