"""Subtree sharing in `fusevol.volumemanager.reconciler.served`, without FUSE or mounts: which pod
volumes share one subtree on the agent's mount, that an edit is one publish for all of them, and
that a subtree goes with its last user only.

The publisher is a recording stand-in with the real one's contract (a publish of the content a
subtree holds already publishes nothing and returns False); the mount backend is
`fusevol.mount.fake`. tests/fuse/test_sharing.py shows the same on a real agent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pytest
import trio

from fusevol.decode.manifest import parse_manifest
from fusevol.fuse.naming import ConnectionKey
from fusevol.model import Pod
from fusevol.mount.fake import FakeMountBackend
from fusevol.projection.downward import NodeAllocatable
from fusevol.volumemanager.cache.desired import DesiredState, VolumeToServe
from fusevol.volumemanager.cache.store import ObjectStore
from fusevol.volumemanager.populator import Populator
from fusevol.volumemanager.reconciler import served as served_module
from fusevol.volumemanager.reconciler.served import ServedVolumes
from fusevol.volumemanager.reconciler.sharing import SHARED, subtree_name

if TYPE_CHECKING:
    from fusevol.fuse.publish import Publisher, VolumeDir
    from fusevol.model import Payload

MOUNTPOINT = Path("/fake/mnt")


@dataclass
class RecordingPublisher:
    """The calls `ServedVolumes` makes of `fusevol.fuse.publish.Publisher`, and what each subtree
    holds."""

    content: dict[bytes, Payload] = field(default_factory=dict)
    publishes: list[bytes] = field(default_factory=list)
    removed: list[bytes] = field(default_factory=list)
    calls: int = 0
    """Every call of `publish`, including those that publish nothing."""

    def path(self, volume: bytes) -> Path:
        return MOUNTPOINT / volume.decode()

    async def publish(
        self, volume: bytes, payload: Payload, *, new: VolumeDir | None = None, **_: object
    ) -> bool:
        assert volume in self.content or new is not None, f"{volume!r} is new: how to make it?"
        self.calls += 1
        await trio.lowlevel.checkpoint()  # the real one awaits its helper process
        if self.content.get(volume) == payload:
            return False
        self.content[volume] = payload
        self.publishes.append(volume)
        return True

    async def remove_volume(self, volume: bytes) -> None:
        del self.content[volume]
        self.removed.append(volume)


def configmap(value: str, namespace: str = "default") -> str:
    metadata = f'{{name: app, namespace: {namespace}, resourceVersion: "{value}"}}'
    return f'kind: ConfigMap\nmetadata: {metadata}\ndata: {{a: "{value}"}}\n'


def pod(uid: int, volume: str, *, namespace: str = "default", fs_group: int | None = None) -> Pod:
    security = f"  securityContext: {{fsGroup: {fs_group}}}\n" if fs_group is not None else ""
    text = (
        f"kind: Pod\nmetadata: {{name: p{uid}, namespace: {namespace},"
        f" uid: 00000000-0000-4000-8000-{uid:012d}}}\n"
        f"spec:\n{security}  containers: [{{name: c}}]\n  volumes:\n    - {volume}\n"
    )
    [parsed] = parse_manifest(text.encode(), origin=f"p{uid}.yaml")
    assert isinstance(parsed, Pod)
    return parsed


CONFIG = "{name: config, configMap: {name: app}}"
ITEMS = "{name: config, configMap: {name: app, items: [{key: a, path: x}]}}"
DOWNWARD = (
    "{name: config, projected: {sources: [{configMap: {name: app}},"
    " {downwardAPI: {items: [{path: n, fieldRef: {fieldPath: metadata.name}}]}}]}}"
)


@pytest.fixture
def store() -> ObjectStore:
    store = ObjectStore()
    for namespace in ("default", "other"):
        [obj] = parse_manifest(configmap("1", namespace).encode(), origin="cm.yaml")
        store.upsert(obj)
    return store


@dataclass
class Served:
    volumes: ServedVolumes
    publisher: RecordingPublisher
    backend: FakeMountBackend
    store: ObjectStore
    root: Path

    def resolve(self, pod: Pod) -> VolumeToServe:
        populator = Populator(store=self.store, desired=DesiredState())
        return populator.resolve(pod, pod.volumes[0])

    def bound_source(self, volume: VolumeToServe) -> str:
        """What the pod volume directory is bound to (the top bind)."""
        target = str(self.volumes.path(volume))
        return [a.source for a in self.backend.actions if a.verb == "bind" and a.target == target][
            -1
        ]

    def edit(self, value: str) -> None:
        [obj] = parse_manifest(configmap(value).encode(), origin="cm.yaml")
        self.store.upsert(obj)


@pytest.fixture
def served(tmp_path: Path, store: ObjectStore) -> Served:
    publisher, backend = RecordingPublisher(), FakeMountBackend()
    volumes = ServedVolumes(
        root=tmp_path,
        store=store,
        publisher=cast("Publisher", publisher),
        backend=backend,
        allocatable=NodeAllocatable(
            cpu_millis=1000, memory_bytes=1 << 30, ephemeral_storage_bytes=1 << 30
        ),
    )
    return Served(volumes, publisher, backend, store, tmp_path)


def test_same_spec_in_the_same_namespace_shares_one_subtree() -> None:
    first, second = (Populator(store=ObjectStore(), desired=DesiredState()) for _ in range(2))
    a, b = pod(1, CONFIG), pod(2, CONFIG)
    name = subtree_name(first.resolve(a, a.volumes[0]))
    assert name.startswith(SHARED)
    assert subtree_name(second.resolve(b, b.volumes[0])) == name


@pytest.mark.parametrize(
    "other",
    [
        pytest.param(pod(2, ITEMS), id="other-items"),
        pytest.param(pod(2, CONFIG, namespace="other"), id="other-namespace"),
        pytest.param(pod(2, CONFIG, fs_group=2000), id="other-fsGroup"),
    ],
)
def test_anything_that_changes_the_files_is_another_subtree(other: Pod) -> None:
    populator = Populator(store=ObjectStore(), desired=DesiredState())
    base = pod(1, CONFIG)
    assert subtree_name(populator.resolve(base, base.volumes[0])) != subtree_name(
        populator.resolve(other, other.volumes[0])
    )


def test_a_volume_that_depends_on_its_pod_is_never_shared() -> None:
    populator = Populator(store=ObjectStore(), desired=DesiredState())
    a, b = pod(1, DOWNWARD), pod(2, DOWNWARD)
    names = {subtree_name(populator.resolve(p, p.volumes[0])) for p in (a, b)}
    assert len(names) == 2
    assert not any(n.startswith(SHARED) for n in names)


async def test_users_share_one_subtree_one_publish_per_edit(served: Served) -> None:
    volumes = [served.resolve(pod(i, CONFIG)) for i in range(1, 4)]
    for volume in volumes:
        await served.volumes.set_up(volume)
    [name] = served.publisher.content
    assert served.publisher.publishes == [name]  # set up once, adopted by the other two
    sources = {served.bound_source(v) for v in volumes}
    assert sources == {str(MOUNTPOINT / name.decode())}

    served.edit("2")
    inputs = served.volumes.inputs(volumes[0])
    assert not served.volumes.is_current(volumes[0], inputs)
    await served.volumes.refresh(volumes[0])
    assert served.publisher.publishes == [name, name]
    # The other users are current already: their refresh is skipped by the reconciler ...
    assert all(served.volumes.is_current(v, served.volumes.inputs(v)) for v in volumes)
    # ... and would publish nothing if it ran.
    await served.volumes.refresh(volumes[1])
    assert served.publisher.publishes == [name, name]


async def test_pods_starting_together_render_and_publish_their_shared_subtree_once(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """200 pods set up at once (a node's restart): the first renders and publishes; the others,
    waiting for it, find the subtree published from their very inputs and only bind it."""
    render = served.volumes.render
    rendered: list[VolumeToServe] = []

    def counted(volume: VolumeToServe) -> Payload:
        rendered.append(volume)
        return render(volume)

    monkeypatch.setattr(served.volumes, "render", counted)
    volumes = [served.resolve(pod(i, CONFIG)) for i in range(1, 201)]
    async with trio.open_nursery() as nursery:
        for volume in volumes:
            nursery.start_soon(served.volumes.set_up, volume)
    assert (len(rendered), served.publisher.calls) == (1, 1)
    assert len({served.bound_source(v) for v in volumes}) == 1
    assert served.volumes._locks == {}  # a subtree's lock lasts while held or awaited only

    served.edit("2")  # a pod set up now, before any refresh, renders and publishes the edit
    late = served.resolve(pod(201, CONFIG))
    await served.volumes.set_up(late)
    assert (len(rendered), served.publisher.calls) == (2, 2)
    [payload] = served.publisher.content.values()
    assert payload["a"].data == b"2"


async def test_a_volume_is_one_user_tuple_in_every_index(served: Served) -> None:
    volume = served.resolve(pod(1, CONFIG))
    await served.volumes.set_up(volume)
    [by_facts] = served.volumes._facts
    [by_subtree] = served.volumes._subtree_of
    [name] = served.publisher.content
    [user] = served.volumes._users.get(name)
    assert by_facts == (volume.pod.uid, volume.spec_name)
    assert by_subtree is by_facts
    assert user is by_facts


async def test_the_facts_of_a_volume_set_up_outlive_the_bound_and_a_new_copy_of_it(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a pass asks of every volume is a cache, bounded: past the bound the facts of volumes
    not set up go (a node's start asks it of thousands), those of the volumes set up stay; and
    the facts of a new object of the same volume (its pod changed) reuse the tuple, subtree name
    and object keys that the indexes hold, not copies of them."""
    monkeypatch.setattr(served_module, "_FACTS_KEPT", 4)
    volume = served.resolve(pod(1, CONFIG))
    await served.volumes.set_up(volume)
    kept = served.volumes._facts_of(volume)
    for uid in range(2, 30):  # never set up
        served.volumes.inputs(served.resolve(pod(uid, CONFIG)))
    assert len(served.volumes._facts) <= 4 + 2 * 1 + 1
    assert served.volumes._facts_of(volume) is kept
    again = served.volumes._facts_of(served.resolve(pod(1, CONFIG)))
    assert again is not kept
    assert again.user is kept.user
    assert again.subtree is kept.subtree
    assert again.objects is kept.objects


async def test_the_subtree_goes_with_its_last_user(served: Served) -> None:
    a, b = served.resolve(pod(1, CONFIG)), served.resolve(pod(2, CONFIG))
    await served.volumes.set_up(a)
    await served.volumes.set_up(b)
    [name] = served.publisher.content
    await served.volumes.tear_down(a.pod.uid, a.spec_name, served.volumes.path(a))
    assert served.publisher.removed == []
    assert not served.backend.is_mount_point(served.volumes.path(a))
    await served.volumes.tear_down(b.pod.uid, b.spec_name, served.volumes.path(b))
    assert served.publisher.removed == [name]
    assert served.backend.mount_points() == ()


async def test_a_changed_spec_moves_one_user_and_keeps_the_old_subtree_until_unbound(
    served: Served,
) -> None:
    a, b = served.resolve(pod(1, CONFIG)), served.resolve(pod(2, CONFIG))
    await served.volumes.set_up(a)
    await served.volumes.set_up(b)
    [shared] = served.publisher.content
    edited = served.resolve(pod(1, ITEMS))  # pod 1's manifest now projects key a as x
    await served.volumes.refresh(edited)
    moved = subtree_name(edited)
    assert set(served.publisher.content) == {shared, moved}
    assert served.bound_source(edited) == str(MOUNTPOINT / moved.decode())  # on top of the old
    assert served.bound_source(b) == str(MOUNTPOINT / shared.decode())
    await served.volumes.tear_down(b.pod.uid, b.spec_name, served.volumes.path(b))
    assert served.publisher.removed == []  # pod 1's covered bind still holds the shared one
    await served.volumes.tear_down(edited.pod.uid, edited.spec_name, served.volumes.path(edited))
    assert sorted(served.publisher.removed) == sorted([shared, moved])


async def test_subtrees_are_named_by_the_connections_keyed_hash(
    served: Served, tmp_path: Path
) -> None:
    key = ConnectionKey.for_connection(tmp_path / "fuse.key", fresh=True)
    served.volumes = ServedVolumes(
        root=tmp_path,
        store=served.store,
        publisher=cast("Publisher", served.publisher),
        backend=served.backend,
        allocatable=NodeAllocatable(cpu_millis=1, memory_bytes=1, ephemeral_storage_bytes=1),
        subtree_names=key.subtree_name,
    )
    shared, own = served.resolve(pod(1, CONFIG)), served.resolve(pod(2, DOWNWARD))
    for volume in (shared, own):
        await served.volumes.set_up(volume)
    names = set(served.publisher.content)
    readable = {subtree_name(shared), subtree_name(own)}
    assert len(names) == 2
    assert not names & readable  # nobody without the key computes them
    assert {n.startswith(SHARED) for n in names} == {True, False}  # sharing is still told apart
    for volume in (shared, own):
        await served.volumes.tear_down(
            volume.pod.uid, volume.spec_name, served.volumes.path(volume)
        )
    assert served.publisher.content == {}  # each found again by its keyed name, and removed
