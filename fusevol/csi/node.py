"""The CSI node plugin's work, on the trio side: publish, unpublish, and serving the published
targets again after a restart. The gRPC side (`fusevol.csi.server`) calls in from its threads.

The reconciler stays the one place where volumes are set up and torn down. A publish:
    1. checks the request (`attributes.parse`: attributes, target, handle) and that its pod is a
       pod of this node the source knows (same namespace, name, uid and service account, with a
       `csi:` volume of that name), waiting up to POD_WAIT_S for the source to see it;
    2. refuses a handle already published with other attributes or at another target, and a
       target already published under another handle (ALREADY_EXISTS);
    3. has the source track what the volume references (`track`: the API source watches it as a
       pod's reference), and puts kubelet's tokens into the store (memory only); if kubelet passed
       not every audience the volume needs, the API source requests them all by TokenRequest
       instead, as for a pod-spec volume (the manifest source cannot: FAILED_PRECONDITION);
       an object the API server refuses (to the agent's identity, or to the pod's when the
       source reads as the pod, `--csi-read-as pod`) is PERMISSION_DENIED with the server's
       message (it names the object and the user), and kubelet's next retry asks again;
    4. adds the `CsiVolume` to the desired state, records it (`state`), kicks the reconciler;
    5. waits until the volume is set up with its current inputs (or its operation failed, or
       PUBLISH_TIMEOUT_S passed). A failed first publish is forgotten again (kubelet retries, and
       the volume appears as soon as its object does); a timeout keeps it (kubelet then holds the
       volume as uncertain, and unpublishes it in any case).
An unpublish removes the volume from the desired state and waits for its tear-down (the bind
unmounted, the target removed); an unknown handle or target is a success that touches nothing.
After a restart (`restore`), each recorded target is an UNCERTAIN actual-state entry when it is
still a mount point, so that the reconciler stacks a fresh bind on the dead one, as for pod
volumes (`restored`: a lame duck is released once they are stacked too); tokens, never recorded,
are requested by the API source until kubelet's next republish brings its own.
"""

from __future__ import annotations

import collections
import hashlib
import logging
from typing import TYPE_CHECKING, Protocol

import trio

from fusevol.base.errors import FusevolError
from fusevol.csi import state
from fusevol.csi.attributes import DRIVER, Code, CsiError, PodIdentity, Publication, parse
from fusevol.model import (
    Kind,
    ObjectKey,
    Pod,
    ProjectedVolumeSource,
    ResourceVersion,
    ServiceAccountToken,
    ServiceAccountTokenProjection,
    UniqueVolumeName,
    UnsupportedVolumeSource,
    Volume,
    token_key,
)
from fusevol.node.layout import plugin_for
from fusevol.volumemanager.cache.actual import MountedVolume, MountState
from fusevol.volumemanager.cache.desired import CsiVolume

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping
    from pathlib import Path

    from fusevol.volumemanager.cache.actual import ActualState
    from fusevol.volumemanager.cache.desired import DesiredState
    from fusevol.volumemanager.cache.store import ObjectStore
    from fusevol.volumemanager.reconciler.executor import Executor
    from fusevol.volumemanager.reconciler.volumes import Volumes

log = logging.getLogger(__name__)

POD_WAIT_S = 5.0
"""How long a publish waits for the source to deliver its pod (kubelet may see it first)."""
PUBLISH_TIMEOUT_S = 60.0
"""How long a publish or unpublish waits for the reconciler (kubelet's own timeout is 2 min)."""


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
        state_path: Path,
        kubelet_dir: Path,
        node_name: str,
        store: ObjectStore,
        desired: DesiredState,
        actual: ActualState,
        executor: Executor,
        volumes: Volumes,
        kick: Callable[[], None],
        is_mount_point: Callable[[Path], bool],
        track: Tracker | None = None,
        source_name: str = "source",
        request_tokens: bool = True,
        pod_wait_s: float = POD_WAIT_S,
        timeout_s: float = PUBLISH_TIMEOUT_S,
    ) -> None:
        """`track`: the API source's (`Tracker`); without it, or without `request_tokens`
        (a deployment that may not mint tokens: `--csi-token-requests false`), tokens come from
        kubelet only. `source_name` names the source in refusals."""
        self._state_path = state_path
        self.kubelet_dir = kubelet_dir
        self.node_name = node_name
        self._store = store
        self._desired = desired
        self._actual = actual
        self._executor = executor
        self._volumes = volumes
        self._kick = kick
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
        self._timeout_s = timeout_s
        self._published: dict[str, Publication] = {}
        self.restored: list[MountedVolume] = []
        """The targets `restore` found still mounted (a predecessor's binds): set up again."""
        self._locks: collections.defaultdict[str, trio.Lock] = collections.defaultdict(trio.Lock)
        self._saving = trio.Lock()
        self._changes = 0
        """Changes of the published set so far; `_saved` of them are on disk."""
        self._saved = 0

    # -- the CSI calls -----------------------------------------------------------------------------

    async def publish(
        self, *, volume_id: str, target_path: str, context: dict[str, str], mount_group: str
    ) -> None:
        """NodePublishVolume (module docstring); CsiError on failure."""
        publication = parse(  # (1)
            volume_id=volume_id,
            target_path=target_path,
            context=context,
            volume_mount_group=mount_group,
            kubelet_dir=self.kubelet_dir,
        )
        async with self._locks[volume_id]:
            pod = await self._pod_of(publication)
            known = self._published.get(volume_id)  # (2)
            if known is not None and _record(known) != _record(publication):
                raise CsiError(
                    Code.ALREADY_EXISTS,
                    f"volume {volume_id} is published at {known.target} with other attributes or "
                    "another target: unpublish it first",
                )
            for other in self._published.values():
                if other.target == publication.target and other.volume_id != volume_id:
                    raise CsiError(
                        Code.ALREADY_EXISTS,
                        f"target {target_path} is published for volume {other.volume_id}",
                    )
            request_tokens = self._check_tokens(publication)
            name = _unique_name(volume_id)
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
                    await self._forget(publication)
                raise CsiError(Code.PERMISSION_DENIED, f"{refusal}: publish refused")
            if not request_tokens:
                self._put_tokens(publication, pod)
            self._desired.set_csi(_csi_volume(name, publication, pod))  # (4)
            if known is None:
                self._published[volume_id] = publication
                await self._save()
            self._kick()
            try:
                await self._wait_served(name)  # (5)
            except CsiError as exc:
                if known is None and exc.code is not Code.DEADLINE_EXCEEDED:
                    await self._forget(publication)
                raise
            self._published[volume_id] = publication
        log.info(
            "csi volume published volume=%s pod=%s/%s target=%s",
            volume_id,
            pod.namespace,
            pod.name,
            target_path,
        )

    async def unpublish(self, *, volume_id: str, target_path: str) -> None:
        """NodeUnpublishVolume: idempotent; an unknown handle or target is left alone."""
        async with self._locks[volume_id]:
            publication = self._published.get(volume_id)
            if publication is None or str(publication.target) != target_path:
                log.info("csi unpublish: not published volume=%s target=%s", volume_id, target_path)
                return
            name = _unique_name(volume_id)
            self._desired.delete_csi(name)
            self._kick()
            await self._wait_torn_down(name)
            await self._forget(publication)
        self._locks.pop(volume_id, None)
        log.info("csi volume unpublished volume=%s target=%s", volume_id, target_path)

    async def restore(self) -> int:
        """Serve the recorded targets again (after a restart); returns how many."""
        records = await trio.to_thread.run_sync(state.load, self._state_path)
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
            name = _unique_name(record.volume_id)
            pod = self._known_pod(publication.pod) or _bare_pod(publication.pod)
            # Tokens are never recorded: requested, if the source can, until kubelet republishes.
            tokens = self._can_request_tokens and bool(_token_projections(publication))
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
            pod = self._known_pod(publication.pod) or _bare_pod(publication.pod)
            name = _unique_name(publication.volume_id)
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
            self._desired.set_csi(_csi_volume(name, publication, pod))
            self._published[publication.volume_id] = publication
        self._kick()
        await self._save()
        log.info("csi volumes restored count=%d", len(self._published))
        return len(self._published)

    def published(self) -> int:
        return len(self._published)

    # -- steps -------------------------------------------------------------------------------------

    async def _pod_of(self, publication: Publication) -> Pod:
        """(1) The pod the request names, as the source knows it, or PERMISSION_DENIED."""
        identity = publication.pod
        with trio.move_on_after(self._pod_wait_s):
            while self._known_pod(identity) is None:
                await self._store.wait_changed(self._store.generation)
        pod = self._store.get(ObjectKey(Kind.POD, identity.namespace, identity.name), Pod)
        who = f"pod {identity.namespace}/{identity.name}"
        if pod is None:
            reason = f"is not a pod of node {self.node_name} known to the {self._source_name}"
        elif pod.uid != identity.uid:
            reason = f"has uid {pod.uid}, not {identity.uid}"
        elif pod.service_account_name != identity.service_account:
            reason = (
                f"runs as service account {pod.service_account_name!r}, "
                f"not {identity.service_account!r}"
            )
        elif not any(
            volume.name == publication.volume.name
            and isinstance(volume.source, UnsupportedVolumeSource)
            and volume.source.type_name == "csi"
            for volume in pod.volumes
        ):
            reason = f"has no csi volume {publication.volume.name!r}"
        else:
            return pod
        raise CsiError(Code.PERMISSION_DENIED, f"{who} {reason}: publish refused")

    def _known_pod(self, identity: PodIdentity) -> Pod | None:
        pod = self._store.get(ObjectKey(Kind.POD, identity.namespace, identity.name), Pod)
        return pod if pod is not None and pod.uid == identity.uid else None

    def _check_tokens(self, publication: Publication) -> bool:
        """True if the volume's tokens are to be requested by the source: kubelet passed not
        all of them (the CSIDriver's tokenRequests lack an audience); without an API source
        that is FAILED_PRECONDITION."""
        for projection in _token_projections(publication):
            if projection.audience not in publication.tokens:
                if self._can_request_tokens:
                    return True
                raise CsiError(
                    Code.FAILED_PRECONDITION,
                    f"serviceAccountToken {projection.path!r}: no token for audience "
                    f"{projection.audience!r} in csi.storage.k8s.io/serviceAccount.tokens: list "
                    f"it in the tokenRequests of the CSIDriver {DRIVER} ({self._no_tokens})",
                )
        return False

    def _put_tokens(self, publication: Publication, pod: Pod) -> None:
        """(3) kubelet's tokens, where the projection's renderer looks for them."""
        for projection in _token_projections(publication):
            token = publication.tokens[projection.audience]
            key = token_key(pod, projection)
            version = ResourceVersion(hashlib.sha256(token).hexdigest()[:16])
            self._store.upsert(ServiceAccountToken(key.namespace, key.name, version, token))

    async def _forget(self, publication: Publication) -> None:
        name = _unique_name(publication.volume_id)
        self._desired.delete_csi(name)
        self._published.pop(publication.volume_id, None)
        pod = _bare_pod(publication.pod)
        for projection in _token_projections(publication):
            self._store.delete(token_key(pod, projection))
        await self._track(name, pod, None)
        await self._save()

    async def _save(self) -> None:
        """Record the published set. One write at a time, each of the set as it is when the write
        starts: calls made at once (kubelet publishes on several gRPC threads) end with the newest
        set on disk, and a call whose change a later write already holds writes nothing."""
        self._changes += 1
        change = self._changes
        async with self._saving:
            if self._saved >= change:
                return
            newest = self._changes
            records = [_record(p) for p in self._published.values()]
            await trio.to_thread.run_sync(state.save, self._state_path, records)
            self._saved = newest

    async def _wait_served(self, name: UniqueVolumeName) -> None:
        """(5) Until the reconciler has set the volume up with its current inputs; its error if
        an operation of it failed with them while we waited (or failed before and waits for its
        retry)."""
        status = self._executor.status(name)
        failures, ended = (status.failures, status.ended) if status is not None else (0, 0)
        with trio.move_on_after(self._timeout_s):
            while True:
                since = self._executor.finished, self._actual.generation, self._desired.generation
                volume = self._desired.get(name)
                if volume is not None and not self._executor.is_pending(name):
                    inputs = self._volumes.inputs(volume)
                    mounted = self._actual.get(name)
                    if (
                        mounted is not None
                        and mounted.state is MountState.MOUNTED
                        and mounted.inputs == inputs
                    ):
                        return
                    status = self._executor.status(name)
                    if (
                        status is not None
                        and status.last_error
                        and status.failed_inputs == inputs
                        and (
                            status.ended != ended
                            or status.failures != failures
                            or trio.current_time() < status.retry_at
                        )
                    ):
                        raise CsiError(Code.FAILED_PRECONDITION, status.last_error)
                await self._changed(*since)
        raise CsiError(
            Code.DEADLINE_EXCEEDED, f"volume not set up within {self._timeout_s:g}s, still trying"
        )

    async def _wait_torn_down(self, name: UniqueVolumeName) -> None:
        with trio.move_on_after(self._timeout_s):
            while True:
                since = self._executor.finished, self._actual.generation, self._desired.generation
                pending = self._executor.is_pending(name)
                if not pending and self._actual.get(name) is None:
                    return
                status = self._executor.status(name)
                if (
                    not pending
                    and status is not None
                    and status.operation == "unmount"
                    and status.last_error
                ):
                    raise CsiError(Code.FAILED_PRECONDITION, status.last_error)
                await self._changed(*since)
        raise CsiError(
            Code.DEADLINE_EXCEEDED,
            f"volume not torn down within {self._timeout_s:g}s, still trying",
        )

    async def _changed(self, finished: int, actual: int, desired: int) -> None:
        """Until, after these readings, an operation ends, the actual state changes (a volume of
        a shared subtree is marked refreshed without an operation of its own) or the desired
        state does (the populator resolved a volume, with nothing to do for it)."""
        async with trio.open_nursery() as nursery:

            async def until(wait: Callable[[int], Awaitable[None]], since: int) -> None:
                await wait(since)
                nursery.cancel_scope.cancel()

            nursery.start_soon(until, self._executor.wait_finished, finished)
            nursery.start_soon(until, self._actual.wait_changed, actual)
            nursery.start_soon(until, self._desired.wait_changed, desired)


def _unique_name(volume_id: str) -> UniqueVolumeName:
    """kubelet's unique name of a CSI volume: `kubernetes.io/csi/<driver>^<handle>`."""
    return UniqueVolumeName(f"kubernetes.io/csi/{DRIVER}^{volume_id}")


def _csi_volume(name: UniqueVolumeName, publication: Publication, pod: Pod) -> CsiVolume:
    return CsiVolume(name, pod, publication.volume, publication.target, publication.fs_group)


def _record(publication: Publication) -> state.Record:
    group = "" if publication.fs_group is None else str(publication.fs_group)
    return state.Record(
        publication.volume_id, str(publication.target), dict(publication.attributes), group
    )


def _bare_pod(identity: PodIdentity) -> Pod:
    """A pod known only by what kubelet said of it (its source has not delivered it)."""
    return Pod(
        identity.uid,
        identity.namespace,
        identity.name,
        ResourceVersion(""),
        service_account_name=identity.service_account,
    )


def _token_projections(publication: Publication) -> list[ServiceAccountTokenProjection]:
    source = publication.volume.source
    if not isinstance(source, ProjectedVolumeSource):
        return []
    return [p for p in source.sources if isinstance(p, ServiceAccountTokenProjection)]
