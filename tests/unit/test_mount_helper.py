"""The mount helper's answers: a failed call says which path failed (a bind has two)."""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING

from fusevol.mount.mount_helper import answer

if TYPE_CHECKING:
    from pathlib import Path


def test_a_bind_whose_source_is_missing_names_the_source(tmp_path: Path) -> None:
    source, target = tmp_path / "gone", tmp_path / "target"
    target.mkdir()
    [(code, reason)] = answer([["bind", str(source), str(target), True, True, None, None]])
    assert code == errno.ENOENT
    assert reason == f"No such file or directory ({source})"


def test_a_bind_whose_target_is_missing_names_the_target(tmp_path: Path) -> None:
    source, target = tmp_path / "source", tmp_path / "gone"
    source.mkdir()
    [(code, reason)] = answer([["bind", str(source), str(target), True, True, None, None]])
    assert code == errno.ENOENT
    assert reason == f"No such file or directory ({target})"
