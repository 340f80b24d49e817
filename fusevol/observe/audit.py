"""The audit's records, followed by the agent: the counter of reads, the keys of each audited
volume read and never read (for `fusevol status`), and a copy of each record on the agent's
standard output when asked (`--audit-stdout`), for the node's log collector.

The audit server writes the records (`fusevol.fuse.audit_records`); the agent reads its file as
`tail -F` would, every `POLL_S`: new lines as they come, the rest of a rotated file before the
new one. At its start it reads the last `START_BYTES` of the file: reads before that are not in
`fusevol status`'s lists (the file itself keeps them). The counter and the lists hold names
only, as the records do.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

import trio

from fusevol.fuse.audit_index import directory as index_directory
from fusevol.fuse.audit_records import records_path

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from pathlib import Path

log = logging.getLogger(__name__)

POLL_S = 0.5
START_BYTES = 4 * 1024 * 1024
_LABELS = ("namespace", "pod", "kind", "object", "key")


class AuditFollower:
    def __init__(
        self, root: Path, *, stdout: bool = False, changed: Callable[[], None] = lambda: None
    ) -> None:
        """`changed()`: new records came (the status snapshot is to be written again)."""
        self._changed = changed
        self._root = root
        self._path = records_path(root)
        self._stdout = stdout
        self._counts: Counter[tuple[str, ...]] = Counter()
        self._read: defaultdict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        """(pod uid, volume) -> path -> opens."""
        self._file: Any = None
        self._inode: int | None = None
        self._partial = b""

    def counts(self) -> Iterable[tuple[dict[str, str], float]]:
        """`fusevol_audit_reads_total`'s samples."""
        for labels, count in self._counts.items():
            yield dict(zip(_LABELS, labels, strict=True)), count

    async def run(self) -> None:
        while True:
            lines = await trio.to_thread.run_sync(self._new_lines)
            for line in lines:
                self._take(line)
            if lines:
                self._changed()
            await trio.sleep(POLL_S)

    def _new_lines(self) -> list[bytes]:
        """Complete lines written since the last call (blocking: a worker thread)."""
        chunks = []
        try:
            inode = os.stat(self._path).st_ino
        except FileNotFoundError:
            inode = None
        if self._file is not None and inode != self._inode:
            chunks.append(self._file.read())  # the rest of the rotated file
            self._file.close()
            self._file = None
        if self._file is None and inode is not None:
            with contextlib.suppress(FileNotFoundError):
                first = self._inode is None
                self._file = open(self._path, "rb")  # noqa: SIM115 - kept open, followed
                self._inode = inode
                if first:  # the agent's start: the last START_BYTES only
                    size = os.fstat(self._file.fileno()).st_size
                    if size > START_BYTES:
                        self._file.seek(size - START_BYTES)
                        self._file.readline()  # a partial line
        if self._file is not None:
            chunks.append(self._file.read())
        data = self._partial + b"".join(chunks)
        lines = data.split(b"\n")
        self._partial = lines.pop()
        return [line for line in lines if line]

    def _take(self, line: bytes) -> None:
        try:
            event = json.loads(line)
            pod = event.get("pod") or {}
            volume = event["volume"]
            ref = event.get("objectRef") or {}
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("an audit record could not be read; skipped by the metrics")
            return
        if self._stdout:
            sys.stdout.buffer.write(line + b"\n")
            sys.stdout.flush()
        key = ref.get("key") or volume.get("path") or ""
        labels = (pod.get("namespace"), pod.get("name"), ref.get("kind"), ref.get("name"), key)
        self._counts[tuple(str(v or "") for v in labels)] += 1
        if pod.get("uid") and volume.get("name") and volume.get("path"):
            self._read[(pod["uid"], volume["name"])][volume["path"]] += 1

    def volumes(self) -> list[dict[str, Any]]:
        """Each audited volume on the node: its files read since set-up (with their opens) and
        those never read, for `fusevol status`."""
        found = []
        for index in _indexes(index_directory(self._root)):
            pod = index.get("pod") or {}
            versions = index.get("versions") or {}
            latest = list(versions.values())[-1] if versions else (index.get("pending") or {})
            read = self._read.get((str(pod.get("uid")), str(index.get("volume"))), Counter())
            found.append(
                {
                    "namespace": pod.get("namespace"),
                    "pod": pod.get("name"),
                    "uid": pod.get("uid"),
                    "volume": index.get("volume"),
                    "set_up": index.get("set_up"),
                    "read": dict(sorted(read.items())),
                    "never_read": sorted(path for path in latest if path not in read),
                }
            )
        return sorted(
            found, key=lambda v: (v["namespace"] or "", v["pod"] or "", v["volume"] or "")
        )


def _indexes(directory: Path) -> Iterable[dict[str, Any]]:
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return
    for name in names:
        if name.endswith(".json"):
            with contextlib.suppress(OSError, ValueError):
                index = json.loads((directory / name).read_bytes())
                if isinstance(index, dict):
                    yield index
