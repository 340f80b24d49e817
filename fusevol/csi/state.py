"""The published CSI targets, one record per volume in `<root>/fusevol/csi/<volume id>.json`, so
that a restarted agent serves them again: kubelet does not publish again after a driver restart.

Each record is what kubelet sent, minus the secret material: volume id, target path, the volume
context without `csi.storage.k8s.io/serviceAccount.tokens`, and the volume mount group. Tokens
are never written: after a restart they come back with kubelet's next republish. A record is
written atomically (write, rename), mode 0600, in a directory of mode 0700; a volume prepared
before its publish has it written ahead and renamed into place by the publish (`stage`).

One file per volume, as kubelet keeps a `vol_data.json` per CSI volume: a publish writes its own
record and an unpublish removes it, so the publishes of a burst (kubelet makes them at once)
write side by side, each O(1), where one file of every target made each of them rewrite the
whole set, one after the other. Volume ids are kubelet's handles, `csi-<sha256>`
(`attributes.volume_handle`): file names, never paths.

No fsync: a record matters while the node runs. The page cache outlives any crash of the agent,
and a reboot unmounts every target, which kubelet publishes again; a record a crash of the node
cut short is a damaged one, logged and dropped when it is loaded.

Agents before this layout kept every record in one file, `<root>/fusevol/csi.json` (`LEGACY`):
`load` reads it too, and the first `save_all` after it moves its records into the directory.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fusevol.base.fsutil import replace_file, write_aside

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from pathlib import Path

log = logging.getLogger(__name__)

LEGACY = "csi.json"
"""Where earlier agents kept every record, in the directory's parent."""
_NAME = re.compile(r"csi-[0-9a-f]{64}\.json")


@dataclass(frozen=True, slots=True)
class Record:
    volume_id: str
    target_path: str
    attributes: Mapping[str, str]
    volume_mount_group: str = ""


def save(directory: Path, record: Record) -> None:
    """Write `record` as its volume's file (replacing the one it had)."""
    replace_file(_path(directory, record.volume_id), _text(record), mode=0o600)


def stage(directory: Path, record: Record) -> Path:
    """Write `record` beside its volume's file, under a temporary name (which `load` removes):
    `commit` then makes it the volume's record in one rename. A volume prepared before its
    publish has its record staged on the trio thread, and committed in gRPC's thread: one
    system call where each may wait for the GIL, not four."""
    return write_aside(_path(directory, record.volume_id), _text(record), mode=0o600)


def commit(staged: Path, directory: Path, volume_id: str) -> None:
    """Make a `stage`d record its volume's; FileNotFoundError if it is gone."""
    os.replace(staged, _path(directory, volume_id))


def discard(staged: Path) -> None:
    """Remove a `stage`d record never committed; no-op if it is gone."""
    with contextlib.suppress(FileNotFoundError):
        staged.unlink()


def remove(directory: Path, volume_id: str) -> None:
    """Remove the volume's record; no-op if it has none."""
    with contextlib.suppress(FileNotFoundError):
        _path(directory, volume_id).unlink()


def load(directory: Path) -> list[Record]:
    """Every record, the legacy file's too (a volume recorded in both: its own file's). A
    damaged record is logged and left out; so is a volume file that `save` never wrote (a
    name other than a handle's), and a temporary file a crash left behind is removed."""
    records = {r.volume_id: r for r in _load_legacy(directory.parent / LEGACY)}
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        names = []
    for name in names:
        path = directory / name
        if name.startswith(".") and name.endswith(".tmp"):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            continue
        if not _NAME.fullmatch(name):
            log.error("not a CSI volume record, ignored path=%s", path)
            continue
        try:
            record = _record(json.loads(path.read_text()))
            if f"{record.volume_id}.json" != name:
                raise ValueError(f"volume id {record.volume_id!r} is not its file's")
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            log.error("published CSI volume not readable, ignored path=%s error=%s", path, exc)
            continue
        records[record.volume_id] = record
    return list(records.values())


def save_all(directory: Path, records: Iterable[Record]) -> None:
    """Make the directory hold exactly `records` (after a restart: those still served), and
    remove the legacy file."""
    wanted = {r.volume_id: r for r in records}
    for record in wanted.values():
        save(directory, record)
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(directory):
            if _NAME.fullmatch(name) and name.removesuffix(".json") not in wanted:
                remove(directory, name.removesuffix(".json"))
    with contextlib.suppress(FileNotFoundError):
        (directory.parent / LEGACY).unlink()


def _path(directory: Path, volume_id: str) -> Path:
    name = f"{volume_id}.json"
    if not _NAME.fullmatch(name):
        raise ValueError(f"volume id {volume_id!r} is not a CSI volume handle")
    return directory / name


def _text(record: Record) -> bytes:
    return json.dumps(_entry(record), indent=1, sort_keys=True).encode()


def _entry(record: Record) -> dict[str, object]:
    return {
        "volumeId": record.volume_id,
        "targetPath": record.target_path,
        "attributes": dict(record.attributes),
        "volumeMountGroup": record.volume_mount_group,
    }


def _record(entry: dict[str, object]) -> Record:
    attributes = entry["attributes"]
    if not isinstance(attributes, dict):
        raise TypeError("attributes is not a mapping")
    return Record(
        str(entry["volumeId"]),
        str(entry["targetPath"]),
        {str(k): str(v) for k, v in attributes.items()},
        str(entry.get("volumeMountGroup", "")),
    )


def _load_legacy(path: Path) -> list[Record]:
    try:
        raw = json.loads(path.read_text())
        return [_record(entry) for entry in raw["published"]]
    except FileNotFoundError:
        return []
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.error("published CSI volumes not readable, ignored path=%s error=%s", path, exc)
        return []
