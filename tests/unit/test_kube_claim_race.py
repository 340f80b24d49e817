"""A provisioned PV is never reclaimed because its claim is merely not tracked or not read yet.

The bug pinned here: the agent deleted the PV it had just created. The scheduler's selected claim
was tracked because `SelectedClaims` listed it; the PV controller bound the claim during the PV's
create, so the all-claims watch dropped it (bound, no longer "selected") before the create had
answered and the recorder knew the PV: for that moment nothing wanted the claim, its per-name watch
was closed (the claim left the store) and reopened, and the reconciler's `to_reclaim` read "no
claim" as "claim gone".

Here the real `KubeSource`, `KubeVolumeRecorder` and `HostPathProvisioner` run against a scripted
client whose watch events the test sends itself, in the order that produced the deletion: the
lowest level at which the race shows, without timing luck. A claim is gone on a DELETED event or a
relist without it, never because its watch was (re)opened.
"""

from __future__ import annotations

import copy
import queue
import threading
from typing import TYPE_CHECKING, Any

import pytest
import trio

from fusevol.base.settings import KubeSettings
from fusevol.kube.provisioned import NODE_LABEL, KubeVolumeRecorder
from fusevol.model import Kind, ObjectKey, PersistentVolumeClaim, StorageClass
from fusevol.provision.hostpath import PROVISIONER, ClaimToProvision, HostPathProvisioner
from fusevol.source.kube.source import KubeSource
from fusevol.volumemanager.cache.store import ObjectStore

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

Obj = dict[str, Any]
NODE = "node-a"
CLAIM = ObjectKey(Kind.PERSISTENT_VOLUME_CLAIM, "default", "data")
CLAIM_UID = "da7a0000-0000-4000-8000-000000000001"
PV_NAME = f"pvc-{CLAIM_UID}"
"""The name the provisioner gives the claim's PV."""


class Stream:
    """One watch: events the test sends; `idle` once it waits for more (or is closed). Its
    reader waits in `next_event`, or parks (`park`) as on the agent's HTTP/2 connection."""

    def __init__(self, kind: Kind, field_selector: str, label_selector: str) -> None:
        self.kind, self.field_selector, self.label_selector = kind, field_selector, label_selector
        self.events: queue.Queue[Obj | None] = queue.Queue()
        self.closed = False
        self.waiting = threading.Event()
        self._lock = threading.Lock()
        self._parked: tuple[trio.lowlevel.TrioToken, Callable[[], None]] | None = None

    def matches(self, kind: Kind, obj: Obj) -> bool:
        meta = obj["metadata"]
        if kind is not self.kind:
            return False
        if self.field_selector and self.field_selector != f"metadata.name={meta['name']}":
            return False
        key, _, value = self.label_selector.partition("=")
        return not key or (meta.get("labels") or {}).get(key) == value

    def put(self, event: Obj | None) -> None:
        """From any thread: a parked reader is called on the trio thread."""
        with self._lock:
            self.events.put(event)
            parked, self._parked = self._parked, None
        if parked is not None:
            token, callback = parked
            token.run_sync_soon(callback)

    async def next_event(self) -> Obj | None:
        if self.closed:
            return None
        self.waiting.set()
        try:
            return await trio.to_thread.run_sync(self.events.get, abandon_on_cancel=True)
        finally:
            self.waiting.clear()

    def ready(self) -> bool:
        return self.closed or not self.events.empty()

    def park(self, callback: Callable[[], None]) -> None:
        token = trio.lowlevel.current_trio_token()
        with self._lock:
            if self.events.empty():
                self._parked = (token, callback)
                return
        token.run_sync_soon(callback)

    def close(self) -> None:
        self.closed = True
        self._parked = None
        self.events.put(None)

    def idle(self) -> bool:
        waiting = self.waiting.is_set() or self._parked is not None
        return self.closed or (waiting and self.events.empty())


async def _nothing(pv: Obj) -> None:
    pass


GONE = {"type": "ERROR", "object": {"code": 410, "reason": "Expired", "message": ""}}


class ScriptedClient:
    """The calls the Kubernetes source makes, answered from a dict; watches carry what `send`
    sends. `on_create(pv)` runs inside the PV's create, before it answers."""

    host = "scripted"

    def __init__(self) -> None:
        self.objects: dict[tuple[Kind, str], Obj] = {}
        self.streams: list[Stream] = []
        self.lists: list[tuple[Kind, str]] = []
        self.list_gate: dict[str, threading.Event] = {}
        self.listing: set[str] = set()
        self.on_create: Callable[[Obj], Awaitable[None]] = _nothing
        self.deleted: list[str] = []
        self.compacted = 0
        """History before this resourceVersion is gone: a watch from before it gets 410 at
        once, as from the API server (a watch opened after `expire` must relist too)."""
        self.history: list[tuple[int, Kind, Obj]] = []
        """Every event sent: a watch opened from a resourceVersion gets those after it first,
        as from the API server's watch cache."""
        self._lock = threading.RLock()
        self._version = 1
        self.horizon: dict[Kind, int] = {}

    def put(self, kind: Kind, obj: Obj, event: str = "MODIFIED", *, send: bool = True) -> None:
        with self._lock:
            self._version += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self._version)
            if kind is Kind.PERSISTENT_VOLUME_CLAIM:
                obj["metadata"].setdefault("namespace", "default")
            if event == "DELETED":
                self.objects.pop((kind, obj["metadata"]["name"]), None)
            else:
                self.objects[kind, obj["metadata"]["name"]] = obj
            if send:
                self._send(kind, {"type": event, "object": obj})

    def _send(self, kind: Kind, event: Obj) -> None:
        with self._lock:
            self.history.append((self._version, kind, event))
            for stream in self.streams:
                if not stream.closed and stream.matches(kind, event["object"]):
                    stream.put(copy.deepcopy(event))

    def expire(self, kind: Kind, name: str) -> None:
        """The object goes without a DELETED event reaching the watches (compacted away): its
        per-name watch gets 410 Gone, and relists."""
        with self._lock:
            self._version += 1
            del self.objects[kind, name]
            self.compacted = self._version
            for stream in self.streams:
                if stream.kind is kind and stream.field_selector == f"metadata.name={name}":
                    stream.put(GONE)

    def opened(self, kind: Kind, field_selector: str) -> int:
        return sum(1 for s in self.streams if (s.kind, s.field_selector) == (kind, field_selector))

    def idle(self) -> bool:
        return all(stream.idle() for stream in self.streams)

    # -- KubeClient --------------------------------------------------------------------------------

    async def whoami(self) -> None:
        """A server without SelfSubjectReview: no node identity, the ServiceAccount's rules."""
        return None

    async def list(
        self,
        kind: Kind,
        *,
        namespace: str | None,
        field_selector: str = "",
        label_selector: str = "",
        resource_version: str = "",
    ) -> tuple[list[Obj], str]:
        """The current state (never older than `resource_version`)."""
        self.listing.add(field_selector)
        gate = self.list_gate.get(field_selector)
        if gate is not None:
            await trio.to_thread.run_sync(gate.wait)
        self.lists.append((kind, field_selector))
        probe = Stream(kind, field_selector, label_selector)
        with self._lock:
            items = [copy.deepcopy(o) for (k, _), o in self.objects.items() if probe.matches(k, o)]
            version = str(self._version)
        for item in items:
            item.setdefault("kind", kind.value)
        return items, version

    async def open_watch(self, kind: Kind, **query: Any) -> Stream:
        stream = Stream(kind, query["field_selector"], query.get("label_selector", ""))
        with self._lock:
            if int(query["resource_version"]) < self.compacted:
                stream.put(GONE)
            for version, event_kind, event in self.history:
                if version > int(query["resource_version"]) and stream.matches(
                    event_kind, event["object"]
                ):
                    stream.put(copy.deepcopy(event))
            self.streams.append(stream)
        return stream

    async def get(self, kind: Kind, *, namespace: str, name: str) -> Obj | None:
        return copy.deepcopy(self.objects.get((kind, name)))

    async def create_persistent_volume(self, pv: Obj) -> Obj:
        pv = {**copy.deepcopy(pv), "kind": "PersistentVolume", "apiVersion": "v1"}
        self.put(Kind.PERSISTENT_VOLUME, pv, "ADDED", send=False)
        await self.on_create(pv)
        created = self.objects[Kind.PERSISTENT_VOLUME, pv["metadata"]["name"]]
        # The PV's own event, after the claim's: nothing orders the events of two watches.
        self._send(Kind.PERSISTENT_VOLUME, {"type": "ADDED", "object": copy.deepcopy(created)})
        return copy.deepcopy(created)

    async def delete_persistent_volume(self, name: str) -> bool:
        self.deleted.append(name)
        return self.objects.pop((Kind.PERSISTENT_VOLUME, name), None) is not None


def storage_class() -> Obj:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": "local"},
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
    }


def claim(**spec: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": "data",
            "uid": CLAIM_UID,
            "annotations": {"volume.kubernetes.io/selected-node": NODE},
        },
        "spec": {
            "storageClassName": "local",
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            **spec,
        },
    }


async def until(condition: Callable[[], bool]) -> None:
    with trio.fail_after(10):
        while not condition():
            await trio.sleep(0.005)


class Agent:
    """The Kubernetes source, its PV recorder and the provisioner on one store; every removal of
    the claim from the store is recorded."""

    def __init__(self, client: ScriptedClient, root: Path) -> None:
        self.store = ObjectStore()
        self.recorder = KubeVolumeRecorder(client=client, node_name=NODE, provisioner=PROVISIONER)  # type: ignore[arg-type]
        self.source = KubeSource(
            client=client,  # type: ignore[arg-type]
            node_name=NODE,
            store=self.store,
            settings=KubeSettings(),
            recorder=self.recorder,
        )
        self.provisioner = HostPathProvisioner(
            root=root, node_name=NODE, store=self.store, recorder=self.recorder
        )
        self.claim_removed = 0
        delete = self.store.delete

        def counting_delete(key: ObjectKey) -> bool:
            removed = delete(key)
            self.claim_removed += removed and key == CLAIM
            return removed

        self.store.delete = counting_delete  # type: ignore[method-assign]

    def reclaimable(self) -> list[str]:
        return [pv.name for pv in self.provisioner.to_reclaim(in_use=set())]


async def test_a_claim_bound_during_its_pvs_create_is_never_taken_as_gone(tmp_path: Path) -> None:
    client = ScriptedClient()
    client.put(Kind.STORAGE_CLASS, storage_class())
    client.put(Kind.PERSISTENT_VOLUME_CLAIM, claim())
    agent = Agent(client, tmp_path)

    async def pv_controller_binds(pv: Obj) -> None:
        """Inside the create (as the test API server's PV controller does, and as a fast one
        can before the create's answer arrives): the claim is bound, and the claims' watches
        deliver that before the PVs' watch delivers the PV (nothing orders two watches)."""
        client.put(Kind.PERSISTENT_VOLUME_CLAIM, claim(volumeName=pv["metadata"]["name"]))
        await until(client.idle)

    client.on_create = pv_controller_binds
    async with trio.open_nursery() as nursery:
        await nursery.start(agent.source.run)
        await until(lambda: agent.store.get(CLAIM) is not None)
        await until(lambda: len(agent.store.list(Kind.STORAGE_CLASS)) == 1)
        pvc = agent.store.get(CLAIM, PersistentVolumeClaim)
        sc = agent.store.list(Kind.STORAGE_CLASS)[0]
        assert pvc is not None
        assert isinstance(sc, StorageClass)
        await agent.provisioner.provision(ClaimToProvision(pvc, sc))
        # What the reconciler's next pass asks, right after the create answered.
        assert agent.reclaimable() == []
        await until(client.idle)
        assert agent.reclaimable() == []
        bound = agent.store.get(CLAIM, PersistentVolumeClaim)
        assert bound is not None
        assert bound.volume_name == PV_NAME
        assert agent.claim_removed == 0
        assert client.opened(Kind.PERSISTENT_VOLUME_CLAIM, "metadata.name=data") == 1
        assert client.deleted == []
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("how", ["deleted-event", "relist-without-it"])
async def test_a_pv_whose_claim_is_not_read_yet_is_kept_until_the_claim_is_gone(
    tmp_path: Path, how: str
) -> None:
    """A PV of this node appears on the recorder's watch (another generation of the agent created
    it): its claim's watch opens, and until its first list the claim is unknown, not gone. It
    is gone on a DELETED event, or when a relist (after 410 Gone: the deletion compacted away)
    does not have it."""
    client = ScriptedClient()
    client.put(Kind.PERSISTENT_VOLUME_CLAIM, claim(volumeName=PV_NAME))
    gate = client.list_gate["metadata.name=data"] = threading.Event()
    agent = Agent(client, tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(agent.source.run)
        pv = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {
                "name": PV_NAME,
                "labels": {NODE_LABEL: NODE},
                "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER},
            },
            "spec": {
                "local": {"path": str(tmp_path / PV_NAME)},
                "persistentVolumeReclaimPolicy": "Delete",
                "claimRef": {"namespace": "default", "name": "data", "uid": CLAIM_UID},
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "In",
                                        "values": [NODE],
                                    }
                                ]
                            }
                        ]
                    }
                },
            },
        }
        client.put(Kind.PERSISTENT_VOLUME, pv, "ADDED")
        await until(lambda: len(agent.recorder.provisioned()) == 1)
        await until(lambda: "metadata.name=data" in client.listing)
        assert agent.store.get(CLAIM) is None  # its reflector is listing
        assert agent.reclaimable() == []  # not read is not gone
        gate.set()
        await until(lambda: agent.store.get(CLAIM) is not None)
        assert agent.reclaimable() == []
        if how == "deleted-event":
            client.put(Kind.PERSISTENT_VOLUME_CLAIM, claim(volumeName=PV_NAME), "DELETED")
        else:
            client.expire(Kind.PERSISTENT_VOLUME_CLAIM, "data")
        await until(lambda: agent.store.get(CLAIM) is None)
        assert agent.reclaimable() == [PV_NAME]
        nursery.cancel_scope.cancel()
