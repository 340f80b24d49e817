"""fusevol.csi.state: the published CSI targets a restarted agent serves again, a record per
volume, without secret material, written atomically, readable only by root; a damaged record is
ignored alone; the one file of earlier agents is read and moved into the directory."""

from __future__ import annotations

import json
import stat
from typing import TYPE_CHECKING

import pytest

from fusevol.csi import state
from fusevol.csi.attributes import volume_handle

if TYPE_CHECKING:
    from pathlib import Path

ONE = volume_handle("uid-1", "a")
TWO = volume_handle("uid-1", "b")
RECORDS = [
    state.Record(ONE, "/k/pods/uid-1/volumes/kubernetes.io~csi/a/mount", {"configMap": "x"}),
    state.Record(TWO, "/k/pods/uid-1/volumes/kubernetes.io~csi/b/mount", {"secret": "s"}, "7"),
]


def test_a_record_per_volume_private_and_removed_with_its_volume(tmp_path: Path) -> None:
    directory = tmp_path / "fusevol" / "csi"
    assert state.load(directory) == []
    for record in RECORDS:
        state.save(directory, record)
    assert sorted(state.load(directory), key=lambda r: r.volume_id) == sorted(
        RECORDS, key=lambda r: r.volume_id
    )
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir()} == {0o600}
    state.remove(directory, ONE)
    state.remove(directory, ONE)  # again: nothing to do
    assert state.load(directory) == RECORDS[1:]
    assert sorted(p.name for p in directory.iterdir()) == [f"{TWO}.json"]  # no temporary left


def test_a_staged_record_is_no_record_until_committed_and_goes_if_discarded(
    tmp_path: Path,
) -> None:
    """A prepared volume's record is written ahead (private, under a temporary name), becomes
    the volume's in one rename, or goes; one a stop left staged is removed by the next load."""
    directory = tmp_path / "csi"
    staged = state.stage(directory, RECORDS[0])
    assert staged.parent == directory
    assert staged.name.startswith(f".{ONE}.json.")
    assert stat.S_IMODE(staged.stat().st_mode) == 0o600
    assert [p.name for p in directory.iterdir()] == [staged.name]
    state.commit(staged, directory, ONE)
    assert [p.name for p in directory.iterdir()] == [f"{ONE}.json"]
    assert state.load(directory) == RECORDS[:1]
    with pytest.raises(FileNotFoundError):
        state.commit(staged, directory, ONE)  # committed once: gone
    other = state.stage(directory, RECORDS[1])
    state.discard(other)
    state.discard(other)  # again: nothing to do
    left = state.stage(directory, RECORDS[1])  # an agent stopped with it staged
    assert state.load(directory) == RECORDS[:1]
    assert not left.exists()
    assert [p.name for p in directory.iterdir()] == [f"{ONE}.json"]


def test_a_volume_id_that_is_not_a_handle_names_no_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a CSI volume handle"):
        state.save(tmp_path, state.Record("../csi-x", "/t", {}))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "text", ["{", '{"volumeId": "x"}', "[]", '{"volumeId": "csi-0", "targetPath": "/t", '
             '"attributes": {}}']
)  # fmt: skip
def test_a_damaged_record_is_ignored_alone(
    tmp_path: Path, text: str, caplog: pytest.LogCaptureFixture
) -> None:
    state.save(tmp_path, RECORDS[0])
    (tmp_path / f"{TWO}.json").write_text(text)
    assert state.load(tmp_path) == RECORDS[:1]
    assert f"published CSI volume not readable, ignored path={tmp_path / TWO}.json" in caplog.text
    caplog.clear()  # the error line was expected


def test_a_temporary_file_a_crash_left_is_removed_and_a_stranger_left_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / f".{ONE}.json.0123456789abcdef.tmp").write_text("{")
    (tmp_path / "notes.txt").write_text("x")
    assert state.load(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    assert "not a CSI volume record, ignored" in caplog.text
    caplog.clear()  # the error line was expected


def test_the_one_file_of_earlier_agents_is_read_and_moved_into_the_directory(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "csi"
    legacy = tmp_path / state.LEGACY
    entries = [
        {
            "volumeId": r.volume_id,
            "targetPath": r.target_path,
            "attributes": dict(r.attributes),
            "volumeMountGroup": r.volume_mount_group,
        }
        for r in RECORDS
    ]
    legacy.write_text(json.dumps({"published": entries}))
    loaded = state.load(directory)
    assert loaded == RECORDS
    state.save_all(directory, loaded[:1])  # the second was not served again
    assert not legacy.exists()
    assert sorted(p.name for p in directory.iterdir()) == [f"{ONE}.json"]
    assert state.load(directory) == RECORDS[:1]


@pytest.mark.parametrize("text", ["{", '{"published": [{"volumeId": "x"}]}', "[]"])
def test_a_damaged_legacy_file_is_ignored(
    tmp_path: Path, text: str, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / state.LEGACY).write_text(text)
    assert state.load(tmp_path / "csi") == []
    assert "published CSI volumes not readable" in caplog.text
    caplog.clear()  # the error line was expected
