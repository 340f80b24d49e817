"""The mount helper's answers: a failed call says which path failed (a bind has two)."""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING

import pytest

from fusevol.mount.mount_helper import answer

if TYPE_CHECKING:
    from pathlib import Path


@pytest.mark.parametrize("missing", ["source", "target"])
def test_a_bind_whose_path_is_missing_names_that_path(tmp_path: Path, missing: str) -> None:
    paths = {"source": tmp_path / "source", "target": tmp_path / "target"}
    for name, path in paths.items():
        if name != missing:
            path.mkdir()
    source, target = paths["source"], paths["target"]
    [(code, reason)] = answer([["bind", str(source), str(target), True, True, None, None]])
    assert code == errno.ENOENT
    assert reason == f"No such file or directory ({paths[missing]})"
