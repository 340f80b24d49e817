"""Frozen volumes found from mountinfo alone (`fusevol.mount.frozen`), on a /proc laid out as the
kernel lays it out: the node's mount table, and one process of each container's mount namespace
with its own mount table and cgroup."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from fusevol.model import PodUID
from fusevol.mount import frozen
from fusevol.mount.frozen import FrozenVolume

if TYPE_CHECKING:
    from pathlib import Path

UID = PodUID("11111111-2222-4333-8444-555555555555")
OTHER = PodUID("99999999-2222-4333-8444-555555555555")
SERVING, DEAD = "0:61", "0:58"
ROOT = "/var/lib/fusevol"
TARGET = f"/var/lib/kubelet/pods/{UID}/volumes/kubernetes.io~csi/config/mount"
BELOW = [f"{ROOT}/pods", "/var/lib/kubelet/pods"]
MOUNTPOINT = f"{ROOT}/fusevol/mnt"
"""The agent's own mount: the connection it serves (SERVING)."""


def line(mount_id: int, parent: int, device: str, root: str, path: str, fstype: str) -> str:
    return f"{mount_id} {parent} {device} {root} {path} ro,relatime shared:1 - {fstype} src rw\n"


def fuse(mount_id: int, parent: int, device: str, root: str, path: str) -> str:
    return line(mount_id, parent, device, root, path, "fuse.fusevol")


def process(proc: Path, pid: str, namespace: str, mounts: list[str], cgroup: str = "") -> None:
    (proc / pid / "ns").mkdir(parents=True)
    os.symlink(f"mnt:[{namespace}]", proc / pid / "ns" / "mnt")
    (proc / pid / "mountinfo").write_text("".join(mounts))
    (proc / pid / "cgroup").write_text(cgroup)


def node(proc: Path, mounts: list[str]) -> None:
    process(proc, "1", "4026531840", mounts)
    os.symlink("1", proc / "self")


NODE_MOUNTS = [
    line(1, 0, "8:1", "/", "/", "ext4"),
    fuse(50, 1, SERVING, "/", MOUNTPOINT),
    fuse(40, 1, DEAD, "/shared-3f2a", TARGET),  # a CSI target: the old connection's bind
    fuse(51, 40, SERVING, "/shared-3f2a", TARGET),  # the fresh bind stacked on it
    fuse(41, 1, DEAD, f"/{OTHER}_creds", f"{ROOT}/pods/{OTHER}/volumes/kubernetes.io~secret/creds"),
    # Another agent's, on another root: its own connection, not ours to judge.
    fuse(60, 1, "0:70", f"/{OTHER}_x", f"/srv/other/pods/{OTHER}/volumes/kubernetes.io~secret/x"),
]


def test_no_stale_bind_no_search(tmp_path: Path) -> None:
    node(tmp_path, NODE_MOUNTS[:2])
    assert frozen.find(MOUNTPOINT, BELOW, proc=str(tmp_path)) == []
    assert frozen.device_of(MOUNTPOINT, proc=str(tmp_path)) == SERVING
    assert frozen.find("/not/mounted", BELOW, proc=str(tmp_path)) is None


def test_containers_reading_a_stale_bind_are_counted_by_their_pod(tmp_path: Path) -> None:
    node(tmp_path, NODE_MOUNTS)
    pod_cgroup = f"0::/kubepods.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice/cri-x\n"
    # A container of the pod, private copy of the old bind: frozen.
    private = [fuse(7, 1, DEAD, "/shared-3f2a", "/etc/config")]
    process(tmp_path, "200", "4026532001", private, pod_cgroup)
    # Another of its containers, rslave: it received the fresh bind over the old one.
    process(
        tmp_path,
        "300",
        "4026532002",
        [
            fuse(7, 1, DEAD, "/shared-3f2a", "/etc/config"),
            fuse(9, 7, SERVING, "/shared-3f2a", "/etc/config"),
        ],
        pod_cgroup,
    )
    # A container of another pod sharing the subtree (same content): not this pod's volume.
    other_cgroup = f"0::/kubepods/besteffort/pod{OTHER}/abc\n"
    process(tmp_path, "400", "4026532003", [fuse(7, 1, DEAD, "/shared-3f2a", "/x")], other_cgroup)
    # A second process of the first container's namespace: counted once.
    process(tmp_path, "201", "4026532001", private, pod_cgroup)
    assert frozen.find(MOUNTPOINT, BELOW, proc=str(tmp_path)) == [
        FrozenVolume(UID, "config", TARGET, DEAD, containers=1),
        FrozenVolume(
            OTHER, "creds", f"{ROOT}/pods/{OTHER}/volumes/kubernetes.io~secret/creds", DEAD, 0
        ),
    ]


def test_a_private_copy_of_the_nodes_table_is_no_container(tmp_path: Path) -> None:
    """A build tool's or an `unshare -m` shell's namespace, copied from the node's before the
    restart and private since: it shows the stale binds where the node does, and reads none."""
    node(tmp_path, NODE_MOUNTS)
    process(tmp_path, "500", "4026532009", NODE_MOUNTS[:3] + NODE_MOUNTS[4:])
    found = frozen.find(MOUNTPOINT, BELOW, proc=str(tmp_path))
    assert found is not None
    assert [(f.volume, f.containers) for f in found] == [("config", 0), ("creds", 0)]


def test_without_other_namespaces_every_stale_bind_may_be_frozen(tmp_path: Path) -> None:
    """An agent in a pod of its own PID namespace sees no container: it cannot count them."""
    node(tmp_path, NODE_MOUNTS)
    found = frozen.find(MOUNTPOINT, BELOW, proc=str(tmp_path))
    assert found is not None
    assert [(f.uid, f.volume, f.containers) for f in found] == [
        (UID, "config", None),
        (OTHER, "creds", None),
    ]


def test_a_process_gone_meanwhile_is_skipped(tmp_path: Path) -> None:
    node(tmp_path, NODE_MOUNTS)
    process(tmp_path, "200", "4026532001", [])
    (tmp_path / "200" / "mountinfo").unlink()
    found = frozen.find(MOUNTPOINT, BELOW, proc=str(tmp_path))
    assert found is not None
    assert [f.containers for f in found] == [0, 0]
