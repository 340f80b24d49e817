"""The reconciler, driven end to end over real state objects and executor, with fake volumes.

The `world` fixture builds the real ObjectStore, DesiredState, ActualState, Populator, Executor and
Reconciler around `FakeVolumes`, which stands in for `ServedVolumes`: it renders with the real one
(so a missing ConfigMap or an unsupported volume type fails exactly as on a node) but records
set-up, refresh and tear-down instead of publishing and mounting, and fails on request.

Time is trio's mock clock. The polling step is a power of two so that every instant the tests reach
is exact in binary floating point, and retry times can be compared with `==`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import pytest
import trio
import trio.testing

from fusevol.base.errors import VolumeSetupError
from fusevol.base.settings import ReconcileSettings
from fusevol.model import (
    ConfigMap,
    ConfigMapVolumeSource,
    Pod,
    PodUID,
    ResourceVersion,
    UniqueVolumeName,
    UnsupportedVolumeSource,
    Volume,
    VolumeName,
)
from fusevol.node import layout
from fusevol.node.layout import Plugin
from fusevol.projection.downward import NodeAllocatable
from fusevol.volumemanager.cache.actual import ActualState, MountedVolume, MountState
from fusevol.volumemanager.cache.desired import DesiredState
from fusevol.volumemanager.cache.store import ObjectStore
from fusevol.volumemanager.populator import Populator
from fusevol.volumemanager.reconciler.executor import Executor
from fusevol.volumemanager.reconciler.loop import Reconciler
from fusevol.volumemanager.reconciler.reconstruct import remove_pod_dir
from fusevol.volumemanager.reconciler.volumes import Volumes

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Hashable, Iterable

    from fusevol.fuse.publish import Publisher
    from fusevol.model import KubeObject, ObjectKey
    from fusevol.mount.backend import MountBackend
    from fusevol.volumemanager.cache.desired import VolumeToServe

SETTINGS = ReconcileSettings()  # kubelet's numbers: resync 60 s, backoff 0.5 s doubling to 122 s
POLL_S = 2**-6
BACKOFF_TIMES = [0.0, 0.5, 1.5, 3.5, 7.5]
"""Attempt times, from the first, of an operation that keeps failing."""

CFG = Volume(VolumeName("cfg"), ConfigMapVolumeSource(name="cm"))
CM = ConfigMap(namespace="ns", name="cm", resource_version=ResourceVersion("1"), data={"k": b"v"})
POD_A = Pod(PodUID("uid-a"), "ns", "a", ResourceVersion("100"), volumes=(CFG,))
POD_B = Pod(PodUID("uid-b"), "ns", "b", ResourceVersion("100"), volumes=(CFG,))
POD_C = Pod(PodUID("uid-c"), "ns", "c", ResourceVersion("100"), volumes=(CFG,))
POD_NFS = Pod(
    PodUID("uid-n"),
    "ns",
    "n",
    ResourceVersion("100"),
    volumes=(CFG, Volume(VolumeName("data"), UnsupportedVolumeSource(type_name="cephfs"))),
)
A_CFG = UniqueVolumeName("kubernetes.io/configmap/uid-a-cfg")
B_CFG = UniqueVolumeName("kubernetes.io/configmap/uid-b-cfg")
C_CFG = UniqueVolumeName("kubernetes.io/configmap/uid-c-cfg")
N_CFG = UniqueVolumeName("kubernetes.io/configmap/uid-n-cfg")
N_DATA = UniqueVolumeName("unresolved/uid-n-data")


class Call(NamedTuple):
    operation: str
    name: UniqueVolumeName
    time: float


class FakeVolumes:
    """`Volumes` without FUSE or mounts: records calls, fails for names in `failing`."""

    def __init__(self, *, root: Path, store: ObjectStore) -> None:
        self._root = root
        self._real = Volumes(
            root=root,
            store=store,
            publisher=cast("Publisher", None),
            backend=cast("MountBackend", None),
            allocatable=NodeAllocatable(
                cpu_millis=2000, memory_bytes=1 << 30, ephemeral_storage_bytes=1 << 30
            ),
        )
        self.calls: list[Call] = []
        self.failing: set[UniqueVolumeName] = set()
        self.failure: Callable[[str], Exception] = VolumeSetupError
        """What a failing operation raises."""
        self.removed_pod_dirs: list[PodUID] = []

    def inputs(self, volume: VolumeToServe) -> Hashable:
        return self._real.inputs(volume)

    def shared_subtree(self, volume: VolumeToServe) -> bytes | None:
        return None  # no FUSE here: every volume is its own

    def is_current(self, volume: VolumeToServe, inputs: Hashable) -> bool:
        return False

    def to_refresh_first(self, changed: Iterable[ObjectKey]) -> list[VolumeToServe]:
        return []  # nothing shared: every refresh comes from the pass

    def objects(self, volume: VolumeToServe) -> tuple[ObjectKey, ...]:
        return self._real.objects(volume)

    def refreshed(self, mounted: MountedVolume, inputs: Hashable) -> MountedVolume:
        return self._real.refreshed(mounted, inputs)

    async def set_up(self, volume: VolumeToServe) -> MountedVolume:
        self._record("set_up", volume.name)
        if volume.plugin is None:
            raise VolumeSetupError(volume.error)
        self._real.served.render(volume)
        path = layout.volume_dir(self._root, volume.pod.uid, volume.plugin, volume.volume.name)
        path.mkdir(parents=True, exist_ok=True)
        return MountedVolume(
            volume.name,
            volume.plugin,
            volume.pod.uid,
            volume.volume.name,
            str(path),
            self.inputs(volume),
        )

    async def refresh(self, volume: VolumeToServe, mounted: MountedVolume) -> MountedVolume:
        self._record("refresh", volume.name)
        self._real.served.render(volume)
        return dataclasses.replace(mounted, inputs=self.inputs(volume))

    async def tear_down(self, mounted: MountedVolume) -> None:
        self._record("tear_down", mounted.name)
        with contextlib.suppress(FileNotFoundError):
            Path(mounted.path).rmdir()

    async def remove_pod_dir(self, uid: PodUID) -> None:
        self.removed_pod_dirs.append(uid)
        remove_pod_dir(layout.pod_dir(self._root, uid))

    def calls_of(self, name: UniqueVolumeName) -> list[Call]:
        return [c for c in self.calls if c.name == name]

    def _record(self, operation: str, name: UniqueVolumeName) -> None:
        self.calls.append(Call(operation, name, trio.current_time()))
        if name in self.failing:
            raise self.failure(f"injected {operation} failure")


class RecordingExecutor(Executor):
    """The real executor, also recording the operations it agreed to start, in order."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.started: list[tuple[str, UniqueVolumeName]] = []
        self.served: dict[UniqueVolumeName, bool] = {}
        """Whether each volume's last operation was started as a served volume's (may queue)."""

    def start(
        self,
        name: UniqueVolumeName,
        operation: str,
        run: Callable[[], Awaitable[None]],
        *,
        inputs: Hashable = None,
        subject: str = "",
        served: bool = False,
    ) -> None:
        super().start(name, operation, run, inputs=inputs, subject=subject, served=served)
        self.started.append((operation, name))
        self.served[name] = served


@dataclass
class World:
    root: Path
    nursery: trio.Nursery
    store: ObjectStore = field(default_factory=ObjectStore)
    desired: DesiredState = field(default_factory=DesiredState)
    actual: ActualState = field(default_factory=ActualState)
    populator: Populator = field(init=False)
    volumes: FakeVolumes = field(init=False)
    executor: RecordingExecutor = field(init=False)
    reconciler: Reconciler = field(init=False)

    def __post_init__(self) -> None:
        self.populator = Populator(store=self.store, desired=self.desired)
        self.volumes = FakeVolumes(root=self.root, store=self.store)
        self.executor = RecordingExecutor(
            initial_backoff_s=SETTINGS.initial_backoff_s,
            max_backoff_s=SETTINGS.max_backoff_s,
        )
        self.reconciler = Reconciler(
            store=self.store,
            populator=self.populator,
            desired=self.desired,
            actual=self.actual,
            executor=self.executor,
            volumes=self.volumes,
            resync_interval_s=SETTINGS.resync_interval_s,
        )

    def add(self, *objects: KubeObject, synced: bool = True) -> None:
        for obj in objects:
            self.store.upsert(obj)
        if synced:
            self.store.mark_synced()

    def mounted(self, pod: Pod, *, inputs: Hashable, state: MountState) -> MountedVolume:
        """An ActualState entry as reconstruct or an earlier set-up would have left it."""
        path = layout.volume_dir(self.root, pod.uid, Plugin.CONFIG_MAP, CFG.name)
        name = layout.unique_volume_name(Plugin.CONFIG_MAP, pod.uid, CFG.name)
        return MountedVolume(name, Plugin.CONFIG_MAP, pod.uid, CFG.name, str(path), inputs, state)

    async def start(self) -> None:
        await self.nursery.start(self.executor.run)
        await self.nursery.start(self.reconciler.run)


@pytest.fixture
def world(nursery: trio.Nursery, tmp_path: Path) -> World:
    return World(tmp_path, nursery)


@pytest.fixture
async def served(world: World) -> World:
    """A running world whose one pod, POD_A, has its volume set up (at time 0)."""
    world.add(CM, POD_A)
    await world.start()
    await wait_until(lambda: A_CFG in world.actual)
    return world


async def wait_until(condition: Callable[[], bool], *, timeout_s: float = 600.0) -> None:
    with trio.fail_after(timeout_s):
        while not condition():
            await trio.sleep(POLL_S)


def error_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Messages logged at WARNING or above so far; consumes them (they are asserted, not leaked)."""
    found = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    caplog.clear()
    return found


# -- one pass --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("synced", "expected"),
    [
        pytest.param(
            True,
            [("unmount", A_CFG), ("mount", B_CFG), ("refresh", C_CFG)],
            id="unmount-then-mount-then-refresh",
        ),
        pytest.param(False, [("mount", B_CFG), ("refresh", C_CFG)], id="no-unmount-before-sync"),
    ],
)
async def test_one_pass_starts_operations_in_order(
    autojump_clock: trio.testing.MockClock,
    world: World,
    synced: bool,
    expected: list[tuple[str, UniqueVolumeName]],
) -> None:
    # A's pod is gone, C is set up from old inputs, B is new. C precedes B in the desired state.
    world.actual.mark_mounted(world.mounted(POD_A, inputs=None, state=MountState.UNCERTAIN))
    world.actual.mark_mounted(world.mounted(POD_C, inputs="old", state=MountState.MOUNTED))
    world.add(CM, POD_C, POD_B, synced=synced)
    await world.nursery.start(world.executor.run)
    world.populator.populate()

    world.reconciler.reconcile()

    assert world.executor.started == expected
    assert world.volumes.calls == []  # reconcile() only starts operations


async def test_only_served_volumes_operations_may_queue(
    autojump_clock: trio.testing.MockClock, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """The executor queues served volumes' operations beyond a bound; any other volume's (an NFS
    mount that may hang) must start at once."""
    world.actual.mark_mounted(world.mounted(POD_A, inputs=None, state=MountState.MOUNTED))
    world.add(CM, POD_NFS)
    await world.nursery.start(world.executor.run)
    world.populator.populate()

    world.reconciler.reconcile()

    assert world.executor.served == {A_CFG: True, N_CFG: True, N_DATA: False}
    await trio.testing.wait_all_tasks_blocked()
    assert [line for line in error_lines(caplog) if "cephfs" not in line] == []


# -- the running loop ------------------------------------------------------------------------------


async def test_pod_added_gets_its_volume_set_up_at_once(
    autojump_clock: trio.testing.MockClock, world: World
) -> None:
    world.add(CM)
    await world.start()
    await trio.sleep_until(5)
    world.store.upsert(POD_A)
    await wait_until(lambda: A_CFG in world.actual)

    assert world.volumes.calls == [Call("set_up", A_CFG, 5.0)]  # not at the next resync
    mounted = world.actual.get(A_CFG)
    assert mounted is not None
    assert mounted.inputs == (CFG.source, None, None, False, "1")
    assert mounted.path == str(
        layout.volume_dir(world.root, POD_A.uid, Plugin.CONFIG_MAP, CFG.name)
    )


async def test_pod_removed_gets_its_volume_torn_down(
    autojump_clock: trio.testing.MockClock, served: World
) -> None:
    served.store.upsert(POD_B)
    await wait_until(lambda: B_CFG in served.actual)
    await trio.sleep_until(5)

    served.store.delete(POD_A.key)
    await wait_until(lambda: A_CFG not in served.actual)

    assert served.volumes.calls_of(A_CFG)[1:] == [Call("tear_down", A_CFG, 5.0)]
    assert B_CFG in served.actual
    await wait_until(lambda: not layout.pod_dir(served.root, POD_A.uid).exists())
    assert layout.pod_dir(served.root, POD_B.uid).exists()


async def test_nothing_is_unmounted_before_the_store_is_synced(
    autojump_clock: trio.testing.MockClock, world: World
) -> None:
    world.actual.mark_mounted(world.mounted(POD_A, inputs=None, state=MountState.UNCERTAIN))
    world.add(CM, synced=False)
    await world.start()

    await trio.sleep(3 * SETTINGS.resync_interval_s)
    assert world.reconciler.passes >= 3
    assert world.volumes.calls == []
    assert A_CFG in world.actual

    world.store.mark_synced()
    synced_at = trio.current_time()
    await wait_until(lambda: A_CFG not in world.actual)
    assert world.volumes.calls == [Call("tear_down", A_CFG, synced_at)]


REFRESHES = [
    pytest.param(
        dataclasses.replace(CM, resource_version=ResourceVersion("2"), data={"k": b"w"}),
        ["refresh"],
        "2",
        id="configmap-new-version",
    ),
    pytest.param(CM, [], "1", id="configmap-delivered-again"),
    pytest.param(dataclasses.replace(CM, name="other"), [], "1", id="unrelated-configmap"),
    pytest.param(
        dataclasses.replace(POD_A, resource_version=ResourceVersion("101"), labels={"x": "y"}),
        [],
        "1",
        id="pod-metadata-only",
    ),
]


@pytest.mark.parametrize(("delivered", "operations", "version"), REFRESHES)
async def test_refresh_follows_object_versions(
    autojump_clock: trio.testing.MockClock,
    served: World,
    delivered: KubeObject,
    operations: list[str],
    version: str,
) -> None:
    await trio.sleep_until(5)

    served.store.upsert(delivered)
    await trio.sleep(2 * SETTINGS.resync_interval_s)

    assert served.volumes.calls_of(A_CFG)[1:] == [Call(op, A_CFG, 5.0) for op in operations]
    mounted = served.actual.get(A_CFG)
    assert mounted is not None
    assert mounted.inputs == (CFG.source, None, None, False, version)


async def _serving_own_configmaps(
    world: World, count: int
) -> tuple[list[ConfigMap], list[UniqueVolumeName]]:
    """`count` pods, each with a ConfigMap volume of its own, all mounted: the ConfigMaps, and
    the pods' volume names in the same order."""
    maps = [
        ConfigMap(namespace="ns", name=f"cm{i}", resource_version=ResourceVersion("1"))
        for i in range(count)
    ]
    pods = [
        Pod(
            PodUID(f"uid-{i}"),
            "ns",
            f"p{i}",
            ResourceVersion("100"),
            volumes=(Volume(VolumeName("cfg"), ConfigMapVolumeSource(name=f"cm{i}")),),
        )
        for i in range(count)
    ]
    world.add(*maps, *pods)
    await world.start()
    await wait_until(lambda: len(world.actual.mounted_volumes()) == count)
    names = [layout.unique_volume_name(Plugin.CONFIG_MAP, p.uid, VolumeName("cfg")) for p in pods]
    return maps, names


async def test_an_edit_asks_only_the_volumes_built_from_the_object(
    autojump_clock: trio.testing.MockClock, world: World
) -> None:
    """The passes that follow an edit (and the end of its refresh) look at the volumes built
    from the edited object, not at every volume of the node; a full pass still comes at the
    resync interval."""
    count = 300
    maps, names = await _serving_own_configmaps(world, count)
    await trio.sleep(1)
    edited = names[7]
    inputs, asked = world.volumes.inputs, list[UniqueVolumeName]()

    def inputs_noted(volume: VolumeToServe) -> Hashable:
        asked.append(volume.name)
        return inputs(volume)

    world.volumes.inputs = inputs_noted  # type: ignore[method-assign]
    passes = world.reconciler.passes
    world.store.upsert(dataclasses.replace(maps[7], resource_version=ResourceVersion("2")))
    await wait_until(lambda: [c.operation for c in world.volumes.calls_of(edited)][-1] == "refresh")
    await trio.sleep(1)
    assert world.reconciler.passes >= passes + 2  # the edit's, and the one after its refresh
    assert set(asked) == {edited}

    await trio.sleep(SETTINGS.resync_interval_s)
    assert len(set(asked)) == count  # the resync: every volume


async def test_the_passes_of_an_edit_take_the_refresh_step_alone(
    autojump_clock: trio.testing.MockClock, world: World
) -> None:
    """The passes that follow an edit of a ConfigMap (and the end of its refresh) neither run
    the populator nor walk the desired and actual states for volumes to set up or tear down
    (each walk is every volume of the node); a new pod's pass does, and sets its volume up."""
    count = 50
    maps, names = await _serving_own_configmaps(world, count)
    await trio.sleep(1)
    walks: list[str] = []

    def counting(name: str, walk: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            walks.append(name)
            return walk(*args, **kwargs)

        return counted

    world.populator.populate = counting("populate", world.populator.populate)  # type: ignore[method-assign]
    world.desired.volumes_to_serve = counting("desired", world.desired.volumes_to_serve)  # type: ignore[method-assign]
    world.actual.mounted_volumes = counting("actual", world.actual.mounted_volumes)  # type: ignore[method-assign]
    passes = world.reconciler.passes
    world.store.upsert(dataclasses.replace(maps[3], resource_version=ResourceVersion("2")))
    await wait_until(
        lambda: [c.operation for c in world.volumes.calls_of(names[3])][-1] == "refresh"
    )
    await trio.sleep(1)
    assert world.reconciler.passes >= passes + 2  # the edit's, and the one after its refresh
    assert walks == []

    pod = Pod(PodUID("uid-new"), "ns", "new", ResourceVersion("1"), volumes=(CFG,))
    world.add(CM, pod)
    new = layout.unique_volume_name(Plugin.CONFIG_MAP, pod.uid, CFG.name)
    await wait_until(lambda: new in world.actual)
    assert {"populate", "desired", "actual"} <= set(walks)


async def test_a_volume_whose_pod_left_during_its_set_up_is_torn_down_while_edits_come(
    autojump_clock: trio.testing.MockClock, world: World
) -> None:
    """A set-up that ends for a volume no pod wants any more makes the next pass a whole one,
    which tears the volume down at once, not at the resync, while edits of other objects keep
    the reconciler busy with passes that take the refresh step alone."""
    count = 10
    maps, _ = await _serving_own_configmaps(world, count)
    pod = Pod(PodUID("uid-new"), "ns", "new", ResourceVersion("1"), volumes=(CFG,))
    new = layout.unique_volume_name(Plugin.CONFIG_MAP, pod.uid, CFG.name)
    set_up, release = world.volumes.set_up, trio.Event()

    async def slow_set_up(volume: VolumeToServe) -> MountedVolume:
        if volume.name == new:
            await release.wait()
        return await set_up(volume)

    world.volumes.set_up = slow_set_up  # type: ignore[method-assign]
    world.add(CM, pod)
    await wait_until(lambda: ("mount", new) in world.executor.started)
    world.store.delete(pod.key)  # the pod leaves while its volume is being set up
    await trio.sleep(1)
    release.set()
    for n in range(20):  # another object edited every 0.1 s, for 2 s
        await trio.sleep(0.1)
        other = maps[n % count]
        world.store.upsert(dataclasses.replace(other, resource_version=ResourceVersion(f"{n}")))
    assert [c.operation for c in world.volumes.calls_of(new)] == ["set_up", "tear_down"]
    assert new not in world.actual


async def test_a_failed_refresh_is_retried_once_due_while_other_edits_keep_coming(
    autojump_clock: trio.testing.MockClock, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """Passes that follow only edits look at the edited objects' volumes: a volume whose
    refresh failed is still retried once its backoff is over, even when the retry fell due
    during a long pass and edits of other objects keep waking the reconciler."""
    count = 20
    maps, names = await _serving_own_configmaps(world, count)
    failing = names[0]
    world.volumes.failing.add(failing)
    inputs = world.volumes.inputs

    def a_long_pass_over_the_retry_time(volume: VolumeToServe) -> Hashable:
        if 10.4 <= trio.current_time() < 10.5:
            autojump_clock.jump(0.2)  # this pass takes 0.2 s: the retry falls due meanwhile
        return inputs(volume)

    world.volumes.inputs = a_long_pass_over_the_retry_time  # type: ignore[method-assign]
    await trio.sleep_until(10)
    world.store.upsert(dataclasses.replace(maps[0], resource_version=ResourceVersion("2")))
    for n in range(30):  # another object edited every 0.1 s, for 3 s
        await trio.sleep(0.1)
        other = maps[1 + n % (count - 1)]
        world.store.upsert(dataclasses.replace(other, resource_version=ResourceVersion(f"{n}")))
    refreshes = [c.time for c in world.volumes.calls_of(failing) if c.operation == "refresh"]
    assert refreshes[0] == 10
    assert 10.5 <= refreshes[1] <= 10.7  # the first pass after the long one, not the resync
    assert any("injected refresh failure" in line for line in error_lines(caplog))


async def test_an_edit_during_a_pass_is_refreshed_before_the_pass_ends(
    autojump_clock: trio.testing.MockClock, world: World
) -> None:
    """A pass walks every volume of the node; an edit that arrives meanwhile has the refresh of
    its shared subtree started at the pass's next step (`_STEP` volumes later), not after the
    whole pass. Here the edit comes when the pass is at the 200th of 300 volumes, and is of the
    first volume's ConfigMap, which this pass has gone past."""
    count = 300
    maps, names = await _serving_own_configmaps(world, count)
    first, edit_at = names[0], names[200]
    edited = dataclasses.replace(maps[0], resource_version=ResourceVersion("2"))

    def to_refresh_first(changed: Iterable[ObjectKey]) -> list[VolumeToServe]:
        volume = world.desired.get(first)
        return [volume] if volume is not None and edited.key in changed else []

    inputs, edit_pass = world.volumes.inputs, list[int]()

    def inputs_editing(volume: VolumeToServe) -> Hashable:
        if volume.name == edit_at and not edit_pass:  # the edit arrives here, mid-pass
            edit_pass.append(world.reconciler.passes)
            world.store.upsert(edited)
        return inputs(volume)

    start, refresh_pass = world.executor.start, list[int]()

    def start_noting_the_pass(
        name: UniqueVolumeName, operation: str, *args: Any, **kwargs: Any
    ) -> None:
        if (operation, name) == ("refresh", first):
            refresh_pass.append(world.reconciler.passes)
        start(name, operation, *args, **kwargs)

    world.volumes.to_refresh_first = to_refresh_first  # type: ignore[method-assign]
    world.volumes.inputs = inputs_editing  # type: ignore[method-assign]
    world.executor.start = start_noting_the_pass  # type: ignore[method-assign]
    world.reconciler.kick()
    await wait_until(lambda: bool(refresh_pass))
    assert refresh_pass == edit_pass  # started in the very pass the edit came in


# -- failures --------------------------------------------------------------------------------------


async def test_failing_set_up_is_retried_on_backoff_until_it_succeeds(
    autojump_clock: trio.testing.MockClock, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    world.volumes.failing.add(A_CFG)
    world.add(CM, POD_A)
    await world.start()
    await wait_until(lambda: len(world.volumes.calls) == 4)
    assert A_CFG not in world.actual

    world.volumes.failing.clear()
    await wait_until(lambda: A_CFG in world.actual)

    assert world.volumes.calls == [Call("set_up", A_CFG, t) for t in BACKOFF_TIMES]
    assert world.executor.status(A_CFG) is None  # its failures forgotten with the success
    [error] = error_lines(caplog)  # the repeats are DEBUG
    assert "injected set_up failure" in error


async def test_failing_tear_down_is_retried_and_the_volume_stays_mounted(
    autojump_clock: trio.testing.MockClock, served: World, caplog: pytest.LogCaptureFixture
) -> None:
    await trio.sleep_until(4)
    served.volumes.failing.add(A_CFG)
    served.store.delete(POD_A.key)
    await wait_until(lambda: len(served.volumes.calls) == 5)
    assert A_CFG in served.actual

    served.volumes.failing.clear()
    await wait_until(lambda: A_CFG not in served.actual)

    assert served.volumes.calls[1:] == [Call("tear_down", A_CFG, 4 + t) for t in BACKOFF_TIMES]
    [error] = error_lines(caplog)
    assert "injected tear_down failure" in error


async def test_unmount_all_goes_on_past_a_volume_whose_tear_down_fails(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """A clean stop unmounts every other volume, whatever one of them raises (an OSError from
    the kernel here): an exception escaping it once left the agent serving forever."""
    world.add(CM, POD_A, POD_B)
    await world.start()
    await wait_until(lambda: A_CFG in world.actual and B_CFG in world.actual)
    world.volumes.failing.add(A_CFG)
    world.volumes.failure = lambda message: OSError(errno.EBUSY, message)
    await world.reconciler.unmount_all()
    assert B_CFG not in world.actual
    assert A_CFG in world.actual
    [error] = error_lines(caplog)
    assert "unmount failed" in error
    assert "injected tear_down failure" in error


async def test_missing_configmap_appearing_is_used_at_once_despite_backoff(
    autojump_clock: trio.testing.MockClock, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    world.add(POD_A)
    await world.start()
    await trio.sleep_until(2)  # attempts at 0, 0.5 and 1.5; the next would be at 3.5
    world.store.upsert(CM)
    await wait_until(lambda: A_CFG in world.actual)

    assert [c.time for c in world.volumes.calls] == [0.0, 0.5, 1.5, 2.0]
    [error] = error_lines(caplog)
    assert "cm" in error


async def test_configmap_deleted_keeps_the_last_good_content(
    autojump_clock: trio.testing.MockClock, served: World, caplog: pytest.LogCaptureFixture
) -> None:
    await trio.sleep_until(1)

    served.store.delete(CM.key)
    await trio.sleep(10)

    assert served.volumes.calls[1:] == [Call("refresh", A_CFG, 1 + t) for t in BACKOFF_TIMES]
    mounted = served.actual.get(A_CFG)
    assert mounted is not None
    assert mounted.inputs == (CFG.source, None, None, False, "1")
    status = served.executor.status(A_CFG)
    assert status is not None
    assert (status.operation, status.failures) == ("refresh", 5)
    assert len(error_lines(caplog)) == 1


async def test_unsupported_volume_keeps_failing_with_a_clear_error(
    autojump_clock: trio.testing.MockClock, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    world.add(CM, POD_NFS)
    await world.start()
    await trio.sleep(10)

    assert N_CFG in world.actual  # the pod's other volume is served
    assert N_DATA in world.desired
    assert N_DATA not in world.actual
    assert [c.time for c in world.volumes.calls_of(N_DATA)] == BACKOFF_TIMES
    status = world.executor.status(N_DATA)
    assert status is not None
    assert status.last_error == "volume type 'cephfs' is not supported by fusevol"
    assert status.retry_at == 7.5 + 8
    [error] = error_lines(caplog)
    assert f"volume={N_DATA}" in error
    assert "'cephfs' is not supported" in error


async def test_executor_forgets_volumes_whose_pod_is_gone(
    autojump_clock: trio.testing.MockClock, served: World
) -> None:
    served.store.delete(POD_A.key)
    await wait_until(lambda: A_CFG not in served.actual)
    await wait_until(lambda: not served.executor.is_pending(A_CFG))  # empty parents removed
    await trio.sleep(2 * SETTINGS.resync_interval_s)
    assert served.executor.status(A_CFG) is None
