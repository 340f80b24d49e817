"""`fusevol.base.fsutil.mkdir_all`: Go's `os.MkdirAll`, the way kubelet makes pod directories."""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

import pytest

from fusevol.base.fsutil import mkdir_all, unlink_if_same

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@pytest.fixture(autouse=True)
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_every_directory_it_makes_gets_the_mode(tmp_path: Path) -> None:
    leaf = tmp_path / "pods" / "uid" / "volumes" / "kubernetes.io~configmap" / "config"
    mkdir_all(leaf, 0o750)
    for directory in (leaf, *list(leaf.parents)[:4]):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o750, directory
    assert stat.S_IMODE(tmp_path.stat().st_mode) != 0o750  # what existed is left alone


def test_an_existing_directory_is_fine_and_kept(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir(mode=0o700)
    mkdir_all(tmp_path / "a", 0o750)
    mkdir_all(str(tmp_path / "a" / "b"), 0o755)  # a str, as the mount backend passes it
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == 0o755


@pytest.mark.parametrize("where", ["leaf", "parent"])
def test_a_file_in_the_way_is_an_error(tmp_path: Path, where: str) -> None:
    (tmp_path / "f").write_text("")
    path = tmp_path / "f" if where == "leaf" else tmp_path / "f" / "x" / "y"
    with pytest.raises((FileExistsError, NotADirectoryError)):
        mkdir_all(path, 0o750)


def test_unlink_if_same_removes_only_the_file_it_names(tmp_path: Path) -> None:
    path, successor = tmp_path / "sock", tmp_path / "successor"
    path.write_text("ours")
    successor.write_text("a successor's")  # both exist at once: two inodes
    ours = os.lstat(path).st_ino
    os.replace(successor, path)  # a successor's file now stands at the name
    unlink_if_same(path, ours)
    assert path.read_text() == "a successor's"
    unlink_if_same(path, os.lstat(path).st_ino)
    assert not path.exists()
    unlink_if_same(path, ours)  # gone: nothing to do
