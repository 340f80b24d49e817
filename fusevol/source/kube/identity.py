"""Who the agent is to the API server, and so as whom and how each object is read.

Who the agent is decides what it asks for (`identify`: `whoami`, at the start). A node's identity
(kubelet's credentials: user `system:node:<name>`, group `system:nodes`) works within kube's Node
authorizer: this node's pods, the ConfigMaps and Secrets they reference (watched by name, as
here), their claims and PersistentVolumes by GET only (fetched, then again every sync period),
tokens bound to its pods. What the Node authorizer never allows a node is switched off by the
source, with one line at the start: the hostpath provisioner's PV writes and its list+watch of
PVs, the list+watch of every claim (`selected`), StorageClasses. A CSI volume's objects are no
pod's reference in the Node authorizer's graph: read as the node they are refused, and the
publish says so.

`object_trackers` routes each object to the tracker that reads it (`objects.RoutedObjects`): the
change-detection strategy's, under a node's identity a GET for claims and PersistentVolumes, and
a watch with a pod's token for what a CSI volume reads as its pod (`csi_volumes`).

Excludes: the strategies themselves (`objects`), which objects are wanted (`source`,
`references`, `csi_volumes`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from fusevol.base.settings import ChangeDetection
from fusevol.kube.backoff import Backoff
from fusevol.kube.errors import ApiError, ApiUnavailable
from fusevol.model import Kind
from fusevol.source.kube.objects import FetchedObjects, ObjectTracker, RoutedObjects, WatchedObjects

if TYPE_CHECKING:
    from collections.abc import Callable

    from fusevol.base.settings import KubeSettings
    from fusevol.kube.client import Identity, KubeClient
    from fusevol.model import ObjectKey
    from fusevol.volumemanager.cache.store import ObjectStore

log = logging.getLogger(__name__)

_NODE_FETCHED = (Kind.PERSISTENT_VOLUME_CLAIM, Kind.PERSISTENT_VOLUME)
"""What the Node authorizer lets a node get, but not list or watch."""


async def identify(client: KubeClient, *, node_name: str, sync_period_s: float) -> str | None:
    """The node the API server says the agent is (`system:node:<name>`), else None; as a node,
    one line says what the Node authorizer denies (the source switches it off)."""
    identity = await _whoami(client)
    node = identity.node if identity is not None else None
    if node is None:
        return None
    log.info(
        "node identity user=system:node:%s: the Node authorizer lets a node get claims and "
        "PersistentVolumes (not list or watch them), and neither read StorageClasses nor "
        "write PersistentVolumes: claims and volumes are read by GET every %gs, hostpath "
        "provisioning and the watch of the cluster's claims are off",
        node,
        sync_period_s,
    )
    if node != node_name:
        log.error(
            "node identity system:node:%s is not node %s: the API server will refuse the "
            "objects of its pods",
            node,
            node_name,
        )
    return node


async def _whoami(client: KubeClient) -> Identity | None:
    backoff = Backoff()
    while True:
        try:
            return await client.whoami()
        except ApiError as exc:  # no SelfSubjectReview: a ServiceAccount's rules apply
            log.debug("who am I: not answered, taking no node identity: %s", exc)
            return None
        except ApiUnavailable as exc:
            delay = backoff.next_delay()
            log.warning("who am I: no answer retry_in=%.1fs error=%s", delay, exc)
            await trio.sleep(delay)


def object_trackers(
    *,
    settings: KubeSettings,
    client: KubeClient,
    store: ObjectStore,
    nursery: trio.Nursery,
    origin: str,
    as_node: bool,
    on_claim: Callable[[], None],
    read_as_pod: Callable[[ObjectKey], bool],
    client_for: Callable[[ObjectKey], KubeClient],
) -> ObjectTracker:
    """The change-detection strategy's tracker; `as_node`, claims and volumes fetched; what
    `read_as_pod` says is, a watch with `client_for` (module docstring)."""
    strategy = settings.change_detection
    if strategy is ChangeDetection.WATCH:
        own: ObjectTracker = WatchedObjects(
            client=client,
            store=store,
            nursery=nursery,
            origin=origin,
            on_claim=on_claim,
        )
    else:
        ttl = settings.cache_ttl_s if strategy is ChangeDetection.CACHE else None
        own = FetchedObjects(
            client=client,
            store=store,
            ttl_s=ttl,
            origin=origin,
            on_claim=on_claim,
        )
    trackers = [own]
    if as_node and strategy is ChangeDetection.WATCH:
        trackers.append(
            FetchedObjects(
                client=client,
                store=store,
                ttl_s=None,
                origin=origin,
                on_claim=on_claim,
            )
        )
    fetched = len(trackers) - 1
    trackers.append(
        WatchedObjects(
            client=client,
            store=store,
            nursery=nursery,
            origin=origin,
            on_claim=on_claim,
            client_for=client_for,
        )
    )
    as_pod = len(trackers) - 1

    def route(key: ObjectKey) -> int:
        if read_as_pod(key):
            return as_pod
        return fetched if key.kind in _NODE_FETCHED else 0

    return RoutedObjects(trackers=tuple(trackers), route=route)
