"""The node side of a hostpath local-PV provisioner: a directory per claim, as a `local` PV.

A PersistentVolumeClaim whose StorageClass names `fusevol.io/hostpath` is provisioned when its
first consumer arrives (WaitForFirstConsumer): the populator sees a pod of this node use the
unbound claim and hands it over (`ClaimToProvision`); the reconciler runs `provision()` as an
operation of its executor (one at a time per claim, kubelet's backoff on failure):

    (1) a PV already recorded for this claim: nothing to do (idempotent);
    (2) describe the PV: `pvc-<claim uid>` (a fresh uuid when the claim has none, or when a
        retained volume holds that name), a `local` source at `<basePath>/<pv name>`, required
        node affinity to this node, the claim's storage request as capacity (recorded, never
        enforced), the class's reclaim policy, a claimRef to the claim;
    (3) create the directory (0777, so that any container user may write);
    (4) have the source record the PV (`VolumeRecorder.record`); if it cannot, the directory
        goes again and the operation fails.
The claim then binds to the PV (the populator's pre-bound match, or the API's binding), and pods
get it through the ordinary local-PV bind mount.

Reclaiming (`to_reclaim`, `reclaim`), once every source has been read: a recorded PV whose claim is
gone is released (`VolumeRecorder.release`: no new claim of that name binds to it); with policy
Delete, once no pod of this node uses it, its directory is removed and its record forgotten; with
Retain, the directory and the record stay.

The core knows nothing of where PVs are recorded: that is the source's job, behind
`VolumeRecorder`. The manifest source keeps them in the agent's state
(`fusevol.provision.record`); the Kubernetes API source creates the PV object (with the
claimRef, the `pv.kubernetes.io/provisioned-by` annotation and the node affinity `describe()`
gives), lets the PV controller bind the claim, and deletes the object on `forget`.

Excludes: the bind mount (`fusevol.mount.plugins`), the choice of claims
(`fusevol.volumemanager.populator`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import trio

from fusevol.base.errors import VolumeSetupError
from fusevol.base.fsutil import mkdir_all
from fusevol.model import (
    Kind,
    LocalVolumeSource,
    ObjectKey,
    PersistentVolume,
    PersistentVolumeClaim,
    ResourceVersion,
    StorageClass,
)
from fusevol.node import layout

if TYPE_CHECKING:
    from collections.abc import Set

log = logging.getLogger(__name__)

PROVISIONER = "fusevol.io/hostpath"
"""The name StorageClasses give in `provisioner` to have their claims provisioned here."""
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
"""The annotation every dynamically provisioned PV carries (external-provisioner's)."""
SELECTED_NODE = "volume.kubernetes.io/selected-node"
"""The scheduler's choice for a WaitForFirstConsumer claim; another node's claim is not ours."""
DIRECTORY_MODE = 0o777


@dataclass(frozen=True, slots=True)
class ClaimToProvision:
    """An unbound claim that a pod of this node uses, of a class provisioned here."""

    claim: PersistentVolumeClaim
    storage_class: StorageClass


class Claims(Protocol):
    """What the provisioner reads claims from: the agent's object store."""

    def get(
        self, key: ObjectKey, kind: type[PersistentVolumeClaim]
    ) -> PersistentVolumeClaim | None:
        """The claim at `key`, or None if there is none."""


class VolumeRecorder(Protocol):
    """Where provisioned PersistentVolumes live: the source's job. Trio thread only."""

    def provisioned(self) -> tuple[PersistentVolume, ...]:
        """Every PV provisioned by this node whose record exists, bound or released."""

    async def record(self, pv: PersistentVolume) -> None:
        """Make `pv` exist, pre-bound to its claim (`claim_ref`, `claim_uid`), so that the claim
        binds to it; once this returns, `provisioned()` includes it. No-op if it is recorded
        already. Raises `FusevolError` if it cannot be recorded."""

    async def release(self, pv: PersistentVolume) -> None:
        """Its claim is gone: no new claim of that name may bind to it. No-op if done already."""

    async def forget(self, pv: PersistentVolume) -> None:
        """Delete the record of `pv`. No-op if there is none."""

    def claim_known(self, key: ObjectKey) -> bool:
        """The source has read claim `key` since it began tracking it, so the store's copy, or
        its absence, is the truth: a claim whose watch is (re)opening is not gone."""


class HostPathProvisioner:
    def __init__(
        self, *, root: Path, node_name: str, store: Claims, recorder: VolumeRecorder
    ) -> None:
        self._root = root
        self._node_name = node_name
        self._store = store
        self._recorder = recorder
        self._released: set[str] = set()

    def wants(self, claim: PersistentVolumeClaim, storage_class: StorageClass) -> bool:
        """True if this node is to provision `claim` of `storage_class` for one of its pods."""
        selected = claim.annotations.get(SELECTED_NODE, "")
        return storage_class.provisioner == PROVISIONER and selected in ("", self._node_name)

    def selected_here(self, claim: PersistentVolumeClaim) -> bool:
        """The scheduler chose this node for `claim`'s first consumer (WaitForFirstConsumer): the
        pod gets its node once the claim is bound, so it is provisioned without waiting for it."""
        return claim.annotations.get(SELECTED_NODE) == self._node_name

    def describe(self, request: ClaimToProvision) -> PersistentVolume:
        """(2) The PV for `request`; no side effect."""
        claim, storage_class = request.claim, request.storage_class
        taken = {pv.name for pv in self._recorder.provisioned()}
        name = f"pvc-{claim.uid}" if claim.uid else ""
        if not name or name in taken:
            name = f"pvc-{uuid.uuid4()}"
        return PersistentVolume(
            name,
            ResourceVersion(""),
            LocalVolumeSource(str(self.base_path(storage_class) / name)),
            annotations={PROVISIONED_BY: PROVISIONER},
            claim_ref=(claim.namespace, claim.name),
            storage_class_name=storage_class.name,
            node_names=(self._node_name,),
            claim_uid=claim.uid,
            reclaim_policy=storage_class.reclaim_policy,
            capacity=claim.storage_request,
        )

    def base_path(self, storage_class: StorageClass) -> Path:
        """The class's `basePath` parameter, else `<root>/fusevol/hostpath`."""
        base = storage_class.parameters.get("basePath", "")
        if not base:
            return layout.default_provisioning_base(self._root)
        if not base.startswith("/") or ".." in base.split("/"):
            raise VolumeSetupError(
                f"storageclass {storage_class.name}: basePath {base!r} must be an absolute path "
                "without '..'"
            )
        return Path(base)

    async def provision(self, request: ClaimToProvision) -> None:
        """Steps (1)-(4) of the module docstring."""
        claim = request.claim
        if self.recorded_for(claim) is not None:  # (1)
            return
        pv = self.describe(request)  # (2)
        assert isinstance(pv.source, LocalVolumeSource)
        path = Path(pv.source.path)
        await trio.to_thread.run_sync(_make_directory, path)  # (3)
        try:
            await self._recorder.record(pv)  # (4)
        except BaseException:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(_remove_directory, path)
            raise
        log.info(
            "volume provisioned pv=%s claim=%s/%s path=%s capacity=%s reclaim=%s",
            pv.name,
            claim.namespace,
            claim.name,
            path,
            pv.capacity or "-",
            pv.reclaim_policy,
        )

    def recorded_for(self, claim: PersistentVolumeClaim) -> PersistentVolume | None:
        for pv in self._recorder.provisioned():
            if _binds(pv, claim):
                return pv
        return None

    def to_reclaim(
        self, *, in_use: Set[str], claims_in_use: Set[tuple[str, str]] = frozenset()
    ) -> list[PersistentVolume]:
        """Recorded PVs whose claim is gone and that are not dealt with yet: to release, and for
        policy Delete, to delete once no pod of this node uses them: neither by PV name
        (`in_use`) nor by naming their claim, (namespace, name) in `claims_in_use` (what the
        `pvc-protection` finalizer guarantees: no data goes while a pod may still use it)."""
        due = []
        for pv in self._recorder.provisioned():
            if not self._claim_gone(pv):
                continue
            if pv.reclaim_policy == "Delete":
                if pv.name not in in_use and pv.claim_ref not in claims_in_use:
                    due.append(pv)
            elif pv.name not in self._released:
                due.append(pv)
        return due

    async def reclaim(self, pv: PersistentVolume) -> None:
        """Release `pv`; with policy Delete, remove its directory, then its record. Idempotent."""
        await self._recorder.release(pv)
        self._released.add(pv.name)
        if pv.reclaim_policy != "Delete":
            log.info("volume released, retained pv=%s policy=%s", pv.name, pv.reclaim_policy)
            return
        if isinstance(pv.source, LocalVolumeSource):
            await trio.to_thread.run_sync(_remove_tree, Path(pv.source.path))
        await self._recorder.forget(pv)
        self._released.discard(pv.name)
        log.info("volume deleted pv=%s", pv.name)

    def _claim_gone(self, pv: PersistentVolume) -> bool:
        if pv.claim_ref is None:
            return True
        key = ObjectKey(Kind.PERSISTENT_VOLUME_CLAIM, *pv.claim_ref)
        if not self._recorder.claim_known(key):
            return False
        claim = self._store.get(key, PersistentVolumeClaim)
        return claim is None or not _binds(pv, claim)


def _binds(pv: PersistentVolume, claim: PersistentVolumeClaim) -> bool:
    """`pv` is pre-bound to `claim`: its claimRef names it (and its uid, when it has one)."""
    return pv.claim_ref == (claim.namespace, claim.name) and pv.claim_uid in ("", claim.uid)


def _make_directory(path: Path) -> None:
    mkdir_all(path.parent, 0o755)
    try:
        os.mkdir(path, DIRECTORY_MODE)
    except FileExistsError:
        if not path.is_dir():
            raise VolumeSetupError(f"{path} exists and is not a directory") from None
    except OSError as exc:
        raise VolumeSetupError(f"cannot create {path}: {exc.strerror}") from None
    os.chmod(path, DIRECTORY_MODE)  # umask-proof


def _remove_directory(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.rmdir(path)


def _remove_tree(path: Path) -> None:
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise VolumeSetupError(f"cannot delete {path}: {exc.strerror}") from None
