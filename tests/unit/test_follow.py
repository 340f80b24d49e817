"""The follow file system's handlers (fusevol.fuse.follow), awaited directly on a real directory
laid out as a served pod volume: `key -> ..data/key`, `..data -> ..<version>`."""

from __future__ import annotations

import errno
import os
import stat
from typing import TYPE_CHECKING, Any

import pyfuse3
import pytest

from fusevol.fuse.follow import FollowOperations

if TYPE_CHECKING:
    from pathlib import Path

CTX: Any = None  # the handlers never look at the request context


def _version(volume: Path, name: str, files: dict[str, str]) -> None:
    for path, text in files.items():
        (volume / name / path).parent.mkdir(parents=True, exist_ok=True)
        (volume / name / path).write_text(text)
    os.symlink(name, volume / "..data_tmp")
    os.rename(volume / "..data_tmp", volume / "..data")


@pytest.fixture
def pods(tmp_path: Path) -> Path:
    volume = tmp_path / "pods" / "u1" / "volumes" / "kubernetes.io~configmap" / "config"
    volume.mkdir(parents=True)
    _version(volume, "..v1", {"key": "one, long version", "conf/a.conf": "a1"})
    (volume / "key").symlink_to("..data/key")
    (volume / "conf").symlink_to("..data/conf")
    (tmp_path / "pods" / "u1" / "volumes" / "kubernetes.io~empty-dir" / "scratch").mkdir(
        parents=True
    )
    return tmp_path / "pods"


async def _walk(ops: FollowOperations, *names: str) -> int:
    inode = pyfuse3.ROOT_INODE
    for name in names:
        inode = (await ops.lookup(inode, name.encode(), CTX)).st_ino
    return inode


async def test_an_open_keeps_its_version_and_the_next_open_follows(pods: Path) -> None:
    ops = FollowOperations(pods)
    key = await _walk(ops, "u1", "kubernetes.io~configmap", "config", "key")
    held = await ops.open(key, os.O_RDONLY, CTX)
    assert held.direct_io
    assert await ops.read(held.fh, 0, 4) == b"one,"
    volume = pods / "u1" / "volumes" / "kubernetes.io~configmap" / "config"
    _version(volume, "..v2", {"key": "two", "conf/a.conf": "a2"})
    assert await ops.read(held.fh, 4, 100) == b" long version"
    fresh = await ops.open(key, os.O_RDONLY, CTX)
    assert await ops.read(fresh.fh, 0, 100) == b"two"
    assert (await ops.getattr(key, CTX)).st_size == 3
    # The same path keeps its inode number; a nested directory's entries follow too.
    assert await _walk(ops, "u1", "kubernetes.io~configmap", "config", "key") == key
    conf = await _walk(ops, "u1", "kubernetes.io~configmap", "config", "conf", "a.conf")
    opened = await ops.open(conf, os.O_RDONLY, CTX)
    assert await ops.read(opened.fh, 0, 10) == b"a2"
    for handle in (held, fresh, opened):
        await ops.release(handle.fh)


async def test_only_served_volumes_are_reachable_read_only_and_root_alone_above_them(
    pods: Path,
) -> None:
    ops = FollowOperations(pods)
    uid = await _walk(ops, "u1")
    for name in (b"kubernetes.io~empty-dir", b"..", b".", b"nope"):
        with pytest.raises(pyfuse3.FUSEError) as caught:
            await ops.lookup(uid, name, CTX)
        assert caught.value.errno == errno.ENOENT, name
    with pytest.raises(pyfuse3.FUSEError) as caught:
        await ops.lookup(pyfuse3.ROOT_INODE, b"u2", CTX)
    assert caught.value.errno == errno.ENOENT
    assert stat.S_IMODE((await ops.getattr(uid, CTX)).st_mode) == 0o700
    key = await _walk(ops, "u1", "kubernetes.io~configmap", "config", "key")
    for flags in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC):
        with pytest.raises(pyfuse3.FUSEError) as caught:
            await ops.open(key, flags, CTX)
        assert caught.value.errno == errno.EROFS
    with pytest.raises(pyfuse3.FUSEError) as caught:
        await ops.write(0, 0, b"x")
    assert caught.value.errno == errno.EROFS


async def test_a_failed_lookup_numbers_no_inode(pods: Path) -> None:
    ops = FollowOperations(pods)
    config = await _walk(ops, "u1", "kubernetes.io~configmap", "config")
    for i in range(50):
        with pytest.raises(pyfuse3.FUSEError):
            await ops.lookup(config, f"absent-{i}".encode(), CTX)
    key = await _walk(ops, "u1", "kubernetes.io~configmap", "config", "key")
    assert key == config + 1
