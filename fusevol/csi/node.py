"""The CSI node plugin's work, on the trio side: publish, unpublish, and serving the published
targets again after a restart. The gRPC side (`fusevol.csi.server`) calls in from its threads.

The reconciler is where volumes are set up and torn down; only a prepared volume's bind is made
outside it (below), and the reconciler takes the volume over at once. A publish:
    1. checks the request (`attributes.parse`: attributes, target, handle; in the gRPC thread
       that received it, before the call reaches the loop) and that its pod is a pod of this
       node the source knows (`pods`: same namespace, name, uid and service account,
       with a `csi:` volume of that name), waiting up to POD_WAIT_S for the source to see it;
    2. refuses a handle already published with other attributes or at another target, and a
       target already published under another handle (ALREADY_EXISTS);
    3. has the source track what the volume references (`track`: the API source watches it as a
       pod's reference), and puts kubelet's tokens into the store (`tokens`, memory only); if
       kubelet passed not every audience the volume needs, the API source requests them all by
       TokenRequest instead, as for a pod-spec volume (the manifest source cannot:
       FAILED_PRECONDITION); an object the API server refuses (to the agent's identity, or to
       the pod's when the source reads as the pod, `--csi-read-as pod`) is PERMISSION_DENIED
       with the server's message (it names the object and the user), and kubelet's next retry
       asks again;
    4. records the volume (`state`), so that a restarted agent serves it again: a record that
       cannot be written (a full or read-only disk) refuses the publish, INTERNAL naming the
       records' directory and the error, and the volume is forgotten again; then adds the
       `CsiVolume` to the desired state and has the reconciler start its set-up at once
       (`Reconciler.set_up_now`: no pass over every volume);
    5. waits until the volume is set up with its current inputs (`waiting`: or its operation
       failed, or PUBLISH_TIMEOUT_S passed). A failed first publish is forgotten again (kubelet
       retries, and the volume appears as soon as its object does); a timeout keeps it (kubelet
       then holds the volume as uncertain, and unpublishes it in any case).
A volume prepared when its pod arrived (`preparing`), whose request is the one it was prepared
for, is published in gRPC's thread instead: its record (written ahead, `state.stage`) renamed
into place and its bind made there (`publish_prepared`), and adopted by the trio thread right
after, before any later call of kubelet's is served (`adopt_published`): desired state, actual
state and mount table as a set-up leaves them, counted as a mount. Steps 1 to 5, the publish
path, start by releasing whatever was prepared for the volume (the set-up there serves it anew).
A forgotten volume is in no state the reconciler reports, so the failed publishes of each are
counted here (`failing`: `fusevol_volume_failures`, operation mount) until one succeeds, kubelet
unpublishes it, or its pod is gone (kubelet never unpublishes a volume it never mounted).
An unpublish removes the volume from the desired state and waits for its tear-down (the bind
unmounted, the target removed); an unknown handle or target is a success that touches nothing.
After a restart (`restore`), each recorded target is an UNCERTAIN actual-state entry when it is
still a mount point, so that the reconciler stacks a fresh bind on the dead one, as for pod
volumes (`restored`: a lame duck is released once they are stacked too); tokens, never recorded,
are requested by the API source until kubelet's next republish brings its own.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import trio

from fusevol.base.errors import FusevolError
from fusevol.csi import state
from fusevol.csi.attributes import (
    Code,
    CsiError,
    Publication,
    parse,
    target_made,
    unique_name,
    volume_mount_group,
)
from fusevol.csi.pods import bare_pod, known_pod, pod_of
from fusevol.csi.preparing import Preparer, csi_volume
from fusevol.csi.tokens import delete_tokens, put_tokens, requests_tokens, token_projections
from fusevol.csi.waiting import Waiter
from fusevol.node.layout import plugin_for
from fusevol.volumemanager.cache.actual import MountedVolume, MountState

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path

    from fusevol.csi.preparing import Prepared
    from fusevol.model import Pod, UniqueVolumeName, Volume
    from fusevol.volumemanager.cache.actual import ActualState
    from fusevol.volumemanager.cache.desired import CsiVolume, DesiredState, VolumeToServe
    from fusevol.volumemanager.cache.store import ObjectStore
    from fusevol.volumemanager.reconciler.executor import Executor
    from fusevol.volumemanager.reconciler.volumes import Volumes

log = logging.getLogger(__name__)

POD_WAIT_S = 5.0
"""How long a publish waits for the source to deliver its pod (kubelet may see it first)."""
PUBLISH_TIMEOUT_S = 60.0
"""How long a publish or unpublish waits for the reconciler (kubelet's own timeout is 2 min)."""


@dataclass(frozen=True, slots=True)
class CsiStatistics:
    published: int
    prepared: int
    """Volumes ready for their publish (`preparing`)."""
    prepared_publishes: int
    """Publishes answered in gRPC's thread so far."""


class Tracker(Protocol):
    """The API source's `track`: keep what a CSI volume references current (and, with `tokens`,
    request its tokens by TokenRequest; `pod_tokens`: kubelet's, by audience, for reading as the
    pod); `volume` None stops it. Returns why the API server refused an object ("" if it did
    not); raises `FusevolError` when the API server did not answer."""

    async def __call__(
        self,
        owner: str,
        pod: Pod,
        volume: Volume | None,
        *,
        tokens: bool = False,
        pod_tokens: Mapping[str, bytes] | None = None,
    ) -> str: ...


async def _track_nothing(
    owner: str,
    pod: Pod,
    volume: Volume | None,
    *,
    tokens: bool = False,
    pod_tokens: Mapping[str, bytes] | None = None,
) -> str:
    """The manifest source holds every object of its directory: nothing to track."""
    return ""


class CsiNode:
    def __init__(
        self,
        *,
        records: Path,
        kubelet_dir: Path,
        node_name: str,
        store: ObjectStore,
        desired: DesiredState,
        actual: ActualState,
        executor: Executor,
        volumes: Volumes,
        kick: Callable[[], None],
        set_up_now: Callable[[UniqueVolumeName], None],
        is_mount_point: Callable[[Path], bool],
        resolve: Callable[[CsiVolume], VolumeToServe],
        adopt: Callable[[MountedVolume, float], None],
        track: Tracker | None = None,
        source_name: str = "source",
        request_tokens: bool = True,
        prepare: bool = True,
        pod_wait_s: float = POD_WAIT_S,
        timeout_s: float = PUBLISH_TIMEOUT_S,
    ) -> None:
        """`records`: the directory of the published volumes' records (`state`). `track`: the
        API source's (`Tracker`); without it, or without `request_tokens` (a deployment that may
        not mint tokens: `--csi-token-requests false`), tokens come from kubelet only.
        `source_name` names the source in refusals. `resolve` and `adopt` are the reconciler's
        (`Populator.resolve_csi`, `Reconciler.adopt`); `prepare`: volumes are prepared before
        their publish (`preparing`; not when the source reads as the pod)."""
        self._records = records
        self.kubelet_dir = kubelet_dir
        self.node_name = node_name
        self._store = store
        self._desired = desired
        self._actual = actual
        self._waiter = Waiter(
            desired=desired, actual=actual, executor=executor, volumes=volumes, timeout_s=timeout_s
        )
        self._kick = kick
        self._set_up_now = set_up_now
        self._is_mount_point = is_mount_point
        self._track: Tracker = track or _track_nothing
        self._can_request_tokens = track is not None and request_tokens
        self._source_name = source_name
        self._no_tokens = (
            f"the {source_name} requests none"
            if track is None
            else "the agent requests none: --csi-token-requests false"
        )
        self._pod_wait_s = pod_wait_s
        self._published: dict[str, Publication] = {}
        self._targets: dict[Path, str] = {}
        """target -> the volume id published there (`_published`'s, by target)."""
        self._failing: dict[str, tuple[Publication, int]] = {}
        """volume id -> the last failed publish of a volume the desired state does not hold, and
        how many failed in a row."""
        self.restored: list[MountedVolume] = []
        """The targets `restore` found still mounted (a predecessor's binds): set up again."""
        self._locks: collections.defaultdict[str, trio.Lock] = collections.defaultdict(trio.Lock)
        self._volumes = volumes
        self._adopt_mounted = adopt
        self._preparer = (
            Preparer(
                store=store,
                volumes=volumes,
                kubelet_dir=kubelet_dir,
                track=self._track,
                resolve=resolve,
                published=self._published.__contains__,
                stage=self._stage,
            )
            if prepare
            else None
        )
        self._to_adopt: collections.deque[tuple[Prepared, str, float]] = collections.deque()
        """Published in gRPC's threads, to adopt (`adopt_published`): appended there, taken
        here (a deque's append and popleft are atomic)."""
        self.prepared_publishes = 0
        """Publishes answered in gRPC's thread (`preparing`)."""

    # -- the CSI calls -----------------------------------------------------------------------------

    async def publish(self, publication: Publication) -> None:
        """NodePublishVolume of a checked request (module docstring); CsiError on failure."""
        volume_id = publication.volume_id
        self.adopt_published()
        async with self._locks[volume_id]:
            try:
                pod = await self._publish(publication)
            except CsiError:
                self._count_failure(publication)
                raise
            finally:
                if self._preparer is not None:
                    self._preparer.publish_ended(volume_id)
            self._failing.pop(volume_id, None)
        log.info(
            "csi volume published volume=%s pod=%s/%s target=%s",
            volume_id,
            pod.namespace,
            pod.name,
            publication.target,
        )

    async def _publish(self, publication: Publication) -> Pod:
        """Steps 1 (the pod) to 5 of a publish, under the volume's lock."""
        volume_id = publication.volume_id
        if self._preparer is not None:  # set up here, whatever was prepared
            await self._preparer.release(volume_id)
        pod = await pod_of(
            publication,
            store=self._store,
            wait_s=self._pod_wait_s,
            node_name=self.node_name,
            source_name=self._source_name,
        )
        known = self._published.get(volume_id)  # (2)
        if known is not None and _record(known) != _record(publication):
            raise CsiError(
                Code.ALREADY_EXISTS,
                f"volume {volume_id} is published at {known.target} with other attributes or "
                "another target: unpublish it first",
            )
        other = self._targets.get(publication.target, volume_id)
        if other != volume_id:
            raise CsiError(
                Code.ALREADY_EXISTS, f"target {publication.target} is published for volume {other}"
            )
        request_tokens = requests_tokens(
            publication, can_request=self._can_request_tokens, no_tokens=self._no_tokens
        )
        name = unique_name(volume_id)
        try:
            refusal = await self._track(
                name,
                pod,
                publication.volume,
                tokens=request_tokens,
                pod_tokens=publication.tokens,
            )  # (3)
        except FusevolError as exc:
            raise CsiError(Code.UNAVAILABLE, str(exc)) from None
        if refusal:
            if known is None:
                await self._forget(publication, recorded=False)
            raise CsiError(Code.PERMISSION_DENIED, f"{refusal}: publish refused")
        if not request_tokens:
            put_tokens(self._store, publication, pod)  # (3)
        if known is None:
            self._add(publication)
            try:
                self._write(publication)  # (4)
            except OSError as exc:
                await self._forget(publication, recorded=False)
                raise CsiError(
                    Code.INTERNAL,
                    f"volume {volume_id}: its record in {self._records} cannot be written: "
                    f"{exc.strerror or exc}",
                ) from None
        self._desired.set_csi(csi_volume(name, publication, pod))  # (4)
        self._set_up_now(name)
        try:
            await self._waiter.wait_served(name)  # (5)
        except CsiError as exc:
            if known is None and exc.code is not Code.DEADLINE_EXCEEDED:
                await self._forget(publication)
            raise
        self._add(publication)
        return pod

    # -- a prepared publish (`preparing`) ----------------------------------------------------------

    async def prepare(self) -> None:
        """Prepare the volumes of the pods the source delivers, until cancelled."""
        if self._preparer is None:
            await trio.sleep_forever()
        else:
            await self._preparer.run()

    def claim(
        self, volume_id: str, target_path: str, context: Mapping[str, str], mount_group: str
    ) -> Prepared | None:
        """In gRPC's thread: the volume prepared for this very request, as kubelet sent it
        (`Preparations.claim`), to `publish_prepared`."""
        if self._preparer is None:
            return None
        return self._preparer.preparations.claim(volume_id, target_path, context, mount_group)

    def publish_prepared(self, prepared: Prepared, token: trio.lowlevel.TrioToken) -> bool:
        """In gRPC's thread: publish a claimed volume (record, bind) and have the trio thread
        adopt it (`token`: the agent's loop); False if that failed, and the volume is
        unclaimed again (the publish path then tries, and says what fails)."""
        publication = prepared.publication
        started = time.monotonic()
        if not target_made(str(publication.target), self.kubelet_dir):
            self._preparer_of().preparations.unclaim(prepared)
            return False  # the publish path says what is wrong with it
        try:
            self._commit(prepared)
            device = prepared.served.bind()
        except Exception as exc:
            log.info("csi prepared publish failed volume=%s: %s", publication.volume_id, exc)
            self._preparer_of().preparations.unclaim(prepared)
            return False
        self._to_adopt.append((prepared, device, time.monotonic() - started))
        # A stopped agent's successor serves the volume again from its record.
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(self.adopt_published)
        return True

    def adopt_published(self) -> None:
        """On the trio thread: adopt the volumes published in gRPC's threads so far. Called by
        the loop after each, and first by whatever reads or changes what is published (a call
        of kubelet's, the metrics), so that each sees every publish answered before it."""
        while self._to_adopt:
            self._adopt(*self._to_adopt.popleft())

    def _adopt(self, prepared: Prepared, device: str, seconds: float) -> None:
        """A prepared volume was published: set up as any, from now on. Never raises (a
        callback of the loop)."""
        publication = prepared.publication
        try:
            self._preparer_of().adopted(prepared)
            name = unique_name(publication.volume_id)
            self._add(publication)
            self._failing.pop(publication.volume_id, None)
            self._desired.set_csi(csi_volume(name, publication, prepared.pod))
            mounted = self._volumes.bound(prepared.volume, prepared.served, device)
            self._adopt_mounted(mounted, seconds)
            self.prepared_publishes += 1
            log.info(
                "csi volume published volume=%s pod=%s/%s target=%s prepared=true",
                publication.volume_id,
                publication.pod.namespace,
                publication.pod.name,
                publication.target,
            )
        except Exception:  # a bug: the volume stays bound and recorded (a restart restores it)
            log.exception("csi prepared volume not adopted volume=%s", publication.volume_id)

    def _preparer_of(self) -> Preparer:
        assert self._preparer is not None, "nothing is prepared"
        return self._preparer

    async def unpublish(self, *, volume_id: str, target_path: str) -> None:
        """NodeUnpublishVolume: idempotent; an unknown handle or target is left alone."""
        self.adopt_published()
        async with self._locks[volume_id]:
            self._failing.pop(volume_id, None)
            publication = self._published.get(volume_id)
            if publication is None or str(publication.target) != target_path:
                log.info("csi unpublish: not published volume=%s target=%s", volume_id, target_path)
                return
            name = unique_name(volume_id)
            self._desired.delete_csi(name)
            self._kick()
            await self._waiter.wait_torn_down(name)
            await self._forget(publication)
        self._locks.pop(volume_id, None)
        log.info("csi volume unpublished volume=%s target=%s", volume_id, target_path)

    async def restore(self) -> int:
        """Serve the recorded targets again (after a restart); returns how many."""
        records = await trio.to_thread.run_sync(state.load, self._records)
        restored: list[Publication] = []
        for record in records:
            try:
                publication = parse(
                    volume_id=record.volume_id,
                    target_path=record.target_path,
                    context=dict(record.attributes),
                    volume_mount_group=record.volume_mount_group,
                    kubelet_dir=self.kubelet_dir,
                )
            except Exception as exc:  # whatever the record holds, never a failed start (a loop)
                error = str(exc) if isinstance(exc, CsiError) else f"{type(exc).__name__}: {exc}"
                log.error("recorded csi volume dropped volume=%s error=%s", record.volume_id, error)
                continue
            name = unique_name(record.volume_id)
            pod = known_pod(self._store, publication.pod) or bare_pod(publication.pod)
            # Tokens are never recorded: requested, if the source can, until kubelet republishes.
            tokens = self._can_request_tokens and bool(token_projections(publication))
            try:
                if refusal := await self._track(name, pod, publication.volume, tokens=tokens):
                    log.info(
                        "recorded csi volume waits for a republish volume=%s: %s", name, refusal
                    )
            except FusevolError as exc:
                log.warning("recorded csi volume: objects not read volume=%s error=%s", name, exc)
            restored.append(publication)
        # No checkpoint from here to the kick: a reconciler pass must never see a target in the
        # actual state that is not in the desired state yet (it would tear it down).
        for publication in restored:
            pod = known_pod(self._store, publication.pod) or bare_pod(publication.pod)
            name = unique_name(publication.volume_id)
            plugin = plugin_for(publication.volume.source)
            if plugin is not None and self._is_mount_point(publication.target):
                found = MountedVolume(
                    name,
                    plugin,
                    pod.uid,
                    publication.volume.name,
                    str(publication.target),
                    inputs=None,
                    state=MountState.UNCERTAIN,
                )
                self._actual.mark_mounted(found)
                self.restored.append(found)
            self._desired.set_csi(csi_volume(name, publication, pod))
            self._add(publication)
        self._kick()
        records = [_record(p) for p in self._published.values()]
        await trio.to_thread.run_sync(state.save_all, self._records, records)
        log.info("csi volumes restored count=%d", len(self._published))
        return len(self._published)

    def statistics(self) -> CsiStatistics:
        self.adopt_published()
        prepared = 0 if self._preparer is None else len(self._preparer.preparations)
        return CsiStatistics(len(self._published), prepared, self.prepared_publishes)

    def published(self) -> int:
        self.adopt_published()
        return len(self._published)

    def failing(self) -> list[tuple[dict[str, str], float]]:
        """`fusevol_volume_failures` of the volumes whose publishes failed and that the desired
        state does not hold (module docstring): per volume, its failed publishes in a row. A
        volume whose pod the source no longer knows is dropped: kubelet will not retry it."""
        self.adopt_published()
        out = []
        for volume_id, (publication, failures) in list(self._failing.items()):
            if known_pod(self._store, publication.pod) is None:
                del self._failing[volume_id]
                continue
            labels = {
                "namespace": publication.pod.namespace,
                "pod": publication.pod.name,
                "volume": publication.volume.name,
                "operation": "mount",
            }
            out.append((labels, float(failures)))
        return out

    # -- steps -------------------------------------------------------------------------------------

    def _count_failure(self, publication: Publication) -> None:
        """A publish failed: counted while the desired state does not hold its volume (a first
        publish, forgotten again); one it holds (a republish, a timeout) the reconciler's status
        names, as any pod volume's."""
        volume_id = publication.volume_id
        if self._desired.get(unique_name(volume_id)) is not None:
            self._failing.pop(volume_id, None)
            return
        _, failures = self._failing.get(volume_id, (publication, 0))
        self._failing[volume_id] = (publication, failures + 1)

    async def _forget(self, publication: Publication, *, recorded: bool = True) -> None:
        """Drop a volume: from the desired state, the published, the tokens, the source's
        tracking, and, if `recorded`, its record."""
        name = unique_name(publication.volume_id)
        self._desired.delete_csi(name)
        gone = self._published.pop(publication.volume_id, None)
        if gone is not None and self._targets.get(gone.target) == gone.volume_id:
            del self._targets[gone.target]
        pod = bare_pod(publication.pod)
        delete_tokens(self._store, publication, pod)
        await self._track(name, pod, None)
        if not recorded:
            return
        try:
            state.remove(self._records, publication.volume_id)  # on the trio thread: `_write`
        except OSError as exc:  # the volume goes all the same: the stale record is named
            log.error("csi record not removed volume=%s error=%s", publication.volume_id, exc)

    def _add(self, publication: Publication) -> None:
        """Publish (or publish again): a target has one volume, a volume one target (`_publish`
        refuses a publish that would change either)."""
        self._published[publication.volume_id] = publication
        self._targets[publication.target] = publication.volume_id

    def _stage(self, publication: Publication) -> Path | None:
        """A prepared volume's record, written ahead on the trio thread (`state.stage`); None if
        it cannot be (its publish then writes it, and says what fails)."""
        try:
            return state.stage(self._records, _record(publication))
        except OSError as exc:
            log.debug("csi record not staged volume=%s: %s", publication.volume_id, exc)
            return None

    def _commit(self, prepared: Prepared) -> None:
        """In gRPC's thread: record a claimed volume, by renaming its staged record into place
        (one system call), else by writing it (`_write`)."""
        publication = prepared.publication
        staged, prepared.staged = prepared.staged, None
        if staged is not None:
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile: written anew
                state.commit(staged, self._records, publication.volume_id)
                return
        self._write(publication)

    def _write(self, publication: Publication) -> None:
        """Record a published volume: its own file (`state`), so that the publishes kubelet
        makes at once write side by side. The volume's lock orders its writes and removals.
        Written on the trio thread, as `FirstSeen` writes its record: a file of some 1 KiB,
        renamed into the agent's own directory, without fsync, takes ~0.2 ms. In a worker
        thread, the write of each of a pod's publishes took 1.3-3.8 ms on a busy 2-CPU node
        (the thread waited for the GIL after each system call while the trio thread set up
        the pod's other volumes), and kubelet waited for it."""
        state.save(self._records, _record(publication))


def _record(publication: Publication) -> state.Record:
    return state.Record(
        publication.volume_id,
        str(publication.target),
        dict(publication.attributes),
        volume_mount_group(publication.fs_group),
    )
