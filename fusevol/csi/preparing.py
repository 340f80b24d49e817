"""A pod's `fusevol.io` volumes made ready before kubelet publishes them, so that a publish is
one bind, made in the gRPC thread that received it.

kubelet publishes a pod's CSI volumes some 100 ms after the pod reaches it (its volume manager's
periods), and the source delivers the pod at about the same time. From the moment a pod of this
node is in the store (`Preparer.run`), each of its `fusevol.io` volumes is
    1. read as kubelet will publish it (`expected`): the pod's `volumeAttributes` with kubelet's
       podInfoOnMount keys, kubelet's handle and target, the pod's fsGroup as
       `volume_mount_group`, through `attributes.parse`: the `Publication` its request will be;
    2. served, if the store holds every object it references (the source reads what a pod's
       `fusevol.io` volumes reference when it sees the pod; only what the Node authorizer lets
       the node read before a publish): its subtree published, the volume among its users, the
       bind's arguments taken from the mount table (`Volumes.prepare`); not bound.
A publish whose request is that very one (`Preparations.claim`, in gRPC's thread, compared as
kubelet sends it, before any parsing: the pod's identity, its attributes, handle, target and
fsGroup are all in it), and whose target's directories kubelet has made, writes its record,
makes the bind there and is answered (`CsiNode.publish_prepared`): it waits for nothing the
trio thread does, such as the other publishes of a burst. The trio thread then takes the volume
over, in the order of the calls (`CsiNode._adopt`: desired state, actual state, mount table; a
change of its objects since it was prepared is the reconciler's refresh, as for any volume),
and the source tracks what it references until its unpublish, as a publish has it do
(`adopted`).
Anything else takes the publish path of `node`: a volume not prepared yet, one whose request
differs (another fsGroup, say), one whose tokens come with the publish, a source that reads as
the pod (the pod's token comes with the publish: `prepare` is off), a volume whose preparation
failed (its publish says why), a republish. A publish that finds its volume's bind being made
by another call answers ABORTED, as the CSI spec says of an operation in progress for a volume.
A prepared volume whose pod leaves the store, is replaced (another uid) or begins to stop (it
is being deleted, or has finished: kubelet publishes nothing more for it), is released: its
subtree goes with its last user. A stopping pod's volumes are never prepared: after kubelet
unpublished them, the pod's next updates (its last status, a finished Job's pod kept for days)
must not serve them again.

Excludes: the publish itself (`node`), what a request says (`attributes`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from fusevol.base.errors import FusevolError
from fusevol.csi import state
from fusevol.csi.attributes import (
    DRIVER,
    EPHEMERAL,
    POD_NAME,
    POD_NAMESPACE,
    POD_UID,
    SERVICE_ACCOUNT,
    Code,
    CsiError,
    Publication,
    parse,
    target,
    unique_name,
    volume_handle,
    volume_mount_group,
    without_tokens,
)
from fusevol.csi.tokens import token_projections
from fusevol.model import CSIVolumeSource, Kind, Pod, referenced_objects
from fusevol.volumemanager.cache.desired import CsiVolume

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path

    from fusevol.csi.node import Tracker
    from fusevol.model import KubeObject, ObjectKey, PodUID, UniqueVolumeName, Volume
    from fusevol.volumemanager.cache.desired import VolumeToServe
    from fusevol.volumemanager.cache.store import ObjectStore
    from fusevol.volumemanager.reconciler.served import Prepared as Served
    from fusevol.volumemanager.reconciler.volumes import Volumes

log = logging.getLogger(__name__)


@dataclass(eq=False, slots=True)
class Prepared:
    """A volume ready for its publish."""

    publication: Publication
    """What its request will be."""
    pod: Pod
    """The store's pod it was prepared for."""
    volume: VolumeToServe
    served: Served
    objects: tuple[tuple[ObjectKey, KubeObject | None], ...]
    """The store's objects it was served from, as they were before (by identity): a publish
    that finds another there takes the publish path, which serves the current ones."""
    claimed: bool = False
    """A publish is making its bind (gRPC's thread), or made it and the trio thread has yet to
    adopt it: no one else may use or release it."""
    staged: Path | None = None
    """Its publish's record, written ahead (`state.stage`): the publish renames it into place."""


def _requested(
    expected: Publication, target_path: str, context: Mapping[str, str], mount_group: str
) -> bool:
    """Whether a request says what the `expected` one said (`Publication.attributes`: the
    volume context without kubelet's tokens)."""
    return (
        target_path == str(expected.target)
        and mount_group == volume_mount_group(expected.fs_group)
        and without_tokens(context) == expected.attributes
    )


class Preparations:
    """The prepared volumes, by volume id: the trio thread adds and releases them, gRPC's
    threads claim them. Thread-safe."""

    def __init__(self, current: Callable[[ObjectKey], KubeObject | None]) -> None:
        """`current(key)`: the store's object (a dict's lookup: safe in any thread)."""
        self._current = current
        self._lock = threading.Lock()
        self._by_id: dict[str, Prepared] = {}

    def add(self, prepared: Prepared) -> None:
        with self._lock:
            self._by_id[prepared.publication.volume_id] = prepared

    def claim(
        self, volume_id: str, target_path: str, context: Mapping[str, str], mount_group: str
    ) -> Prepared | None:
        """The volume prepared for exactly this request, as kubelet sends it (before any
        parsing: the expected one was parsed when it was prepared), now the caller's to bind;
        None if there is none (or another call has it, or its objects changed since). kubelet's
        tokens are not compared: a prepared volume has no token projection, and every publish
        carries them when the CSIDriver asks for any (`tokenRequests`)."""
        with self._lock:
            prepared = self._by_id.get(volume_id)
            if (
                prepared is None
                or prepared.claimed
                or not _requested(prepared.publication, target_path, context, mount_group)
                or not self.fresh(prepared)
            ):
                return None
            prepared.claimed = True
            return prepared

    def fresh(self, prepared: Prepared) -> bool:
        """The store holds the very objects the volume was served from."""
        return all(self._current(key) is obj for key, obj in prepared.objects)

    def referencing(self, keys: set[ObjectKey]) -> list[Prepared]:
        """The volumes served from any of `keys` (changed since)."""
        with self._lock:
            return [p for p in self._by_id.values() if any(k in keys for k, _ in p.objects)]

    def unclaim(self, prepared: Prepared) -> None:
        """Its bind was not made: the volume is prepared as before."""
        with self._lock:
            prepared.claimed = False

    def take(self, volume_id: str) -> Prepared | None:
        """Remove and return the volume prepared under `volume_id`, unless it is claimed (it
        stays: `CsiError` ABORTED); None if there is none."""
        with self._lock:
            prepared = self._by_id.get(volume_id)
            if prepared is None:
                return None
            if prepared.claimed:
                raise CsiError(
                    Code.ABORTED, f"volume {volume_id}: its publish is in progress; try again"
                )
            del self._by_id[volume_id]
            return prepared

    def done(self, prepared: Prepared) -> None:
        """A claimed volume was bound and adopted: no longer prepared."""
        with self._lock:
            if self._by_id.get(prepared.publication.volume_id) is prepared:
                del self._by_id[prepared.publication.volume_id]

    def has(self, volume_id: str) -> bool:
        with self._lock:
            return volume_id in self._by_id

    def pods(self) -> set[tuple[ObjectKey, PodUID]]:
        """The pods (key, uid) that volumes were prepared for."""
        with self._lock:
            return {(p.pod.key, p.pod.uid) for p in self._by_id.values()}

    def of_pod(self, uid: PodUID) -> list[Prepared]:
        with self._lock:
            return [p for p in self._by_id.values() if p.publication.pod.uid == uid]

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_id)


class Preparer:
    def __init__(
        self,
        *,
        store: ObjectStore,
        volumes: Volumes,
        kubelet_dir: Path,
        track: Tracker,
        resolve: Callable[[CsiVolume], VolumeToServe],
        published: Callable[[str], bool],
        stage: Callable[[Publication], Path | None] = lambda _: None,
    ) -> None:
        """`resolve`: a CSI volume as the populator resolves it; `published(volume id)`: kubelet
        published it already (nothing to prepare); `stage(publication)`: its record written
        ahead (`state.stage`), None if it was not."""
        self.preparations = Preparations(store.get)
        self._store = store
        self._volumes = volumes
        self._kubelet_dir = kubelet_dir
        self._track = track
        self._resolve = resolve
        self._published = published
        self._stage = stage
        self._nursery: trio.Nursery | None = None
        self._preparing: dict[str, trio.Event] = {}
        """The volume ids being prepared, or released to be prepared again: set once their task
        has added or dropped them (`release` waits for it)."""
        self._publishing: set[str] = set()
        """The volume ids the publish path sets up (`release` to `publish_ended`): never
        prepared meanwhile."""
        self._waiting: dict[str, tuple[Pod, Publication]] = {}
        """The volumes to prepare once the store holds their objects, by volume id."""

    async def run(self) -> None:
        """Prepare the volumes of each pod the store delivers (once it holds their objects),
        release those of pods gone."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            changed: tuple[ObjectKey, ...] = tuple(pod.key for pod in self._store.pods())
            while True:
                generation = self._store.generation
                for key, uid in self.preparations.pods():
                    if not self._current(key, uid):
                        nursery.start_soon(self._release_pod, uid)
                objects = set()
                for key in changed:
                    if key.kind is not Kind.POD:
                        objects.add(key)
                    elif (pod := self._store.get(key, Pod)) is not None and not pod.stopping:
                        for volume, source in _ours(pod):
                            self._consider(pod, volume, source)
                if objects:
                    self._again(objects)
                await self._store.wait_changed(generation)
                changed = self._store.changed_since(generation)

    def _again(self, objects: set[ObjectKey]) -> None:
        """Prepare again the volumes that `objects` changed, and try those waiting for them."""
        for prepared in self.preparations.referencing(objects):
            try:
                taken = self.preparations.take(prepared.publication.volume_id)
            except CsiError:
                continue  # claimed: adopted next, and refreshed as any volume
            if taken is not None:
                assert self._nursery is not None
                self._preparing[taken.publication.volume_id] = trio.Event()
                self._nursery.start_soon(self._redo, taken)
        for pod, publication in list(self._waiting.values()):
            del self._waiting[publication.volume_id]
            if self._current(pod.key, pod.uid):
                self._start(pod, publication)

    def _consider(self, pod: Pod, volume: Volume, source: CSIVolumeSource) -> None:
        volume_id = volume_handle(pod.uid, volume.name)
        if (
            volume_id in self._preparing
            or volume_id in self._waiting
            or volume_id in self._publishing
            or self.preparations.has(volume_id)
            or self._published(volume_id)
        ):
            return
        publication = self.expected(pod, volume, source)
        if publication is not None and not token_projections(publication):
            self._start(pod, publication)  # (with tokens: they come with the publish)

    def _start(self, pod: Pod, publication: Publication) -> None:
        """Prepare the volume now if the store holds every object it references; else once it
        does (not read yet, refused to the node, or missing: its publish waits, or says why)."""
        assert self._nursery is not None
        volume_id = publication.volume_id
        if self._published(volume_id) or volume_id in self._publishing:
            return
        keys = referenced_objects(pod, publication.volume.source)
        if any(self._store.get(key) is None for key in keys):
            self._waiting[volume_id] = (pod, publication)
            return
        self._preparing[volume_id] = trio.Event()
        self._nursery.start_soon(self._prepare, pod, publication, keys)

    async def _redo(self, prepared: Prepared) -> None:
        """Release `prepared` and prepare it anew (its objects changed)."""
        pod, publication = prepared.pod, prepared.publication
        await self._unprepare(prepared)
        self._prepared(publication.volume_id)
        if self._current(pod.key, pod.uid):
            self._start(pod, publication)

    async def _prepare(
        self, pod: Pod, publication: Publication, keys: tuple[ObjectKey, ...]
    ) -> None:
        volume_id = publication.volume_id
        try:
            prepared = await self._served(pod, publication, keys)
            if prepared is None:
                return
            if not self._current(pod.key, pod.uid):
                await self._unprepare(prepared)  # gone meanwhile
                return
            prepared.staged = self._stage(publication)
            self.preparations.add(prepared)
        except Exception:  # a bug: this volume is not prepared, and nothing else changes
            log.exception("csi volume not prepared volume=%s", volume_id)
            return
        finally:
            self._prepared(volume_id)
        if not self.preparations.fresh(prepared):  # changed meanwhile: unseen by `_again`
            self._again({key for key, _ in prepared.objects})

    def _prepared(self, volume_id: str) -> None:
        """The volume's preparation ended: prepared, or not."""
        if (event := self._preparing.pop(volume_id, None)) is not None:
            event.set()

    async def _served(
        self, pod: Pod, publication: Publication, keys: tuple[ObjectKey, ...]
    ) -> Prepared | None:
        """Step 2 of the module docstring, for a volume that references `keys`; None if it
        cannot be served."""
        name = unique_name(publication.volume_id)
        resolved = self._resolve(csi_volume(name, publication, pod))
        objects = tuple((key, self._store.get(key)) for key in keys)  # before: see `Prepared`
        try:
            served = await self._volumes.prepare(resolved)
        except Exception as exc:  # bad input: its publish says why
            log.debug("csi volume not prepared volume=%s: %s", name, exc)
            return None
        return Prepared(publication, pod, resolved, served, objects)

    def expected(self, pod: Pod, volume: Volume, source: CSIVolumeSource) -> Publication | None:
        """The request kubelet will make to publish the volume (module docstring, step 1);
        None if it does not check, in whatever way (a tenant wrote the attributes: its publish
        says why)."""
        context = dict(source.attributes)
        context.update(  # kubelet's podInfoOnMount keys replace the pod's own (`mergeMap`)
            {
                POD_NAME: pod.name,
                POD_NAMESPACE: pod.namespace,
                POD_UID: pod.uid,
                SERVICE_ACCOUNT: pod.service_account_name,
                EPHEMERAL: "true",
            }
        )
        try:
            return parse(
                volume_id=volume_handle(pod.uid, volume.name),
                target_path=str(target(self._kubelet_dir, pod.uid, volume.name)),
                context=context,
                volume_mount_group=volume_mount_group(pod.fs_group),
                kubelet_dir=self._kubelet_dir,
                made=False,
            )
        except Exception:
            return None

    async def _release_pod(self, uid: PodUID) -> None:
        for prepared in self.preparations.of_pod(uid):
            try:
                taken = self.preparations.take(prepared.publication.volume_id)
            except CsiError:
                continue  # claimed: its bind is made, and the trio thread adopts it next
            if taken is not None:  # a publish of it waits meanwhile (`release`)
                volume_id = taken.publication.volume_id
                self._preparing[volume_id] = trio.Event()
                try:
                    await self._unprepare(taken)
                finally:
                    self._prepared(volume_id)

    async def release(self, volume_id: str) -> None:
        """The publish path sets the volume up itself, until `publish_ended`: release what was
        prepared under `volume_id`, if anything, once a preparation of it under way has ended,
        and prepare it no more meanwhile. The set-up and a preparation take the same place among
        the subtree's users: the one's release would take it from the other. ABORTED while a
        publish of it in gRPC's thread is making its bind."""
        while (preparing := self._preparing.get(volume_id)) is not None:
            await preparing.wait()
        prepared = self.preparations.take(volume_id)
        self._publishing.add(volume_id)
        self._waiting.pop(volume_id, None)
        if prepared is not None:
            await self._unprepare(prepared)

    def publish_ended(self, volume_id: str) -> None:
        """The publish path is done with the volume (published, or not: it may be prepared)."""
        self._publishing.discard(volume_id)

    async def _unprepare(self, prepared: Prepared) -> None:
        """Release a prepared volume, and its staged record; never raises (a subtree not removed
        is logged)."""
        if prepared.staged is not None:
            state.discard(prepared.staged)
            prepared.staged = None
        try:
            await self._volumes.unprepare(prepared.volume)
        except Exception:
            log.exception("csi prepared volume not released volume=%s", prepared.volume.name)

    def adopted(self, prepared: Prepared) -> None:
        """A prepared volume was published: tracked by the source from now on, as a publish
        has it tracked (until its unpublish), whatever happens to its pod."""
        assert self._nursery is not None, "Preparer.run() is not running"
        self.preparations.done(prepared)
        name = unique_name(prepared.publication.volume_id)
        self._nursery.start_soon(self._track_adopted, name, prepared)

    async def _track_adopted(self, name: UniqueVolumeName, prepared: Prepared) -> None:
        publication = prepared.publication
        try:
            if refusal := await self._track(name, prepared.pod, publication.volume):
                log.warning("csi volume: objects refused volume=%s: %s", name, refusal)
            if not self._published(publication.volume_id):  # unpublished meanwhile
                await self._track(name, prepared.pod, None)
        except FusevolError as exc:
            log.warning("csi volume: objects not read volume=%s error=%s", name, exc)

    def _current(self, key: ObjectKey, uid: PodUID) -> bool:
        """The store still holds the pod `uid` at `key`, and kubelet may still publish its
        volumes: it is not stopping (`Pod.stopping`)."""
        stored = self._store.get(key, Pod)
        return stored is not None and stored.uid == uid and not stored.stopping


def csi_volume(name: UniqueVolumeName, publication: Publication, pod: Pod) -> CsiVolume:
    """What the desired state holds of a published volume."""
    return CsiVolume(
        name,
        pod,
        publication.volume,
        publication.target,
        publication.fs_group,
        audit=publication.audit,
    )


def _ours(pod: Pod) -> list[tuple[Volume, CSIVolumeSource]]:
    """The pod's `fusevol.io` volumes."""
    return [
        (volume, volume.source)
        for volume in pod.volumes
        if isinstance(volume.source, CSIVolumeSource) and volume.source.driver == DRIVER
    ]
