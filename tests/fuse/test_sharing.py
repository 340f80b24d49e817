"""Volumes that would hold the same files share one subtree of the FUSE mount: an update is one
publish, whatever the number of pods; each pod's bind still behaves as its own volume."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from tests.agent import AgentProcess, wait_for, write_atomically
from tests.manifests import POD_UID, configmap

if TYPE_CHECKING:
    from pathlib import Path

UIDS = [f"11111111-2222-4333-8444-{i:012d}" for i in range(1, 4)]
POD = """\
kind: Pod
metadata: {{name: {name}, namespace: {namespace}, uid: {uid}}}
spec:
  securityContext: {{fsGroup: {fs_group}}}
  containers: [{{name: c}}]
  volumes:
    - name: config
      configMap: {{name: app{items}}}
    - name: info
      downwardAPI: {{items: [{{path: name, fieldRef: {{fieldPath: metadata.name}}}}]}}
"""


def pod(uid: str, *, fs_group: int = 2000, namespace: str = "default", items: str = "") -> str:
    return POD.format(
        name=f"p{uid[-1]}", uid=uid, fs_group=fs_group, namespace=namespace, items=items
    )


def subtrees(agent: AgentProcess) -> set[str]:
    return set(os.listdir(agent.fuse_mountpoint()))


def test_same_spec_shares_one_subtree_and_one_publish(agent: AgentProcess, manifests: Path) -> None:
    for uid in UIDS:
        (manifests / f"{uid}.yaml").write_text(pod(uid))
    for uid in UIDS:
        agent.wait_state(uid, "config", "mounted")
        agent.wait_state(uid, "info", "mounted")
    volumes = [agent.volume(uid, "configmap", "config") for uid in UIDS]
    shared = {agent.fuse_subtree(v) for v in volumes}
    assert len(shared) == 1
    # The fixture's pod has no fsGroup: its files differ (group), so it has its own subtree;
    # downward API volumes depend on their pod: one subtree each.
    own = agent.fuse_subtree(agent.volume(POD_UID, "configmap", "config"))
    assert own not in shared
    infos = {agent.fuse_subtree(agent.volume(uid, "downward-api", "info")) for uid in UIDS}
    assert len(infos) == len(UIDS)
    for volume in volumes:
        assert (volume / "a").read_text() == "alpha"
        assert os.stat(volume / "..data" / "a").st_gid == 2000

    before = agent.wait_reconciled()
    write_atomically(manifests / "configmap.yaml", configmap(a="2"))
    for volume in [*volumes, agent.volume(POD_UID, "configmap", "config")]:
        wait_for(lambda v=volume: (v / "a").read_text() == "2")  # type: ignore[misc]
    after = agent.wait_reconciled()
    # The shared subtree and the fixture pod's own are published, and no more.
    assert after["publisher"]["publishes"] - before["publisher"]["publishes"] == 2
    assert len({(v / "..data").readlink() for v in volumes}) == 1
    # One refresh operation for the shared subtree (the other users only record the new inputs),
    # and one for the fixture pod's own: per-pod work does not grow with the pods.
    assert after["executor"]["started"] - before["executor"]["started"] == 2

    # A pod that goes leaves the others served; the last one takes the subtree with it.
    for i, uid in enumerate(UIDS):
        (manifests / f"{uid}.yaml").unlink()
        wait_for(lambda u=uid: not (agent.root / "pods" / u).exists())  # type: ignore[misc]
        for volume in volumes[i + 1 :]:
            assert (volume / "a").read_text() == "2"
    creds = agent.fuse_subtree(agent.volume(POD_UID, "secret", "creds"))
    wait_for(lambda: subtrees(agent) == {own.name, creds.name})  # the fixture pod's only

    # A pod that brings the subtree back gets it under the same name, made without the VFS: the
    # kernel saw the name removed and looked up in vain, and must not remember that
    # (docs/fuse.md fact 14).
    [name] = shared
    assert not name.exists()
    (manifests / "again.yaml").write_text(pod(UIDS[0]))
    agent.wait_mounted(volumes[0])  # not the status: a snapshot from before its removal says so
    assert agent.fuse_subtree(volumes[0]) == name
    assert (volumes[0] / "a").read_text() == "2"
    assert (name / "a").read_text() == "2"


def test_other_namespace_or_changed_spec_gets_its_own_subtree(
    agent: AgentProcess, manifests: Path
) -> None:
    (manifests / "other-ns.yaml").write_text(
        configmap(a="other").replace("namespace: default", "namespace: other")
        + "---\n"
        + pod(UIDS[1], namespace="other")
    )
    (manifests / "first.yaml").write_text(pod(UIDS[0]))
    (manifests / "second.yaml").write_text(pod(UIDS[2]))
    for uid in (UIDS[0], UIDS[1], UIDS[2]):
        agent.wait_state(uid, "config", "mounted")
    first, other, second = (agent.volume(uid, "configmap", "config") for uid in UIDS)
    assert (other / "a").read_text() == "other"
    assert agent.fuse_subtree(other) != agent.fuse_subtree(first)
    assert agent.fuse_subtree(second) == agent.fuse_subtree(first)

    # An edited pod whose volume now projects one key elsewhere: its files change, the pod that
    # shared them keeps its own.
    (manifests / "second.yaml").write_text(pod(UIDS[2], items=", items: [{key: a, path: moved/a}]"))
    wait_for(lambda: (second / "moved" / "a").exists())
    assert not (second / "a").exists()
    assert (first / "a").read_text() == "alpha"
    assert not (first / "moved").exists()
    assert agent.fuse_subtree(second) != agent.fuse_subtree(first)
