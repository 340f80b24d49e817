"""KubeSource: this node's pods and what their volumes need, from the Kubernetes API.

Owns the API -> store direction when fusevol runs against a cluster:

1. The pods: one list+watch across namespaces with fieldSelector `spec.nodeName=<node>` (a
   `Reflector`: relist on 410, bookmarks, reconnect with backoff).
2. For every pod added or changed, before it reaches the store: what it references (ConfigMaps and
   Secrets of configMap, secret and projected volumes; claims, then the PersistentVolumes they are
   bound to) is tracked by the change-detection strategy (`objects`), and the first copy awaited
   (at most `REFERENCE_TIMEOUT_S`), and its serviceAccountToken projections get their tokens
   (`tokens`). So a new pod's volumes are set up once, with their content, instead of failing first
   on objects not read yet (kubelet's managers wait for the first sync the same way).
3. Deliver: the pod to the store; references and tokens no pod needs any more are dropped.
4. After the first complete pod list (steps 2-3 for all of them): `store.mark_synced()` and ready.
5. Cache and Get: refetch at every sync period.

With a `KubeVolumeRecorder` (the hostpath provisioner's, `provisioned`), its list+watch of the PVs
this node provisioned runs too and is read before (4), and the claims of those PVs stay tracked
(and their first copy awaited before (4)) even when no pod of this node uses them: the provisioner
deletes a volume whose claim is gone, so a claim merely not read yet must never look gone. An
unbound claim of a pod brings its StorageClass along (tracked by the same strategy), which says
whether this node provisions it. So do the unbound claims the scheduler selected this node for
(`selected`): their pods get a node only once the claim is bound.

Who the agent is decides what it asks for (`whoami`, at the start). A node's identity (kubelet's
credentials: user `system:node:<name>`, group `system:nodes`) works within kube's Node authorizer:
this node's pods, the ConfigMaps and Secrets they reference (watched by name, as here), their
claims and PersistentVolumes by GET only (fetched, then again every sync period), tokens bound to
its pods. What the Node authorizer never allows a node is switched off, with one line at the
start: the hostpath provisioner's PV writes and its list+watch of PVs, the list+watch of every
claim (`selected`), StorageClasses. A CSI volume's objects are no pod's reference in the Node
authorizer's graph: read as the node they are refused, and the publish says so.

With `pod_volumes` False (CSI: kubelet serves the pods' own volumes) only what CSI volumes
reference is tracked, and no token is requested for the pods' own projections. With `read_as_pod`
(CSI, `--csi-read-as pod`) a CSI volume's ConfigMaps and Secrets are read with its pod's own
token, the one kubelet passes for the API server's audience (""): `track` GETs each as the pod
at every publish and republish (a refusal is the publish's PERMISSION_DENIED, naming the object
and the service account, as the API server's message does), and a watch per object, one however
many pods use it, runs with the freshest token of a pod allowed to read it. A watch outlives its
token (the API server authenticates a request when it starts), and is reopened every 5-10 min
(the reflector's timeout) with the token of the latest republish; if none is valid then, or the
pod lost its permission (a refused republish changes nothing already tracked), the watch is
refused and retried with backoff, and the volume keeps its last content.

Pods are converted by the manifest source's converter (`fusevol.decode.objects.convert_object`),
so API objects and manifests follow the same defaulting and validation. A pod that does not
convert keeps its previous version (one ERROR line). Failed volumes are reported as Events by
`events`, which the reconciler reaches through the callback `app.py` gives it.

Excludes: the client adapter (`client`), list/watch mechanics (`reflector`), strategies
(`objects`), tokens and events.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from fusevol.base.settings import ChangeDetection
from fusevol.kube.client import ApiError, ApiUnavailable
from fusevol.kube.documents import convert
from fusevol.kube.events import EventRecorder
from fusevol.kube.reflector import Backoff, Callbacks, Query, Reflector
from fusevol.model import (
    Kind,
    ObjectKey,
    PersistentVolumeClaim,
    PersistentVolumeClaimVolumeSource,
    Pod,
    Volume,
    VolumeSource,
    referenced_objects,
)
from fusevol.source.kube.objects import (
    FetchedObjects,
    ObjectTracker,
    RoutedObjects,
    TrackerStatistics,
    WatchedObjects,
)
from fusevol.source.kube.selected import SelectedClaims
from fusevol.source.kube.tokens import TokenManager, TokenStatistics

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from fusevol.base.settings import KubeSettings
    from fusevol.kube.client import ClientStatistics, Identity, KubeClient, Obj
    from fusevol.kube.listing import Items
    from fusevol.kube.provisioned import KubeVolumeRecorder
    from fusevol.volumemanager.cache.desired import VolumeToServe
    from fusevol.volumemanager.cache.store import ObjectStore

log = logging.getLogger(__name__)

REFERENCE_TIMEOUT_S = 5.0
"""How long a new pod waits for the first copy of its objects before it is delivered anyway (its
volumes then fail and are retried, like under an API server that does not answer); watched
objects, which start a few at a time, count it from the last watch that started."""
POD_AUDIENCE = ""
"""The audience of the pod token a CSI volume is read with (`read_as_pod`): the API server's own
(a CSIDriver `tokenRequests` entry `{audience: ""}`)."""
_NODE_FETCHED = (Kind.PERSISTENT_VOLUME_CLAIM, Kind.PERSISTENT_VOLUME)
"""What the Node authorizer lets a node get, but not list or watch."""


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
    ) -> None:
        """`pod_volumes`: the pods' own volumes are served here (False: CSI only).
        `read_as_pod`: CSI volumes' objects are read with their pods' tokens."""
        self._pod_volumes = pod_volumes
        self._read_as_pod = read_as_pod
        self.node_identity: str | None = None
        """The node this client authenticates as (`system:node:<name>`), else None."""
        self._as_pod: dict[str, frozenset[ObjectKey]] = {}
        """CSI volume -> the objects read with its pod's token."""
        self._pod_tokens: dict[ObjectKey, str] = {}
        """An object read as a pod -> the token of the latest pod allowed to read it."""
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
        self._extra: dict[str, set[ObjectKey]] = {}
        """What CSI volumes reference (`track`), by volume."""
        self._token_pods: dict[str, Pod] = {}
        """A pod with just its CSI volume, for each CSI volume whose tokens are requested here."""
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
        switched off (one line)."""
        identity = await self._whoami()
        node = identity.node if identity is not None else None
        if node is None:
            return
        self.node_identity = node
        self._recorder = self._selected = None
        log.info(
            "node identity user=system:node:%s: the Node authorizer lets a node get claims and "
            "PersistentVolumes (not list or watch them), and neither read StorageClasses nor "
            "write PersistentVolumes: claims and volumes are read by GET every %gs, hostpath "
            "provisioning and the watch of the cluster's claims are off",
            node,
            self._settings.sync_period_s,
        )
        if node != self._node_name:
            log.error(
                "node identity system:node:%s is not node %s: the API server will refuse the "
                "objects of its pods",
                node,
                self._node_name,
            )

    async def _whoami(self) -> Identity | None:
        backoff = Backoff()
        while True:
            try:
                return await self._client.whoami()
            except ApiError as exc:  # no SelfSubjectReview: a ServiceAccount's rules apply
                log.debug("who am I: not answered, taking no node identity: %s", exc)
                return None
            except ApiUnavailable as exc:
                delay = backoff.next_delay()
                log.warning("who am I: no answer retry_in=%.1fs error=%s", delay, exc)
                await trio.sleep(delay)

    def _trackers(self, nursery: trio.Nursery) -> ObjectTracker:
        """The change-detection strategy's tracker; as a node, claims and volumes fetched; read
        as a pod, a watch with its token (module docstring)."""
        strategy = self._settings.change_detection
        if strategy is ChangeDetection.WATCH:
            own: ObjectTracker = WatchedObjects(
                client=self._client,
                store=self._store,
                nursery=nursery,
                origin=self._origin,
                on_claim=self._claim_changed,
            )
        else:
            ttl = self._settings.cache_ttl_s if strategy is ChangeDetection.CACHE else None
            own = FetchedObjects(
                client=self._client,
                store=self._store,
                ttl_s=ttl,
                origin=self._origin,
                on_claim=self._claim_changed,
            )
        trackers = [own]
        if self.node_identity is not None and strategy is ChangeDetection.WATCH:
            trackers.append(
                FetchedObjects(
                    client=self._client,
                    store=self._store,
                    ttl_s=None,
                    origin=self._origin,
                    on_claim=self._claim_changed,
                )
            )
        fetched = len(trackers) - 1
        trackers.append(
            WatchedObjects(
                client=self._client,
                store=self._store,
                nursery=nursery,
                origin=self._origin,
                on_claim=self._claim_changed,
                client_for=self._pod_client,
            )
        )
        as_pod = len(trackers) - 1

        def route(key: ObjectKey) -> int:
            if key in self._pod_tokens:
                return as_pod
            return fetched if key.kind in _NODE_FETCHED else 0

        return RoutedObjects(trackers=tuple(trackers), route=route)

    def _pod_client(self, key: ObjectKey) -> KubeClient:
        """The client that reads `key` as a pod: the freshest token of a pod allowed to."""
        return self._client.with_authorization(lambda: f"Bearer {self._pod_tokens.get(key, '')}")

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
            else:
                kept.add(_key_of(raw))
        items.clear()  # freed now, not after the delivery's wait for thousands of objects
        await self._deliver(list(listed.values()), removed=self._pods.keys() - listed.keys() - kept)

    async def _pod_event(self, kind: str, raw: Obj) -> None:
        if kind == "DELETED":
            await self._deliver([], removed={_key_of(raw)})
        elif isinstance(pod := convert(raw, origin=self._origin), Pod):
            await self._deliver([pod], removed=set())

    async def _deliver(self, pods: list[Pod], *, removed: set[ObjectKey]) -> None:
        """Steps 2-3 for `pods` (added or updated) and the pods at `removed` (gone)."""
        assert self._objects is not None
        keyed = [(pod.key, pod) for pod in pods]  # one key object for both tables
        changed = [pod for key, pod in keyed if self._pods.get(key) != pod]
        for key in removed:
            if self._pods.pop(key, None) is not None:
                self._store.delete(key)
        self._pods.update(keyed)
        # (2) The claims first: the volumes they are bound to are known once they are read.
        ensured: set[ObjectKey] = set()
        while wanted := self._references(changed if self._pod_volumes else ()) - ensured:
            self._objects.set_wanted(self._wanted())
            await self._objects.ensure(wanted, timeout_s=REFERENCE_TIMEOUT_S)
            ensured |= wanted
        self._objects.set_wanted(self._wanted())
        if self._pod_volumes:
            await self.tokens.ensure(changed)
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
        if self._read_as_pod and volume is not None and keys:
            token = (pod_tokens or {}).get(POD_AUDIENCE)
            if refusal := await self._read_as(pod, keys, token):
                return refusal  # what it tracked (a republish refused), it keeps tracking
            self._as_pod[owner] = frozenset(keys)
        refusal = ""
        if not keys:
            self._as_pod.pop(owner, None)
        self._pod_tokens = {
            key: token for key, token in self._pod_tokens.items() if self._read_by_pod(key)
        }
        if keys:
            self._extra[owner] = keys
        else:
            self._extra.pop(owner, None)
        if tokens and volume is not None:
            self._token_pods[owner] = dataclasses.replace(pod, volumes=(volume,))
        else:
            self._token_pods.pop(owner, None)
        self.tokens.retain(self._token_users())
        if self._objects is not None:
            self._objects.set_wanted(self._wanted())
            if keys:
                await self._objects.ensure(keys, timeout_s=REFERENCE_TIMEOUT_S)
                refusal = next(filter(None, map(self._objects.refusal, sorted(keys, key=str))), "")
        if owner in self._token_pods:
            await self.tokens.ensure([self._token_pods[owner]])
        return refusal

    async def _read_as(self, pod: Pod, keys: set[ObjectKey], token: bytes | None) -> str:
        """GET each of `keys` as `pod` (its `token`): "" if it may read them all (the token then
        reads them from now on), else why not."""
        account = f"system:serviceaccount:{pod.namespace}:{pod.service_account_name}"
        if token is None:
            return (
                f"read as the pod ({account}): kubelet passed no token for the API server's "
                f"audience in csi.storage.k8s.io/serviceAccount.tokens: the CSIDriver's "
                f'tokenRequests must list {{audience: ""}}'
            )
        reader = self._client.with_token(token.decode())
        for key in sorted(keys, key=str):
            try:
                await reader.get(key.kind, namespace=key.namespace, name=key.name)
            except ApiError as exc:
                if exc.code in (401, 403):
                    log.info(
                        "read as pod refused object=%s pod=%s/%s error=%s",
                        key,
                        pod.namespace,
                        pod.name,
                        exc,
                    )
                    return f"read as the pod ({account}): {exc}"
                raise ApiUnavailable(f"read {key} as the pod ({account}): {exc}") from None
        for key in keys:
            self._pod_tokens[key] = token.decode()
        return ""

    def _read_by_pod(self, key: ObjectKey) -> bool:
        return any(key in keys for keys in self._as_pod.values())

    def _token_users(self) -> list[Pod]:
        """The pods whose projections get tokens here: this node's pods with their own volumes
        (not under CSI), and the CSI volumes' whose tokens kubelet did not pass."""
        pods = list(self._pods.values()) if self._pod_volumes else []
        return [*pods, *self._token_pods.values()]

    def _claim_changed(self) -> None:
        """A claim was bound (or rebound), or the PVs provisioned here changed: track the volume
        it names, the claims they are for."""
        if self._objects is not None:
            self._objects.set_wanted(self._wanted())

    def _wanted(self) -> set[ObjectKey]:
        """Everything to track: the pods' references, the claims of the PVs provisioned here, the
        claims selected for this node (and what they reference)."""
        pods = self._pods.values() if self._pod_volumes else ()
        keys = self._references(pods).union(*self._extra.values())
        if self._recorder is not None:
            keys |= self._recorder.claim_keys()
        if self._selected is not None:
            for key in self._selected.keys:
                keys |= self._claim_references(key)
        return keys

    def _references(self, pods: Iterable[Pod]) -> set[ObjectKey]:
        keys: set[ObjectKey] = set()
        for pod in pods:
            for volume in pod.volumes:
                keys.update(self._volume_references(pod, volume.source))
        return keys

    def _volume_references(self, pod: Pod, source: VolumeSource) -> set[ObjectKey]:
        """What to track for one volume: the ConfigMaps and Secrets it shows (tokens are
        requested, not watched), or a claim's objects."""
        if isinstance(source, PersistentVolumeClaimVolumeSource):
            return self._claim_references(
                ObjectKey(Kind.PERSISTENT_VOLUME_CLAIM, pod.namespace, source.claim_name)
            )
        return {
            key
            for key in referenced_objects(pod, source)
            if key.kind in (Kind.CONFIG_MAP, Kind.SECRET)
        }

    def _claim_references(self, claim_key: ObjectKey) -> set[ObjectKey]:
        """The claim, and its volume once bound, else its class (which says who provisions it)."""
        claim = self._store.get(claim_key, PersistentVolumeClaim)
        if claim is None:
            return {claim_key}
        if not claim.volume_name:
            if not claim.storage_class_name or self.node_identity is not None:
                return {claim_key}
            return {claim_key, ObjectKey(Kind.STORAGE_CLASS, "", claim.storage_class_name)}
        return {claim_key, ObjectKey(Kind.PERSISTENT_VOLUME, "", claim.volume_name)}


def _key_of(raw: Obj) -> ObjectKey:
    meta = raw.get("metadata") or {}
    return ObjectKey(Kind.POD, str(meta.get("namespace") or "default"), str(meta.get("name")))
