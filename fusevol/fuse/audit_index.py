"""What the audit server needs to know of each audited volume, written by the agent and read by
the server: one JSON file a subtree, `<root>/fusevol/audit-index/<subtree name>.json` (0600).

    {"pod": {"namespace", "name", "uid"}, "volume": NAME, "plugin": "secret", "node": NODE,
     "set_up": RFC 3339 time,
     "versions": {VERSION DIR: {PATH: [KIND, NAMESPACE, NAME, RESOURCE VERSION, KEY]}},
     "pending": {PATH: [...]} or null}

Names only (objects, keys, paths), never content. The agent writes the files a version will show
under `pending` before the version is made (`prepare`), and under its directory's name once it is
`..data`'s (`published`); an open of a version the file does not name yet is of the pending one
(one operation a subtree at a time, so there is at most one). The last `KEPT_VERSIONS` versions
are kept: a reader that opened an older one was recorded at its open.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from fusevol.base.fsutil import replace_file
from fusevol.node import layout

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from fusevol.model.audit import Origin

KEPT_VERSIONS = 4


def directory(root: Path) -> Path:
    return layout.agent_dir(root) / "audit-index"


@dataclass(frozen=True, slots=True)
class VolumeFacts:
    """The audited pod volume a subtree is."""

    namespace: str
    pod: str
    uid: str
    volume: str
    plugin: str


class IndexWriter:
    """The agent's side. Blocking file writes: call from a worker thread."""

    def __init__(self, root: Path, *, node_name: str) -> None:
        self._dir = directory(root)
        self._node = node_name
        self._indexes: dict[str, dict[str, Any]] = {}

    @staticmethod
    def listed(root: Path) -> list[bytes]:
        """The subtrees that have an index file (a previous agent's included)."""
        try:
            names = os.listdir(directory(root))
        except FileNotFoundError:
            return []
        return [os.fsencode(n[: -len(".json")]) for n in names if n.endswith(".json")]

    def prepare(
        self, subtree: bytes, facts: VolumeFacts, origins: Mapping[str, Origin], set_up: str
    ) -> None:
        name = os.fsdecode(subtree)
        index = self._indexes.get(name) or self._read(name)
        if index is None or index.get("pod", {}).get("uid") != facts.uid:
            index = {"versions": {}, "set_up": set_up}
        index.update(
            pod={"namespace": facts.namespace, "name": facts.pod, "uid": facts.uid},
            volume=facts.volume,
            plugin=facts.plugin,
            node=self._node,
            pending={path: list(asdict(o).values()) for path, o in origins.items()},
        )
        self._write(name, index)

    def published(self, subtree: bytes, version: bytes | None) -> None:
        name = os.fsdecode(subtree)
        index = self._indexes.get(name)
        if index is None or index.get("pending") is None:
            return
        pending = index.pop("pending")
        index["pending"] = None
        if version is not None:
            versions = index["versions"]
            versions.pop(os.fsdecode(version), None)
            versions[os.fsdecode(version)] = pending
            for old in list(versions)[:-KEPT_VERSIONS]:
                del versions[old]
        self._write(name, index)

    def remove(self, subtree: bytes) -> None:
        name = os.fsdecode(subtree)
        self._indexes.pop(name, None)
        with contextlib.suppress(FileNotFoundError):
            (self._dir / f"{name}.json").unlink()

    def _read(self, name: str) -> dict[str, Any] | None:
        try:
            return json.loads((self._dir / f"{name}.json").read_bytes())  # type: ignore[no-any-return]
        except (OSError, ValueError):
            return None

    def _write(self, name: str, index: dict[str, Any]) -> None:
        self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        replace_file(self._dir / f"{name}.json", json.dumps(index).encode(), mode=0o600)
        self._indexes[name] = index


@dataclass(frozen=True, slots=True)
class Found:
    """An audited volume's facts, as the server reads them for one open."""

    index: Mapping[str, Any]
    origin: list[str] | None


class IndexReader:
    """The server's side. A published version's files never change, so the versions read are
    kept; a subtree's file is read again for a version it did not name (the pending one), and
    for an open whose subtree has no file any more."""

    def __init__(self, root: Path) -> None:
        self._dir = directory(root)
        self._cache: dict[str, dict[str, Any]] = {}

    def audited(self, subtree: bytes) -> bool:
        return (self._dir / f"{os.fsdecode(subtree)}.json").exists()

    def find(self, subtree: bytes, version: bytes, path: str) -> Found | None:
        """The facts of an open of `path` in version directory `version` of `subtree`, or None
        if the subtree is not audited (any more)."""
        name, version_name = os.fsdecode(subtree), os.fsdecode(version)
        index = self._cache.get(name)
        if index is None or version_name not in index["versions"]:
            index = self._load(name)
            if index is None:
                return None
        files = index["versions"].get(version_name)
        if files is None:
            files = index.get("pending") or {}
        return Found(index, files.get(path))

    def _load(self, name: str) -> dict[str, Any] | None:
        try:
            index = json.loads((self._dir / f"{name}.json").read_bytes())
        except FileNotFoundError:
            self._cache.pop(name, None)
            return None
        except (OSError, ValueError):
            return self._cache.get(name)
        self._cache[name] = index
        return index  # type: ignore[no-any-return]
