"""fusevol.csi.state: the published CSI targets a restarted agent serves again, recorded without
secret material, replaced atomically, readable only by root; a damaged record is ignored."""

from __future__ import annotations

import stat
from typing import TYPE_CHECKING

import pytest

from fusevol.csi import state

if TYPE_CHECKING:
    from pathlib import Path


def test_round_trip_private_file(tmp_path: Path) -> None:
    path = tmp_path / "fusevol" / "csi.json"
    assert state.load(path) == []
    records = [
        state.Record("csi-1", "/k/pods/u/volumes/kubernetes.io~csi/a/mount", {"configMap": "x"}),
        state.Record("csi-2", "/k/pods/u/volumes/kubernetes.io~csi/b/mount", {"secret": "s"}, "7"),
    ]
    state.save(path, records)
    assert state.load(path) == records
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    state.save(path, records[1:])
    assert state.load(path) == records[1:]
    assert sorted(p.name for p in path.parent.iterdir()) == ["csi.json"]  # no temporary left


@pytest.mark.parametrize("text", ["{", '{"published": [{"volumeId": "x"}]}', "[]"])
def test_a_damaged_file_is_ignored(
    tmp_path: Path, text: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "csi.json"
    path.write_text(text)
    assert state.load(path) == []
    assert "published CSI volumes not readable" in caplog.text
    caplog.clear()  # the error line was expected
