"""ObjectStore (the mirror of delivered objects) and DesiredState (the volumes pods want)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing

from fusevol.model import (
    ConfigMap,
    ConfigMapVolumeSource,
    HostPathVolumeSource,
    Kind,
    ObjectKey,
    PersistentVolume,
    PersistentVolumeClaim,
    PersistentVolumeClaimVolumeSource,
    Pod,
    PodUID,
    ResourceVersion,
    Secret,
    SecretVolumeSource,
    UnsupportedVolumeSource,
    Volume,
    VolumeName,
)
from fusevol.node.layout import Plugin
from fusevol.volumemanager.cache.desired import DesiredState
from fusevol.volumemanager.cache.store import ObjectStore
from fusevol.volumemanager.populator import Populator

if TYPE_CHECKING:
    from collections.abc import Callable

    from fusevol.model import KubeObject

CM = ConfigMap(namespace="ns", name="cm", resource_version=ResourceVersion("1"), data={"k": b"v"})
SECRET = Secret(namespace="ns", name="s", resource_version=ResourceVersion("7"), data={"k": b"v"})
POD = Pod(
    uid=PodUID("uid-a"),
    namespace="ns",
    name="web",
    resource_version=ResourceVersion("10"),
    volumes=(
        Volume(VolumeName("cfg"), ConfigMapVolumeSource(name="cm")),
        Volume(VolumeName("creds"), SecretVolumeSource(secret_name="s")),
        Volume(VolumeName("data"), UnsupportedVolumeSource(type_name="nfs")),
    ),
)


@pytest.fixture
def store() -> ObjectStore:
    return ObjectStore()


@pytest.fixture
def desired() -> DesiredState:
    return DesiredState()


# -- ObjectStore -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stored", "delivered", "changed"),
    [
        pytest.param((), CM, True, id="new-object"),
        pytest.param((CM,), CM, False, id="same-object-again"),
        pytest.param((CM,), dataclasses.replace(CM), False, id="equal-copy"),
        pytest.param(
            (CM,),
            dataclasses.replace(CM, resource_version=ResourceVersion("2"), data={"k": b"w"}),
            True,
            id="new-version",
        ),
        pytest.param((CM,), SECRET, True, id="other-kind"),
        pytest.param((CM,), dataclasses.replace(CM, namespace="other"), True, id="other-ns"),
    ],
)
def test_upsert_reports_changes_and_bumps_generation(
    store: ObjectStore, stored: tuple[KubeObject, ...], delivered: KubeObject, changed: bool
) -> None:
    for obj in stored:
        store.upsert(obj)
    generation = store.generation

    assert store.upsert(delivered) is changed

    assert store.generation == generation + int(changed)
    assert store.get(delivered.key) == delivered


@pytest.mark.parametrize(
    ("key", "deleted"),
    [
        pytest.param(CM.key, True, id="stored"),
        pytest.param(ObjectKey(Kind.CONFIG_MAP, "ns", "missing"), False, id="missing-name"),
        pytest.param(ObjectKey(Kind.SECRET, "ns", "cm"), False, id="same-name-other-kind"),
    ],
)
def test_delete(store: ObjectStore, key: ObjectKey, deleted: bool) -> None:
    store.upsert(CM)
    generation = store.generation
    assert store.delete(key) is deleted
    assert store.generation == generation + int(deleted)
    assert (store.get(CM.key) is None) is deleted


def test_delete_twice_is_a_noop(store: ObjectStore) -> None:
    store.upsert(CM)
    assert store.delete(CM.key)
    assert not store.delete(CM.key)
    assert store.generation == 2


def test_get_by_kind_and_listing(store: ObjectStore) -> None:
    for obj in (CM, SECRET, POD):
        store.upsert(obj)
    assert store.get(CM.key, ConfigMap) == CM
    assert store.get(SECRET.key, Secret) == SECRET
    assert store.list(Kind.CONFIG_MAP) == (CM,)
    assert tuple(store.pods()) == (POD,)
    stats = store.statistics()
    assert stats.objects_by_kind == {"ConfigMap": 1, "Secret": 1, "Pod": 1}
    assert (stats.generation, stats.synced) == (3, False)


def test_mark_synced_is_idempotent_and_counts_as_a_change(store: ObjectStore) -> None:
    assert not store.synced
    store.mark_synced()
    store.mark_synced()
    assert store.synced
    assert store.generation == 1
    assert store.statistics().synced


async def test_wait_changed_returns_at_once_when_already_changed(store: ObjectStore) -> None:
    generation = store.generation
    store.upsert(CM)
    with trio.fail_after(1):
        await store.wait_changed(generation)


CHANGES: list[object] = [
    pytest.param(lambda s: s.upsert(CM), True, id="upsert"),
    pytest.param(lambda s: s.delete(CM.key), False, id="delete-missing-no-change"),
    pytest.param(lambda s: s.mark_synced(), True, id="mark-synced"),
    pytest.param(lambda s: s.upsert(SECRET) and s.delete(SECRET.key), True, id="upsert-delete"),
]


@pytest.mark.parametrize(("change", "wakes"), CHANGES)
async def test_wait_changed_wakes_on_a_change(
    autojump_clock: trio.testing.MockClock,
    store: ObjectStore,
    change: Callable[[ObjectStore], object],
    wakes: bool,
) -> None:
    woken = trio.Event()

    async def waiter() -> None:
        await store.wait_changed(store.generation)
        woken.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert not woken.is_set()
        change(store)
        await trio.testing.wait_all_tasks_blocked()
        assert woken.is_set() is wakes
        nursery.cancel_scope.cancel()


async def test_wait_synced_blocks_until_mark_synced(
    autojump_clock: trio.testing.MockClock, store: ObjectStore
) -> None:
    async with trio.open_nursery() as nursery:
        synced = trio.Event()

        async def waiter() -> None:
            await store.wait_synced()
            synced.set()

        nursery.start_soon(waiter)
        store.upsert(CM)  # objects alone do not make the store synced
        await trio.testing.wait_all_tasks_blocked()
        assert not synced.is_set()
        store.mark_synced()
        with trio.fail_after(1):
            await synced.wait()


# -- DesiredState ----------------------------------------------------------------------------------


def set_pod(desired: DesiredState, pod: Pod) -> bool:
    """Add `pod` with its volumes resolved as the populator does."""
    resolver = Populator(store=ObjectStore(), desired=desired)
    return desired.set_pod(pod, tuple(resolver.resolve(pod, v) for v in pod.volumes))


@pytest.mark.parametrize(
    ("volume", "name", "plugin"),
    [
        pytest.param("cfg", "kubernetes.io/configmap/uid-a-cfg", Plugin.CONFIG_MAP, id="configmap"),
        pytest.param("creds", "kubernetes.io/secret/uid-a-creds", Plugin.SECRET, id="secret"),
        pytest.param("data", "unresolved/uid-a-data", None, id="unsupported-still-desired"),
    ],
)
def test_set_pod_adds_its_volumes_under_unique_names(
    desired: DesiredState, volume: str, name: str, plugin: Plugin | None
) -> None:
    assert set_pod(desired, POD)
    served = desired.get(name)  # type: ignore[arg-type]
    assert served is not None
    assert (served.plugin, served.pod, served.volume.name) == (plugin, POD, volume)
    assert name in desired


def test_volume_names_are_unique_across_pods(desired: DesiredState) -> None:
    other = dataclasses.replace(POD, uid=PodUID("uid-b"), name="web-2")
    set_pod(desired, POD)
    set_pod(desired, other)
    names = [v.name for v in desired.volumes_to_serve()]
    assert len(names) == len(set(names)) == 6
    assert "kubernetes.io/configmap/uid-b-cfg" in names
    assert desired.pods() == (POD, other)


@pytest.mark.parametrize(
    ("update", "changed", "names"),
    [
        pytest.param(lambda p: p, False, 3, id="same-pod"),
        pytest.param(lambda p: dataclasses.replace(p), False, 3, id="equal-copy"),
        pytest.param(
            lambda p: dataclasses.replace(p, resource_version=ResourceVersion("11")),
            True,
            3,
            id="new-version",
        ),
        pytest.param(
            lambda p: dataclasses.replace(p, volumes=p.volumes[:1]), True, 1, id="volumes-dropped"
        ),
    ],
)
def test_set_pod_again(
    desired: DesiredState, update: Callable[[Pod], Pod], changed: bool, names: int
) -> None:
    set_pod(desired, POD)
    pod = update(POD)
    assert set_pod(desired, pod) is changed
    served = desired.volumes_to_serve()
    assert len(served) == names
    assert all(v.pod == pod for v in served)


def test_delete_pod_is_idempotent(desired: DesiredState) -> None:
    other = dataclasses.replace(POD, uid=PodUID("uid-b"))
    set_pod(desired, POD)
    set_pod(desired, other)
    assert desired.delete_pod(POD.uid)
    assert not desired.delete_pod(POD.uid)
    assert not desired.delete_pod(PodUID("never-seen"))
    assert desired.pods() == (other,)
    assert {v.pod.uid for v in desired.volumes_to_serve()} == {"uid-b"}
    assert "kubernetes.io/configmap/uid-a-cfg" not in desired


def test_two_volumes_on_one_claim_are_one_volume_and_the_pod_can_go(
    desired: DesiredState,
) -> None:
    """Both are set up as the claim's PersistentVolume (one unique name, one directory named after
    it); replacing or deleting the pod forgets that one volume once."""
    store = ObjectStore()
    store.upsert(
        PersistentVolumeClaim("ns", "data", ResourceVersion("1"), volume_name="pv-1"),
    )
    store.upsert(
        PersistentVolume("pv-1", ResourceVersion("2"), HostPathVolumeSource("/srv/data")),
    )
    pod = dataclasses.replace(
        POD,
        volumes=tuple(
            Volume(VolumeName(name), PersistentVolumeClaimVolumeSource("data")) for name in "ab"
        ),
    )
    resolver = Populator(store=store, desired=desired)

    assert desired.set_pod(pod, tuple(resolver.resolve(pod, v) for v in pod.volumes))
    [volume] = desired.volumes_to_serve()
    assert (volume.name, volume.spec_name) == ("kubernetes.io/host-path/uid-a-pv-1", "pv-1")
    assert len(desired.volumes_of(pod.uid)) == 2
    newer = dataclasses.replace(pod, resource_version=ResourceVersion("11"))
    assert desired.set_pod(newer, tuple(resolver.resolve(newer, v) for v in newer.volumes))
    assert desired.delete_pod(pod.uid)
    assert desired.volumes_to_serve() == ()


def test_readers_hand_out_snapshots(desired: DesiredState) -> None:
    set_pod(desired, POD)
    volumes, pods = desired.volumes_to_serve(), desired.pods()
    desired.delete_pod(POD.uid)
    assert (len(volumes), len(pods)) == (3, 1)
    assert (desired.volumes_to_serve(), desired.pods()) == ((), ())


def test_changed_since_lists_the_keys_changed_after_a_generation_newest_first(
    store: ObjectStore,
) -> None:
    other = dataclasses.replace(CM, name="other")
    store.upsert(CM)
    since = store.generation
    assert store.changed_since(since) == ()
    store.upsert(other)
    store.upsert(dataclasses.replace(CM, resource_version=ResourceVersion("2")))
    assert store.changed_since(since) == (CM.key, other.key)
    store.upsert(other)  # unchanged: not a change
    assert store.changed_since(since) == (CM.key, other.key)
    store.delete(other.key)  # deleted: neither listed nor kept
    assert store.changed_since(since) == (CM.key,)
    assert store.changed_at(other.key) is None
    assert store.changed_since(store.generation) == ()
