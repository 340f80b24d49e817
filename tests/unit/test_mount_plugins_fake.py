"""The mount-backed plugins (`fusevol.mount.plugins`) over the fake backend: the exact actions,
idempotency and clean-up after a failure, without root. tests/fuse/test_mount_plugins.py checks
the same plugins on real mounts, and the NFS argv through a recording mount(8)."""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

import pytest

from fusevol.base.errors import MountError
from fusevol.decode.manifest import parse_manifest
from fusevol.model import Pod
from fusevol.mount.fake import Action, FakeMountBackend
from fusevol.mount.plugins import MountPlugins
from fusevol.node.layout import Plugin
from fusevol.volumemanager.cache.desired import DesiredState
from fusevol.volumemanager.cache.store import ObjectStore
from fusevol.volumemanager.populator import Populator

if TYPE_CHECKING:
    from pathlib import Path

    from fusevol.volumemanager.cache.desired import VolumeToServe

POD = """\
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: default, uid: 0b8e0c1c-0000-4000-8000-000000000001}
spec:
  containers: [{name: c}]
  volumes:
    - {name: share, nfs: {server: "fd00::1", path: /exports/a, readOnly: true}}
    - {name: scratch, emptyDir: {medium: Memory, sizeLimit: 64Mi}}
"""


def volume(name: str) -> VolumeToServe:
    [pod] = parse_manifest(POD.encode(), origin="pod.yaml")
    assert isinstance(pod, Pod)
    [wanted] = [v for v in pod.volumes if v.name == name]
    return Populator(store=ObjectStore(), desired=DesiredState()).resolve(pod, wanted)


@pytest.fixture
def backend() -> FakeMountBackend:
    return FakeMountBackend()


@pytest.fixture
def plugins(tmp_path: Path, backend: FakeMountBackend) -> MountPlugins:
    return MountPlugins(root=tmp_path, backend=backend)


async def test_nfs_is_mounted_once_with_kubelets_source_and_options(
    plugins: MountPlugins, backend: FakeMountBackend
) -> None:
    target = await plugins.set_up(volume("share"))
    await plugins.set_up(volume("share"))  # idempotent: adopted as it is
    assert backend.actions == [Action("mount", str(target), "[fd00::1]:/exports/a", "nfs", ("ro",))]
    assert target.parts[-2:] == ("kubernetes.io~nfs", "share")
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o750


async def test_a_failed_mount_leaves_no_directory_and_is_retried_from_scratch(
    plugins: MountPlugins, backend: FakeMountBackend
) -> None:
    backend.fail_next = MountError("mount.nfs: Connection timed out")
    with pytest.raises(MountError, match="timed out"):
        await plugins.set_up(volume("share"))
    target = plugins.path(volume("share"))
    assert not target.exists()
    assert backend.actions == []
    await plugins.set_up(volume("share"))
    assert [a.verb for a in backend.actions] == ["mount"]


async def test_memory_empty_dir_is_a_sized_tmpfs(
    plugins: MountPlugins, backend: FakeMountBackend
) -> None:
    target = await plugins.set_up(volume("scratch"))
    assert backend.actions == [Action("mount", str(target), "tmpfs", "tmpfs", ("size=67108864",))]


async def test_tear_down_unmounts_and_removes_once(
    plugins: MountPlugins, backend: FakeMountBackend
) -> None:
    target = await plugins.set_up(volume("share"))
    await plugins.tear_down(Plugin.NFS, target)
    await plugins.tear_down(Plugin.NFS, target)  # idempotent: nothing mounted, nothing there
    assert [a.verb for a in backend.actions] == ["mount", "unmount"]
    assert not target.exists()
    assert backend.mount_points() == ()


async def test_stacked_binds_follow_the_protocol(tmp_path: Path, backend: FakeMountBackend) -> None:
    """The fake keeps the Protocol's rules for binds: a plain bind on a mount point is a no-op, a
    stacked one goes on top unless the top already binds the same source."""
    target = tmp_path / "vol"
    await backend.bind(tmp_path / "a", target, read_only=True)
    await backend.bind(tmp_path / "b", target, read_only=True)  # no-op: a mount point
    await backend.bind(tmp_path / "b", target, read_only=True, stack=True)
    await backend.bind(tmp_path / "b", target, read_only=True, stack=True)  # top binds b: no-op
    assert [(a.verb, a.source) for a in backend.actions] == [
        ("bind", str(tmp_path / "a")),
        ("bind", str(tmp_path / "b")),
    ]
    await backend.unmount(target)  # the whole stack
    assert not backend.is_mount_point(target)
