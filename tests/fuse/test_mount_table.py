"""The mount table the backend keeps from its own operations agrees with /proc/self/mountinfo,
without reading it per operation (real binds, stacks and unmounts on a private tmpfs)."""

from __future__ import annotations

import collections
import os
import subprocess
from typing import TYPE_CHECKING

import pytest
import trio

from fusevol.mount.linux import LinuxMountBackend
from fusevol.mount.table import MountTable

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from fusevol.mount.mountinfo import MountPoint

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mounts)")


def _key(mp: MountPoint) -> tuple[str, str, str, str, str]:
    return (mp.path, mp.device, mp.root, mp.fstype, "ro" if "ro" in mp.options else "rw")


def below(mounts: tuple[MountPoint, ...], root: Path) -> collections.Counter[tuple[str, ...]]:
    prefix = os.path.join(root, "")
    return collections.Counter(_key(mp) for mp in mounts if mp.path.startswith(prefix))


@pytest.fixture
def base(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs holding a source directory (standing for the FUSE mount) and pod directories."""
    root = tmp_path / "t"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(root)], check=True)
    try:
        yield root
    finally:
        subprocess.run(["umount", "-R", "-l", str(root)], check=False)


def test_the_table_agrees_with_mountinfo_after_binds_stacks_and_unmounts(base: Path) -> None:
    source = base / "src"
    (source / "a").mkdir(parents=True)
    (source / "b").mkdir()
    holder = base / "holder"  # a mount made behind the backend's back, as pyfuse3 makes its own
    holder.mkdir()
    targets = [base / "pods" / f"p{i}" for i in range(20)]
    for target in targets:
        target.mkdir(parents=True)
    backend = LinuxMountBackend(command_timeout_s=10, systemd_run=False)

    async def main() -> None:
        try:
            await check()
        finally:
            backend.close()

    async def check() -> None:
        assert not backend.is_mount_point(targets[0])  # the first question reads the table
        loads = backend.table.loads
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(holder)], check=True)
        (holder / "sub").mkdir()
        # The first bind of a source on an unknown mount reads the table again, once.
        await backend.bind(holder / "sub", targets[0], read_only=True, stack=True)
        assert backend.table.loads == loads + 1
        for target in targets[1:10]:
            await backend.bind(source / "a", target, read_only=True, stack=True)
        for target in targets[10:]:
            await backend.bind(source / "b", target, read_only=False)
        # Stacked: a bind of another subtree on top, and a no-op for the same one again.
        await backend.bind(source / "b", targets[1], read_only=True, stack=True)
        await backend.bind(source / "b", targets[1], read_only=True, stack=True)
        await backend.unmount(targets[2])
        await backend.unmount(targets[1])  # the whole stack
        await backend.unmount(targets[12], force=True)
        assert backend.table.loads == loads + 1  # nothing above read mountinfo
        assert below(backend.table.mounts(), base) == below(MountTable().load(), base)
        assert backend.is_mount_point(targets[3])
        assert not backend.is_mount_point(targets[1])
        assert not backend.is_mount_point(targets[2])
        # A table made wrong behind its back (an unmount by someone else) is read again when the
        # kernel says so, and the unmount is still a no-op.
        subprocess.run(["umount", str(targets[4])], check=True)
        await backend.unmount(targets[4])
        assert not backend.is_mount_point(targets[4])
        assert below(backend.table.mounts(), base) == below(MountTable().load(), base)
        for target in targets:
            await backend.unmount(target)
        await backend.unmount(holder)
        assert below(backend.table.mounts(), base) == below(MountTable().load(), base) == {}

    trio.run(main)
