"""The hostpath provisioner's core, the manifest source's recorder, and claim binding.

Real directories in tmp_path, the real ObjectStore and the real `ManifestVolumeRecorder` (its
JSON file read back by the manifest parser); no mounts.
"""

from __future__ import annotations

import json
import os
import re
import stat
from typing import TYPE_CHECKING

import pytest

from fusevol.base.errors import VolumeSetupError
from fusevol.model import (
    LocalVolumeSource,
    PersistentVolume,
    PersistentVolumeClaim,
    PersistentVolumeClaimVolumeSource,
    Pod,
    PodUID,
    ResourceVersion,
    StorageClass,
    Volume,
    VolumeName,
)
from fusevol.node import layout
from fusevol.node.layout import Plugin
from fusevol.provision.hostpath import (
    PROVISIONED_BY,
    PROVISIONER,
    SELECTED_NODE,
    ClaimToProvision,
    HostPathProvisioner,
)
from fusevol.provision.record import ManifestVolumeRecorder
from fusevol.volumemanager.cache.desired import DesiredState
from fusevol.volumemanager.cache.store import ObjectStore
from fusevol.volumemanager.populator import Populator

if TYPE_CHECKING:
    from pathlib import Path

V = ResourceVersion("1")
NODE = "node-a"


def storage_class(*, base: str = "", policy: str = "Delete", provisioner: str = PROVISIONER):
    parameters = {"basePath": base} if base else {}
    return StorageClass("local", V, provisioner, parameters=parameters, reclaim_policy=policy)


def claim(
    *, uid: str = "", name: str = "data", annotations: dict[str, str] | None = None
) -> PersistentVolumeClaim:
    return PersistentVolumeClaim(
        "default",
        name,
        V,
        storage_class_name="local",
        uid=uid,
        storage_request="2Gi",
        annotations=annotations or {},
    )


class Node:
    """A provisioner on a real store and recorder, rooted in tmp_path."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = ObjectStore()
        self.recorder = ManifestVolumeRecorder(path=layout.provisioned_file(root), store=self.store)
        self.provisioner = HostPathProvisioner(
            root=root, node_name=NODE, store=self.store, recorder=self.recorder
        )

    async def provision(self, c: PersistentVolumeClaim, sc: StorageClass) -> PersistentVolume:
        await self.provisioner.provision(ClaimToProvision(c, sc))
        pv = self.provisioner.recorded_for(c)
        assert pv is not None
        return pv


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path / "root")


# -- describing and provisioning -------------------------------------------------------------------


def test_describe_names_the_volume_after_the_claim_uid(node: Node, tmp_path: Path) -> None:
    sc = storage_class(base=str(tmp_path / "base"), policy="Retain")
    pv = node.provisioner.describe(ClaimToProvision(claim(uid="u-1"), sc))
    assert pv == PersistentVolume(
        "pvc-u-1",
        ResourceVersion(""),
        LocalVolumeSource(str(tmp_path / "base" / "pvc-u-1")),
        annotations={PROVISIONED_BY: PROVISIONER},
        claim_ref=("default", "data"),
        storage_class_name="local",
        node_names=(NODE,),
        claim_uid="u-1",
        reclaim_policy="Retain",
        capacity="2Gi",
    )


def test_describe_without_uid_takes_a_fresh_name_under_the_default_base(node: Node) -> None:
    names = {
        node.provisioner.describe(ClaimToProvision(claim(), storage_class())).name for _ in range(3)
    }
    assert len(names) == 3
    for name in names:
        assert name.startswith("pvc-")
    pv = node.provisioner.describe(ClaimToProvision(claim(), storage_class()))
    assert isinstance(pv.source, LocalVolumeSource)
    assert pv.source.path == str(node.root / "fusevol" / "hostpath" / pv.name)


@pytest.mark.parametrize("base", ["relative/dir", "/srv/../etc"])
def test_base_path_must_be_absolute_without_backsteps(node: Node, base: str) -> None:
    with pytest.raises(VolumeSetupError, match=re.escape("must be an absolute path without '..'")):
        node.provisioner.describe(ClaimToProvision(claim(), storage_class(base=base)))


@pytest.mark.parametrize(
    ("provisioner", "annotations", "wanted"),
    [
        (PROVISIONER, {}, True),
        (PROVISIONER, {SELECTED_NODE: NODE}, True),
        (PROVISIONER, {SELECTED_NODE: "node-b"}, False),
        ("rancher.io/local-path", {}, False),
    ],
)
def test_wants(node: Node, provisioner: str, annotations: dict[str, str], wanted: bool) -> None:
    sc = storage_class(provisioner=provisioner)
    assert node.provisioner.wants(claim(annotations=annotations), sc) is wanted


async def test_provision_creates_the_directory_and_records_it_once(
    node: Node, tmp_path: Path
) -> None:
    sc = storage_class(base=str(tmp_path / "base"))
    pv = await node.provision(claim(uid="u-1"), sc)
    directory = tmp_path / "base" / "pvc-u-1"
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o777
    assert node.store.get(pv.key) == pv
    await node.provisioner.provision(ClaimToProvision(claim(uid="u-1"), sc))  # idempotent
    assert [v.name for v in node.recorder.provisioned()] == ["pvc-u-1"]
    assert os.listdir(tmp_path / "base") == ["pvc-u-1"]


async def test_a_volume_that_cannot_be_recorded_leaves_no_directory(
    node: Node, tmp_path: Path
) -> None:
    node.root.mkdir()
    (node.root / "fusevol").write_text("not a directory")  # the state cannot be written
    sc = storage_class(base=str(tmp_path / "base"))
    with pytest.raises(VolumeSetupError, match="cannot record provisioned volumes"):
        await node.provisioner.provision(ClaimToProvision(claim(uid="u-1"), sc))
    assert os.listdir(tmp_path / "base") == []
    assert node.recorder.provisioned() == ()


# -- reclaiming ------------------------------------------------------------------------------------


async def test_delete_waits_for_the_claim_and_its_last_user(node: Node, tmp_path: Path) -> None:
    sc = storage_class(base=str(tmp_path / "base"))
    c = claim(uid="u-1")
    node.store.upsert(c)
    pv = await node.provision(c, sc)
    assert node.provisioner.to_reclaim(in_use=set()) == []  # the claim is there
    node.store.delete(c.key)
    assert node.provisioner.to_reclaim(in_use={pv.name}) == []  # a pod still uses it
    # A pod still names the claim (its mount went with the claim): pvc-protection keeps the data.
    assert node.provisioner.to_reclaim(in_use=set(), claims_in_use={("default", "data")}) == []
    (due,) = node.provisioner.to_reclaim(in_use=set())
    await node.provisioner.reclaim(due)
    assert not (tmp_path / "base" / pv.name).exists()
    assert node.recorder.provisioned() == ()
    assert node.store.get(pv.key) is None


async def test_a_new_claim_of_the_same_name_is_not_the_old_one(node: Node, tmp_path: Path) -> None:
    sc = storage_class(base=str(tmp_path / "base"))
    node.store.upsert(claim(uid="u-1"))
    await node.provision(claim(uid="u-1"), sc)
    node.store.upsert(claim(uid="u-2"))  # deleted and created again
    assert [pv.name for pv in node.provisioner.to_reclaim(in_use=set())] == ["pvc-u-1"]


async def test_retain_releases_once_and_keeps_the_directory(node: Node, tmp_path: Path) -> None:
    sc = storage_class(base=str(tmp_path / "base"), policy="Retain")
    pv = await node.provision(claim(), sc)
    (tmp_path / "base" / pv.name / "data").write_text("kept")
    (due,) = node.provisioner.to_reclaim(in_use=set())  # the claim was never in the store
    await node.provisioner.reclaim(due)
    assert node.provisioner.to_reclaim(in_use=set()) == []
    (released,) = node.recorder.provisioned()
    assert (released.claim_ref, released.claim_uid) == (None, "")
    assert (tmp_path / "base" / pv.name / "data").read_text() == "kept"
    # Released, it binds no claim of the old name any more.
    assert node.provisioner.recorded_for(claim()) is None


# -- the record ------------------------------------------------------------------------------------


async def test_the_record_survives_a_restart(node: Node, tmp_path: Path) -> None:
    sc = storage_class(base=str(tmp_path / "base"))
    pv = await node.provision(claim(uid="u-1"), sc)
    document = json.loads(layout.provisioned_file(node.root).read_text())
    assert document["kind"] == "List"
    assert document["items"][0]["spec"]["claimRef"] == {
        "kind": "PersistentVolumeClaim",
        "namespace": "default",
        "name": "data",
        "uid": "u-1",
    }
    restarted = Node(node.root)
    restarted.recorder.load()
    assert restarted.recorder.provisioned() == (pv,)
    assert restarted.store.get(pv.key) == pv
    assert restarted.provisioner.recorded_for(claim(uid="u-1")) == pv


def test_no_record_yet_loads_nothing(node: Node) -> None:
    node.recorder.load()
    assert node.recorder.provisioned() == ()


# -- binding in the populator ----------------------------------------------------------------------


def pod_using(claim_name: str) -> Pod:
    source = PersistentVolumeClaimVolumeSource(claim_name)
    return Pod(PodUID("uid-1"), "default", "web", V, volumes=(Volume(VolumeName("v"), source),))


def populate(node: Node, *objects: object) -> tuple[Populator, DesiredState]:
    for obj in objects:
        node.store.upsert(obj)  # type: ignore[arg-type]
    desired = DesiredState()
    populator = Populator(store=node.store, desired=desired, provisioner=node.provisioner)
    populator.populate()
    return populator, desired


def test_an_unbound_claim_of_a_provisioned_class_is_collected(node: Node) -> None:
    c, sc = claim(), storage_class()
    populator, desired = populate(node, c, sc, pod_using("data"))
    assert populator.claims_to_provision() == (ClaimToProvision(c, sc),)
    (volume,) = desired.volumes_to_serve()
    assert volume.error == (
        "PVC default/data is not bound to a volume: waiting for fusevol.io/hostpath to provision it"
    )


def test_an_unbound_claim_of_another_class_is_only_reported(node: Node) -> None:
    populator, desired = populate(
        node, claim(), storage_class(provisioner="other.io/x"), pod_using("data")
    )
    assert populator.claims_to_provision() == ()
    assert desired.volumes_to_serve()[0].error == "PVC default/data is not bound to a volume"


@pytest.mark.parametrize(("pv_uid", "bound"), [("", True), ("u-1", True), ("u-0", False)])
def test_a_claim_binds_to_the_volume_pre_bound_to_it(node: Node, pv_uid: str, bound: bool) -> None:
    pv = PersistentVolume(
        "pv-1", V, LocalVolumeSource("/srv/pv-1"), claim_ref=("default", "data"), claim_uid=pv_uid
    )
    populator, desired = populate(node, pv, claim(uid="u-1"), storage_class(), pod_using("data"))
    (volume,) = desired.volumes_to_serve()
    if bound:
        assert (volume.plugin, volume.spec_name, volume.source) == (Plugin.LOCAL, "pv-1", pv.source)
        assert populator.claims_to_provision() == ()
    else:
        assert volume.plugin is None
        assert len(populator.claims_to_provision()) == 1
