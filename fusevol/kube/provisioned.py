"""KubeVolumeRecorder: the PersistentVolumes this node provisioned, as API objects.

The Kubernetes API source's `VolumeRecorder` (`fusevol.provision.hostpath`), as a node-local
external-provisioner would do it:

- `record` creates the PV the core describes (a `local` PV, required node affinity to this node,
  claimRef to the claim with its uid, reclaim policy, capacity, the
  `pv.kubernetes.io/provisioned-by` annotation), labelled `fusevol.io/node=<node>` so that this
  node lists only its own. Nothing else: kube-controller-manager's PV controller binds the claim to
  a PV pre-bound by claimRef (`spec.volumeName`, both `Bound`), and the claim's watch brings that
  to the node like any other binding. An AlreadyExists (a restart between the create and its
  answer, or a list not caught up) is fine: the existing PV is read back and kept, if it is ours.
- `provisioned` answers from a mirror: one list+watch of PVs with that label (a `Reflector`),
  keeping those whose annotation and node affinity say this node provisioned them. The source
  waits for its first list before it reports synced, so nothing is reclaimed from a half-read
  world; `record` and `forget` update the mirror at once with what the API answered.
- `release` is a no-op: the PV controller marks the PV `Released` when its claim goes.
- `forget` deletes the PV (absent already is fine).

The claims of these PVs must stay known while the PVs exist, even when no pod of this node uses
them (the core reclaims a PV whose claim is gone): the source tracks them, `claim_keys()`.

Excludes: what is provisioned and when (`fusevol.provision`), the directory, tracking the claims
(`source`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from fusevol.kube.documents import convert, to_document
from fusevol.kube.errors import ApiError
from fusevol.kube.query import Callbacks, Query
from fusevol.kube.reflector import Reflector
from fusevol.model import Kind, ObjectKey, PersistentVolume

if TYPE_CHECKING:
    from collections.abc import Callable

    from fusevol.kube.client import KubeClient, Obj
    from fusevol.kube.flag import Flag
    from fusevol.kube.listing import Items

log = logging.getLogger(__name__)

NODE_LABEL = "fusevol.io/node"
"""On every PV this agent creates: the node that provisioned it (and holds its directory)."""
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"


class KubeVolumeRecorder:
    def __init__(
        self,
        *,
        client: KubeClient,
        node_name: str,
        provisioner: str,
    ) -> None:
        """`provisioner`: the `provisioned-by` annotation value of the PVs kept."""
        self._client = client
        self._node_name = node_name
        self._provisioner = provisioner
        self._origin = client.host
        self._volumes: dict[str, PersistentVolume] = {}
        self._recording: dict[str, ObjectKey] = {}
        """PV name -> its claim, while `record` creates it: the claim stays tracked meanwhile."""
        self._claim_read: Callable[[ObjectKey], bool] = lambda key: False
        self._on_change: Callable[[], None] = lambda: None
        self.reflector = Reflector(
            client=client,
            query=Query(Kind.PERSISTENT_VOLUME, None, "", f"{NODE_LABEL}={node_name}"),
            handler=Callbacks(self._replace, self._event),
        )

    @property
    def synced(self) -> Flag:
        """Set after the first complete list."""
        return self.reflector.synced

    async def run(
        self, *, claim_read: Callable[[ObjectKey], bool], on_change: Callable[[], None]
    ) -> None:
        """Mirror this node's PVs until cancelled, for the source that tracks their claims:
        `claim_read(key)` says whether it has read claim `key` since it began tracking it;
        `on_change()` is called when the recorded PVs (or their claims) changed."""
        self._claim_read, self._on_change = claim_read, on_change
        await self.reflector.run()

    def claim_keys(self) -> set[ObjectKey]:
        """The claims the recorded PVs (and those being created) are pre-bound or bound to.

        A claim being provisioned stays here from before its PV's create until the PV is in the
        mirror: the PV controller may bind the claim before the create answers, and the claims'
        watch may say so before the PVs' watch brings the PV; were the claim tracked by nothing
        for that moment, its watch would close and reopen and the claim leave the store."""
        return set(self._recording.values()) | {
            ObjectKey(Kind.PERSISTENT_VOLUME_CLAIM, *pv.claim_ref)
            for pv in self._volumes.values()
            if pv.claim_ref is not None
        }

    def claim_known(self, key: ObjectKey) -> bool:
        return self._claim_read(key)

    # -- VolumeRecorder ----------------------------------------------------------------------------

    def provisioned(self) -> tuple[PersistentVolume, ...]:
        return tuple(self._volumes.values())

    async def record(self, pv: PersistentVolume) -> None:
        if pv.name in self._volumes:
            return
        document = to_document(pv)
        del document["metadata"]["resourceVersion"]
        document["metadata"]["labels"] = {NODE_LABEL: self._node_name}
        if pv.claim_ref is not None:
            self._recording[pv.name] = ObjectKey(Kind.PERSISTENT_VOLUME_CLAIM, *pv.claim_ref)
        try:
            created = await self._create(pv.name, document)
            created.setdefault("kind", "PersistentVolume")
            created.setdefault("apiVersion", "v1")
            obj = convert(created, origin=self._origin)
            if not isinstance(obj, PersistentVolume) or not self._ours(obj):
                raise ApiError(409, "AlreadyExists", f"persistentvolume {pv.name} exists, not ours")
            self._put(obj)
        finally:
            if self._recording.pop(pv.name, None) is not None and pv.name not in self._volumes:
                self._on_change()  # not recorded: its claim may not be wanted any more
        log.info("persistentvolume created pv=%s claim=%s/%s", pv.name, *(pv.claim_ref or ("", "")))

    async def _create(self, name: str, document: Obj) -> Obj:
        try:
            created: Obj = await self._client.create_persistent_volume(document)
        except ApiError as exc:
            if exc.code != 409:
                raise
            existing = await self._client.get(Kind.PERSISTENT_VOLUME, namespace="", name=name)
            if existing is None:  # deleted meanwhile: the next attempt creates it again
                raise
            created = existing
        return created

    async def release(self, pv: PersistentVolume) -> None:
        """The PV controller marks it `Released`; nothing to do here."""

    async def forget(self, pv: PersistentVolume) -> None:
        deleted = await self._client.delete_persistent_volume(pv.name)
        if self._volumes.pop(pv.name, None) is not None:
            self._on_change()
        if deleted:
            log.info("persistentvolume deleted pv=%s", pv.name)

    # -- the mirror --------------------------------------------------------------------------------

    async def _replace(self, items: Items) -> None:
        volumes = {}
        for raw in items:
            obj = convert(raw, origin=self._origin)
            if isinstance(obj, PersistentVolume) and self._ours(obj):
                volumes[obj.name] = obj
        if volumes != self._volumes:
            self._volumes = volumes
            self._on_change()

    async def _event(self, kind: str, raw: Obj) -> None:
        if kind == "DELETED":
            name = str((raw.get("metadata") or {}).get("name", ""))
            if self._volumes.pop(name, None) is not None:
                self._on_change()
            return
        obj = convert(raw, origin=self._origin)
        if isinstance(obj, PersistentVolume) and self._ours(obj):
            self._put(obj)

    def _put(self, pv: PersistentVolume) -> None:
        old = self._volumes.get(pv.name)
        if old is not None and _newer(old.resource_version, pv.resource_version):
            return  # the create's answer after the watch brought a later version
        self._volumes[pv.name] = pv
        if old is None or old.claim_ref != pv.claim_ref:
            self._on_change()

    def _ours(self, pv: PersistentVolume) -> bool:
        return (
            pv.annotations.get(PROVISIONED_BY) == self._provisioner
            and self._node_name in pv.node_names
        )


def _newer(a: str, b: str) -> bool:
    """resourceVersion `a` is later than `b` (opaque to clients, but etcd's are integers)."""
    return a.isdigit() and b.isdigit() and int(a) > int(b)
