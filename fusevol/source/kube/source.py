"""KubeSource: this node's pods and what their volumes need, from the Kubernetes API.

Owns the API -> store direction when fusevol runs against a cluster:

1. The pods: one list+watch across namespaces with fieldSelector `spec.nodeName=<node>` (a
   `Reflector`: relist on 410, bookmarks, reconnect with backoff).
2. For every pod added or changed, before it reaches the store: what it references (`references`:
   ConfigMaps and Secrets of configMap, secret and projected volumes; claims, then the
   PersistentVolumes they are bound to) is tracked by the change-detection strategy (`objects`),
   and the first copy awaited (at most `REFERENCE_TIMEOUT_S`), and its serviceAccountToken
   projections get their tokens (`tokens`). So a new pod's volumes are set up once, with their
   content, instead of failing first on objects not read yet (kubelet's managers wait for the
   first sync the same way).
3. Deliver: the pod to the store; references and tokens no pod needs any more are dropped.
4. After the first complete pod list (steps 2-3 for all of them): `store.mark_synced()` and ready.
5. Cache and Get: refetch at every sync period.

A pod that has finished (`status.phase` Succeeded or Failed) has nothing tracked or requested for
its own volumes: the populator tears them down, as kubelet unmounts a terminated pod's. Its other
status updates (kubelet's, four or five as a pod starts) are not even converted (`_digest`).

With a `KubeVolumeRecorder` (the hostpath provisioner's, `provisioned`), its list+watch of the PVs
this node provisioned runs too and is read before (4), and the claims of those PVs stay tracked
(and their first copy awaited before (4)) even when no pod of this node uses them: the provisioner
deletes a volume whose claim is gone, so a claim merely not read yet must never look gone. An
unbound claim of a pod brings its StorageClass along (tracked by the same strategy), which says
whether this node provisions it. So do the unbound claims the scheduler selected this node for
(`selected`): their pods get a node only once the claim is bound.

Who the agent is decides what it asks for (`identity`, at the start): as a node, what kube's Node
authorizer never allows a node is switched off, with one line, and claims and PersistentVolumes
are read by GET only. With `pod_volumes` False (CSI: kubelet serves the pods' own volumes) only
what CSI volumes reference is tracked (`track`, `csi_volumes`, which also reads them as their pod
with `read_as_pod`), and no token is requested for the pods' own projections. What the
`fusevol.io` volumes of a pod of this node reference is tracked from the moment the pod is
seen, before kubelet publishes them (`_expect_csi`): kubelet registers a pod's ConfigMaps and
Secrets with its managers when it admits the pod, ~100 ms before its volume manager mounts
anything, and a publish that had to start the watches waited for their first list (4-6 ms of a
pod's volume step on the cluster kit). As a node, only what the pod names in its own volumes
too (the webhook's conversion keeps the originals): what the Node authorizer lets the node read.
Not when reading as the pod: only a publish brings the pod's token. An object refused before a
publish (the pod came before the Node authorizer knew it) is read afresh by the publish, once.

Pods are converted by the manifest source's converter (`fusevol.decode.objects.convert_object`),
so API objects and manifests follow the same defaulting and validation. A pod that does not
convert keeps its previous version (one ERROR line). Failed volumes are reported as Events by
`events`, which the reconciler reaches through the callback `app.py` gives it.

Excludes: the client adapter (`client`), list/watch mechanics (`reflector`), strategies
(`objects`), who the agent is (`identity`), what a volume references (`references`), what CSI
volumes reference and reading as their pod (`csi_volumes`), tokens and events.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from fusevol.base.settings import ChangeDetection
from fusevol.kube.documents import convert
from fusevol.kube.events import EventRecorder
from fusevol.kube.query import Callbacks, Query
from fusevol.kube.reflector import Reflector
from fusevol.model import TERMINAL_PHASES, Kind, ObjectKey, Pod
from fusevol.source.kube.csi_volumes import CsiVolumes
from fusevol.source.kube.identity import identify, object_trackers
from fusevol.source.kube.objects import TrackerStatistics
from fusevol.source.kube.references import claim_references, pod_references, volume_references
from fusevol.source.kube.selected import SelectedClaims
from fusevol.source.kube.tokens import TokenManager, TokenStatistics

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from fusevol.base.settings import KubeSettings
    from fusevol.kube.client import KubeClient, Obj
    from fusevol.kube.listing import Items
    from fusevol.kube.provisioned import KubeVolumeRecorder
    from fusevol.kube.transport import ClientStatistics
    from fusevol.model import Volume, VolumeSource
    from fusevol.source.kube.objects import ObjectTracker
    from fusevol.volumemanager.cache.desired import VolumeToServe
    from fusevol.volumemanager.cache.store import ObjectStore

log = logging.getLogger(__name__)

REFERENCE_TIMEOUT_S = 5.0
"""How long a new pod waits for the first copy of its objects before it is delivered anyway (its
volumes then fail and are retried, like under an API server that does not answer); watched
objects, which start a few at a time, count it from the last watch that started."""


@dataclass(frozen=True, slots=True)
class KubeSourceStatistics:
    pods: int
    pod_lists: int
    pod_watch_events: int
    objects: TrackerStatistics
    tokens: TokenStatistics
    events_recorded: int
    events_dropped: int
    api: ClientStatistics
    """The connections to the API server and the streams open on them."""


class KubeSource:
    def __init__(
        self,
        *,
        client: KubeClient,
        node_name: str,
        store: ObjectStore,
        settings: KubeSettings,
        recorder: KubeVolumeRecorder | None = None,
        pod_volumes: bool = True,
        read_as_pod: bool = False,
        csi_sources: Callable[[Pod], list[VolumeSource]] | None = None,
    ) -> None:
        """`pod_volumes`: the pods' own volumes are served here (False: CSI only).
        `read_as_pod`: CSI volumes' objects are read with their pods' tokens. `csi_sources(pod)`:
        what the pod's CSI volumes serve (`fusevol.csi.attributes.pod_sources`; None: nothing is
        tracked before a publish)."""
        self._csi_sources = csi_sources
        self._pod_volumes = pod_volumes
        self.node_identity: str | None = None
        """The node this client authenticates as (`system:node:<name>`), else None."""
        self._csi = CsiVolumes(client=client, read_as_pod=read_as_pod)
        self._client = client
        self._recorder = recorder
        self._selected = (
            None
            if recorder is None
            else SelectedClaims(client=client, node_name=node_name, on_change=self._claim_changed)
        )
        self._node_name = node_name
        self._store = store
        self._settings = settings
        self._origin = client.host
        self.tokens = TokenManager(client=client, store=store)
        self.events = EventRecorder(client=client, node_name=node_name)
        self._pods: dict[ObjectKey, Pod] = {}
        self._digests: dict[ObjectKey, bytes] = {}
        """Per pod, a digest of what it was converted from, its status left out (`_digest`)."""
        self._expected: dict[ObjectKey, str] = {}
        """The pods whose CSI volumes' references are tracked ahead of their publishes
        (`_expect_csi`), with the uid they were read from."""
        self._objects: ObjectTracker | None = None
        self._pod_reflector: Reflector | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Steps 1-5 of the module docstring; runs until cancelled."""
        strategy = self._settings.change_detection
        await self._identify()
        async with trio.open_nursery() as nursery:
            self._objects = self._trackers(nursery)
            nursery.start_soon(self.tokens.run)
            nursery.start_soon(self.events.run)
            self._pod_reflector = pods = Reflector(  # (1)
                client=self._client,
                query=Query(Kind.POD, None, f"spec.nodeName={self._node_name}"),
                handler=Callbacks(self._replace_pods, self._pod_event),
            )
            nursery.start_soon(pods.run)
            await pods.synced.wait()
            if self._recorder is not None:
                nursery.start_soon(
                    functools.partial(
                        self._recorder.run,
                        claim_read=self._objects.read,
                        on_change=self._claim_changed,
                    )
                )
                if self._selected is not None:
                    nursery.start_soon(self._selected.run)
                await self._recorder.synced.wait()
                self._objects.set_wanted(self._wanted())
                await self._objects.ensure(self._recorder.claim_keys(), timeout_s=math.inf)
            self._store.mark_synced()  # (4)
            log.info(
                "kubernetes source synced server=%s node=%s pods=%d change_detection=%s",
                self._origin,
                self._node_name,
                len(self._pods),
                strategy.value,
            )
            task_status.started()
            if strategy is not ChangeDetection.WATCH or self.node_identity is not None:
                while True:  # (5)
                    await trio.sleep(self._settings.sync_period_s)
                    await self._objects.sync()

    async def _identify(self) -> None:
        """Who the API server says the agent is; as a node, what the Node authorizer denies is
        switched off (`identity` says so in one line)."""
        self.node_identity = await identify(
            self._client, node_name=self._node_name, sync_period_s=self._settings.sync_period_s
        )
        if self.node_identity is not None:
            self._recorder = self._selected = None

    def _trackers(self, nursery: trio.Nursery) -> ObjectTracker:
        """The trackers, routed by who reads each object (`identity`)."""
        return object_trackers(
            settings=self._settings,
            client=self._client,
            store=self._store,
            nursery=nursery,
            origin=self._origin,
            as_node=self.node_identity is not None,
            on_claim=self._claim_changed,
            read_as_pod=self._csi.reads_as_pod,
            client_for=self._csi.client_for,
        )

    def volume_failed(self, volume: VolumeToServe, error: str) -> None:
        """kubelet's FailedMount event on the volume's pod (rate-limited, never blocks). Not for
        a CSI volume: its failure reaches kubelet as the publish's error, and kubelet records
        the event."""
        if volume.target is None:
            self.events.failed_mount(volume.pod, volume.spec_name, self._refused(volume, error))

    def _refused(self, volume: VolumeToServe, error: str) -> str:
        """`error`, and why the API server did not give the volume's objects, if it refused."""
        if self._objects is None:
            return error
        keys = sorted(self._volume_references(volume.pod, volume.volume.source), key=str)
        refusal = next(filter(None, map(self._objects.refusal, keys)), "")
        return f"{error} (the API server refused to give it: {refusal})" if refusal else error

    def volume_frozen(self, pod: Pod, spec_name: str, message: str) -> None:
        """A Warning event `FrozenVolume` on the pod (fusevol.observe.frozen)."""
        self.events.warning(pod, "FrozenVolume", message)

    def statistics(self) -> KubeSourceStatistics:
        stats = self._pod_reflector.stats if self._pod_reflector is not None else None
        return KubeSourceStatistics(
            pods=len(self._pods),
            pod_lists=stats.lists if stats else 0,
            pod_watch_events=stats.events if stats else 0,
            objects=self._objects.statistics() if self._objects else TrackerStatistics(0, 0, 0, 0),
            tokens=self.tokens.statistics(),
            events_recorded=self.events.recorded,
            events_dropped=self.events.dropped,
            api=self._client.statistics(),
        )

    async def _replace_pods(self, items: Items) -> None:
        """A (re)list: the complete set of this node's pods."""
        listed: dict[ObjectKey, Pod] = {}
        kept: set[ObjectKey] = set()  # listed, but invalid: their previous version stays
        for raw in items:
            pod = convert(raw, origin=self._origin)
            if isinstance(pod, Pod):
                listed[pod.key] = pod
                self._digests[pod.key] = _digest(raw)
                self._expect_csi(pod)
            else:
                kept.add(_key_of(raw))
        items.clear()  # freed now, not after the delivery's wait for thousands of objects
        await self._deliver(list(listed.values()), removed=self._pods.keys() - listed.keys() - kept)

    async def _pod_event(self, kind: str, raw: Obj) -> None:
        if kind == "DELETED":
            await self._deliver([], removed={_key_of(raw)})
            return
        key, digest = _key_of(raw), _digest(raw)
        if self._digests.get(key) == digest and key in self._pods:
            return  # its status changed (kubelet's updates): nothing a volume shows
        if isinstance(pod := convert(raw, origin=self._origin), Pod):
            self._digests[key] = digest
            self._expect_csi(pod)
            await self._deliver([pod], removed=set())

    def _expect_csi(self, pod: Pod) -> None:
        """Track what the pod's `fusevol.io` volumes reference, as kubelet will publish them
        (module docstring). Once per pod (a pod's volumes never change), until it stops
        (`Pod.stopping`)."""
        if self._csi_sources is None or self._pod_volumes or self._csi.read_as_pod:
            return
        if pod.stopping:  # kubelet publishes nothing more for it: nothing to expect
            if self._expected.pop(pod.key, None) is not None:
                self._csi.expect(_expecting(pod.key), set())
            return
        if self._expected.get(pod.key) == pod.uid:
            return
        self._expected[pod.key] = pod.uid
        keys: set[ObjectKey] = set()
        for source in self._csi_sources(pod):
            keys |= self._volume_references(pod, source)
        if self.node_identity is not None:  # what the Node authorizer lets this node read
            keys &= self._references([pod])
        self._csi.expect(_expecting(pod.key), keys)

    async def _deliver(self, pods: list[Pod], *, removed: set[ObjectKey]) -> None:
        """Steps 2-3 for `pods` (added or updated) and the pods at `removed` (gone)."""
        assert self._objects is not None
        keyed = [(pod.key, pod) for pod in pods]  # one key object for both tables
        changed = [pod for key, pod in keyed if self._pods.get(key) != pod]
        for key in removed:
            self._digests.pop(key, None)
            if self._pods.pop(key, None) is not None:
                self._store.delete(key)
            if self._expected.pop(key, None) is not None:
                self._csi.expect(_expecting(key), set())
        self._pods.update(keyed)
        # (2) The claims first: the volumes they are bound to are known once they are read.
        ensured: set[ObjectKey] = set()
        while wanted := self._references(self._served(changed)) - ensured:
            self._objects.set_wanted(self._wanted())
            await self._objects.ensure(wanted, timeout_s=REFERENCE_TIMEOUT_S)
            ensured |= wanted
        self._objects.set_wanted(self._wanted())
        if self._pod_volumes:
            await self.tokens.ensure(self._served(changed))
        # (3)
        for key, pod in keyed:
            self._store.upsert(pod, key)
        self.tokens.retain(self._token_users())
        self.events.forget({pod.uid for pod in self._pods.values()})

    async def track(
        self,
        owner: str,
        pod: Pod,
        volume: Volume | None,
        *,
        tokens: bool = False,
        pod_tokens: Mapping[str, bytes] | None = None,
    ) -> str:
        """Keep what `volume` (a CSI volume of `pod`) references tracked for `owner`, as a pod's
        references are, and await its first copy; with `tokens`, get its serviceAccountToken
        projections' tokens by TokenRequest as for a pod's (kubelet passed none). None: stop.
        `pod_tokens`: kubelet's tokens by audience (read as the pod: module docstring).
        Returns why the volume may not be served ("" if it may): the API server refused an
        object, to the pod or to the agent. `ApiUnavailable` if the pod's read had no answer."""
        keys = set() if volume is None else self._volume_references(pod, volume.source)
        refusal = await self._csi.track(
            owner, pod, volume, keys, tokens=tokens, pod_tokens=pod_tokens
        )
        if refusal:
            return refusal  # what it tracked (a republish refused), it keeps tracking
        self.tokens.retain(self._token_users())
        if self._objects is not None:
            self._objects.set_wanted(self._wanted())
            if keys:
                await self._objects.ensure(keys, timeout_s=REFERENCE_TIMEOUT_S)
                refusal = self._refusal(keys)
                if refusal and (unread := {k for k in keys if self._refused_unread(k)}):
                    # Refused before this publish (read when the pod came, maybe before the
                    # Node authorizer knew it): read afresh once, now.
                    self._objects.set_wanted(self._wanted() - unread)
                    self._objects.set_wanted(self._wanted())
                    await self._objects.ensure(unread, timeout_s=REFERENCE_TIMEOUT_S)
                    refusal = self._refusal(keys)
        if (token_pod := self._csi.token_pod(owner)) is not None:
            await self.tokens.ensure([token_pod])
        return refusal

    def _refusal(self, keys: set[ObjectKey]) -> str:
        assert self._objects is not None
        return next(filter(None, map(self._objects.refusal, sorted(keys, key=str))), "")

    def _refused_unread(self, key: ObjectKey) -> bool:
        """Refused, and never read: nothing of it to lose by reading it afresh."""
        assert self._objects is not None
        return bool(self._objects.refusal(key)) and self._store.get(key) is None

    def _token_users(self) -> list[Pod]:
        """The pods whose projections get tokens here: this node's pods with their own volumes
        (not under CSI), and the CSI volumes' whose tokens kubelet did not pass."""
        return [*self._served(self._pods.values()), *self._csi.token_pods()]

    def _claim_changed(self) -> None:
        """A claim was bound (or rebound), or the PVs provisioned here changed: track the volume
        it names, the claims they are for."""
        if self._objects is not None:
            self._objects.set_wanted(self._wanted())

    def _wanted(self) -> set[ObjectKey]:
        """Everything to track: the pods' references, the claims of the PVs provisioned here, the
        claims selected for this node (and what they reference)."""
        keys = self._references(self._served(self._pods.values())) | self._csi.referenced()
        if self._recorder is not None:
            keys |= self._recorder.claim_keys()
        if self._selected is not None:
            for key in self._selected.keys:
                keys |= self._claim_references(key)
        return keys

    def _served(self, pods: Iterable[Pod]) -> list[Pod]:
        """Those of `pods` whose own volumes are served here: none under CSI, and never a
        finished pod's (the populator tears them down)."""
        return [pod for pod in pods if not pod.finished] if self._pod_volumes else []

    def _references(self, pods: Iterable[Pod]) -> set[ObjectKey]:
        return pod_references(pods, store=self._store, as_node=self.node_identity is not None)

    def _volume_references(self, pod: Pod, source: VolumeSource) -> set[ObjectKey]:
        return volume_references(
            pod, source, store=self._store, as_node=self.node_identity is not None
        )

    def _claim_references(self, claim_key: ObjectKey) -> set[ObjectKey]:
        return claim_references(
            claim_key, store=self._store, as_node=self.node_identity is not None
        )


def _digest(raw: Obj) -> bytes:
    """What a pod's conversion reads (its metadata and spec, whether it has finished), without
    what changes with every update of its status: kubelet updates a starting pod's status four
    or five times, each a conversion of the whole pod, a store change and a reconciler pass that
    changed nothing, in the middle of the pod's set-up (a burst of 20 pods: a hundred of them).
    The pod as stored keeps the resourceVersion of its last change that counts."""
    metadata = raw.get("metadata")
    if isinstance(metadata, dict):
        metadata = {k: v for k, v in metadata.items() if k not in _VOLATILE}
    status = raw.get("status")
    finished = isinstance(status, dict) and status.get("phase") in TERMINAL_PHASES
    text = json.dumps([metadata, raw.get("spec"), finished], sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


_VOLATILE = frozenset({"resourceVersion", "managedFields"})
"""Metadata that a status update changes, and that no conversion reads but the version."""


def _expecting(pod: ObjectKey) -> str:
    """The owner of a pod's CSI references, before its publishes (`CsiVolumes.expect`)."""
    return f"pod {pod.namespace}/{pod.name}"


def _key_of(raw: Obj) -> ObjectKey:
    meta = raw.get("metadata") or {}
    return ObjectKey(Kind.POD, str(meta.get("namespace") or "default"), str(meta.get("name")))
