"""The manifest source's record of the PersistentVolumes this node provisioned.

With a manifest directory there is no API server to hold the PVs the hostpath provisioner
(`fusevol.provision.hostpath`) creates, so the agent keeps them itself, in its state:
`<root>/fusevol/provisioned.json`, a `kind: List` of PersistentVolume objects as the API would
show them (readable, and parsed back by the manifest parser). It survives restarts, and it is never
written into the user's manifest directory: that directory is the user's input, possibly a
read-only configMap volume, and a file appearing there would be read back as user input.

Every recorded PV is also delivered to the object store, so the populator sees it like any other
PV: a claim binds to the PV whose claimRef names it (the PV controller's pre-bound binding). A
released PV (its claim gone) loses its claimRef, as a source without a `status.phase` can mark it,
so that a new claim of the same name gets a fresh volume; it binds again only to a claim that
names it in `spec.volumeName`.

Writes are atomic (temporary file, fsync, rename) and happen before the store changes, so the file
is never behind what pods were given.

Excludes: deciding what to provision or reclaim (`fusevol.provision`), the manifest directory
(`fusevol.source.local`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from typing import TYPE_CHECKING, Protocol

import trio

from fusevol.base.errors import ManifestError, VolumeSetupError
from fusevol.base.fsutil import replace_file
from fusevol.decode.manifest import parse_manifest
from fusevol.kube.documents import to_document
from fusevol.model import PersistentVolume, ResourceVersion

if TYPE_CHECKING:
    from pathlib import Path

    from fusevol.model import ObjectKey

log = logging.getLogger(__name__)


class VolumeSink(Protocol):
    """Where the recorded PVs are delivered, as a source delivers objects: the agent's object
    store."""

    def upsert(self, obj: PersistentVolume) -> object:
        """Store `obj`, replacing the object with the same key."""

    def delete(self, key: ObjectKey) -> object:
        """Forget the object at `key`; a no-op if there is none."""


class ManifestVolumeRecorder:
    """The `VolumeRecorder` of the manifest source."""

    def __init__(self, *, path: Path, store: VolumeSink) -> None:
        self._path = path
        self._store = store
        self._volumes: dict[str, PersistentVolume] = {}
        self._version = 0

    def load(self) -> None:
        """Read the record (if any) and deliver its PVs to the store; at start-up, before the
        sources. Raises `ManifestError` if the file cannot be read: forgetting what was
        provisioned would leak, or worse, give a claim a second volume."""
        try:
            text = self._path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ManifestError(f"{self._path}: cannot read: {exc.strerror}") from None
        for obj in parse_manifest(text, origin=str(self._path)):
            if isinstance(obj, PersistentVolume):
                self._volumes[obj.name] = obj
                self._store.upsert(obj)
        log.info("provisioned volumes loaded count=%d path=%s", len(self._volumes), self._path)

    def provisioned(self) -> tuple[PersistentVolume, ...]:
        return tuple(self._volumes.values())

    def claim_known(self, key: ObjectKey) -> bool:
        """The manifest directory is read whole: an absent claim is gone."""
        return True

    async def record(self, pv: PersistentVolume) -> None:
        if pv.name in self._volumes:
            return
        await self._put(pv)

    async def release(self, pv: PersistentVolume) -> None:
        current = self._volumes.get(pv.name)
        if current is None or current.claim_ref is None:
            return
        await self._put(dataclasses.replace(current, claim_ref=None, claim_uid=""))

    async def forget(self, pv: PersistentVolume) -> None:
        if pv.name not in self._volumes:
            return
        volumes = {name: v for name, v in self._volumes.items() if name != pv.name}
        await self._save(volumes)
        self._store.delete(pv.key)

    async def _put(self, pv: PersistentVolume) -> None:
        self._version += 1
        pv = dataclasses.replace(pv, resource_version=ResourceVersion(f"p{self._version}"))
        await self._save({**self._volumes, pv.name: pv})
        self._store.upsert(pv)

    async def _save(self, volumes: dict[str, PersistentVolume]) -> None:
        document = {
            "apiVersion": "v1",
            "kind": "List",
            "items": [to_document(pv) for pv in sorted(volumes.values(), key=lambda v: v.name)],
        }
        try:
            text = json.dumps(document, indent=1)
            write = functools.partial(replace_file, self._path, text.encode(), fsync=True)
            await trio.to_thread.run_sync(write)
        except OSError as exc:
            raise VolumeSetupError(
                f"cannot record provisioned volumes in {self._path}: {exc}"
            ) from None
        self._volumes = volumes
