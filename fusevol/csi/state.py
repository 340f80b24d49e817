"""The published CSI targets, recorded in `<root>/fusevol/csi.json` so that a restarted agent
serves them again: kubelet does not publish again after a driver restart.

Each record is what kubelet sent, minus the secret material: volume id, target path, the volume
context without `csi.storage.k8s.io/serviceAccount.tokens`, and the volume mount group. Tokens
are never written: after a restart they come back with kubelet's next republish. The file is
replaced atomically (write, fsync, rename), mode 0600.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fusevol.base.fsutil import replace_file

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Record:
    volume_id: str
    target_path: str
    attributes: Mapping[str, str]
    volume_mount_group: str = ""


def load(path: Path) -> list[Record]:
    """The records of `path`; none if it does not exist. A damaged file is logged and ignored."""
    try:
        raw = json.loads(path.read_text())
        return [
            Record(
                str(entry["volumeId"]),
                str(entry["targetPath"]),
                {str(k): str(v) for k, v in entry["attributes"].items()},
                str(entry.get("volumeMountGroup", "")),
            )
            for entry in raw["published"]
        ]
    except FileNotFoundError:
        return []
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.error("published CSI volumes not readable, ignored path=%s error=%s", path, exc)
        return []


def save(path: Path, records: Iterable[Record]) -> None:
    data = {
        "published": [
            {
                "volumeId": r.volume_id,
                "targetPath": r.target_path,
                "attributes": dict(r.attributes),
                "volumeMountGroup": r.volume_mount_group,
            }
            for r in records
        ]
    }
    text = json.dumps(data, indent=1, sort_keys=True)
    replace_file(path, text.encode(), mode=0o600, fsync=True)
