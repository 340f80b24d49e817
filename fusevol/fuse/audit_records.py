"""The audit's records: one JSON line for each open of an audited file, in the style of the
Kubernetes audit log, written by the audit server to `<root>/fusevol/audit.jsonl` (0600, rotated
at `MAX_BYTES` with `BACKUPS` older files: `audit.jsonl.1`, ...). No content, ever: the object,
the key, the path and who opened it.

    {"kind": "Event", "apiVersion": "audit.fusevol.io/v1", "level": "Metadata",
     "auditID": UUID, "stage": "ResponseComplete", "verb": "open",
     "requestReceivedTimestamp": "2026-11-29T16:14:41.123456Z", "node": NODE,
     "reader": {"where": "container" | "host" | "unknown", "pid", "uid", "gid", "command",
                "executable", "container": {"id", "name"}, "pod": {"namespace", "name", "uid"}},
     "pod": {"namespace", "name", "uid"},          the pod whose volume it is
     "volume": {"name", "plugin", "path", "version"},
     "objectRef": {"kind", "namespace", "name", "resourceVersion", "key"} | null}

`reader.pid` is the process (thread group) as the audit server's PID namespace sees it (the host's,
in the chart); `reader.executable` is its executable's path as its own mount namespace sees it
(a container's `/bin/busybox`); `uid` and `gid` are the open's file system ids.

The unit is the open: a file's content is read only through an open file description, and the
audit server answers every open of an audited file itself (it never lets the kernel open one
without asking), whatever the reader does next (read, mmap, sendfile, hold it across updates:
its open pinned one version, the one recorded).
"""

from __future__ import annotations

import datetime
import json
import logging
import logging.handlers
import uuid
from typing import TYPE_CHECKING, Any

from fusevol.node import layout

if TYPE_CHECKING:
    from pathlib import Path

    from fusevol.fuse.audit_index import Found

MAX_BYTES = 64 * 1024 * 1024
BACKUPS = 4
API_VERSION = "audit.fusevol.io/v1"
_OBJECT_REF = ("kind", "namespace", "name", "resourceVersion", "key")


def records_path(root: Path) -> Path:
    return layout.agent_dir(root) / "audit.jsonl"


def record(
    *,
    reader: dict[str, Any],
    found: Found | None,
    version: str,
    path: str,
    received: datetime.datetime,
) -> dict[str, Any]:
    """The record of one open of `path` in version directory `version` (`found`: the audit
    index's facts of the volume, None if it had none)."""
    index = found.index if found is not None else {}
    origin = found.origin if found is not None else None
    return {
        "kind": "Event",
        "apiVersion": API_VERSION,
        "level": "Metadata",
        "auditID": str(uuid.uuid4()),
        "stage": "ResponseComplete",
        "verb": "open",
        "requestReceivedTimestamp": received.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "node": index.get("node"),
        "reader": reader,
        "pod": index.get("pod"),
        "volume": {
            "name": index.get("volume"),
            "plugin": index.get("plugin"),
            "path": path,
            "version": version,
        },
        "objectRef": None if origin is None else dict(zip(_OBJECT_REF, origin, strict=True)),
    }


class RecordFile:
    """Appends records, one line each, flushed at once; rotates by size."""

    def __init__(self, path: Path) -> None:
        self._log = logging.getLogger(f"fusevol.audit.records.{id(self)}")
        self._log.propagate = False
        self._log.setLevel(logging.INFO)
        handler = logging.handlers.RotatingFileHandler(
            path, maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8"
        )
        handler.setFormatter(logging.Formatter("%(message)s"))
        self._log.addHandler(handler)

    def write(self, event: dict[str, Any]) -> None:
        self._log.info("%s", json.dumps(event, separators=(",", ":")))

    def close(self) -> None:
        for handler in self._log.handlers:
            handler.close()
            self._log.removeHandler(handler)


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)
