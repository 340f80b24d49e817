"""`fusevol.observe.status.StatusReporter`: the snapshot file is the agent's least urgent work. It
is built and encoded in steps of `_STEP` pods, with a pause between two steps (where the trio thread
sleeps, if nothing else is to be done, and worker threads get the GIL), so an update never waits
behind a whole snapshot (`bench/burst.py`: with 2000 pods, one edit of a burst in ten took
20-30 ms while a snapshot was encoded in one piece)."""

from __future__ import annotations

import itertools
import json
from typing import TYPE_CHECKING, Any

import trio
import trio.testing

from fusevol.decode.manifest import parse_manifest
from fusevol.model import Pod, PodUID, UniqueVolumeName
from fusevol.node import layout
from fusevol.node.layout import Plugin, unique_volume_name
from fusevol.observe.status import _PAUSE_S, _STEP, StatusReporter
from fusevol.volumemanager.cache.actual import ActualState, MountedVolume
from fusevol.volumemanager.cache.desired import CsiVolume, DesiredState, VolumeToServe
from fusevol.volumemanager.reconciler.executor import Executor

if TYPE_CHECKING:
    from collections.abc import Callable, Generator
    from pathlib import Path

    import pytest

PODS = 120


def reporter(root: Path, at_rest: Callable[[], None] = lambda: None) -> StatusReporter:
    desired = DesiredState()
    for i in range(PODS):
        text = (
            f"kind: Pod\nmetadata: {{name: p{i:03d}, uid: 00000000-0000-4000-8000-{i:012d}}}\n"
            "spec:\n  containers: [{name: c}]\n"
        )
        [pod] = parse_manifest(text.encode(), origin="pods.yaml")
        assert isinstance(pod, Pod)
        desired.set_pod(pod, ())
    return reporter_of(root, desired, ActualState(), at_rest=at_rest)


def reporter_of(
    root: Path, desired: DesiredState, actual: ActualState, **options: Any
) -> StatusReporter:
    return StatusReporter(
        root=root,
        node_name="node-a",
        desired=desired,
        actual=actual,
        executor=Executor(initial_backoff_s=0.5, max_backoff_s=4.0),
        **options,
    )


class Steps(trio.abc.Instrument):
    """When each step of the reporter's task began and ended (trio's clock)."""

    def __init__(self) -> None:
        self.steps: list[tuple[float, float]] = []

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith("StatusReporter.run"):
            self.steps.append((trio.current_time(), 0.0))

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith("StatusReporter.run"):
            self.steps[-1] = (self.steps[-1][0], trio.current_time())


def test_the_file_is_the_snapshot_encoded_in_steps_with_a_pause_between(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    status = reporter(tmp_path)
    steps = Steps()
    path = layout.status_file(tmp_path)
    snapshots = []
    pauses: list[float] = []
    """When the reporter's task began each pause: a step ends a little after that, later still
    on a loaded machine, so the pause is measured from here, not from the step's end."""
    sleep = trio.sleep

    async def recorded(seconds: float) -> None:
        if seconds == _PAUSE_S and trio.lowlevel.current_task().name.endswith("StatusReporter.run"):
            pauses.append(trio.current_time())
        await sleep(seconds)

    monkeypatch.setattr(trio, "sleep", recorded)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(status.run)
            steps.steps.clear()
            status.changed()
            with trio.fail_after(10):
                while not path.exists():
                    await trio.sleep(0.01)
            snapshots.append(json.loads(await status.encoded()))
            nursery.cancel_scope.cancel()

    trio.run(main, instruments=[steps])
    written = json.loads(path.read_bytes())
    [expected] = snapshots
    assert written.pop("written_at") <= expected.pop("written_at")
    assert written == expected
    assert [pod["name"] for pod in written["pods"]] == [f"p{i:03d}" for i in range(PODS)]
    # 120 pods, 50 a step: built in three steps (pods 0-49, 50-99, 100-119 and the encoding of
    # 0-49), encoded in two more; each of them but the first began a pause after the previous.
    assert _STEP == 50
    assert len(steps.steps) >= 5
    paused = 0
    for (began, ended), (next_began, _) in itertools.pairwise(steps.steps[:5]):
        during = [at for at in pauses if began <= at <= ended]
        waited_from = during[-1] if during else ended  # else: waiting for quiet (0.1 s)
        paused += bool(during)
        assert next_began - waited_from >= _PAUSE_S
    assert paused >= 3


def test_a_snapshot_waits_for_a_quiet_moment_or_a_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Passes every 0.05 s (pods being set up, a burst of edits) hold the snapshot back until
    they pause for 0.1 s, or for a second at most."""
    status = reporter(tmp_path)
    made: list[float] = []
    encoded = StatusReporter._encoded

    def recorded(self: StatusReporter) -> Generator[None, None, list[bytes]]:
        made.append(trio.current_time())
        return encoded(self)

    monkeypatch.setattr(StatusReporter, "_encoded", recorded)

    async def on_the_trio_thread(function: Callable[..., object], *args: object) -> object:
        return function(*args)

    # The file is written right away: the mock clock must not run on while a thread writes.
    monkeypatch.setattr(trio.to_thread, "run_sync", on_the_trio_thread)

    async def passes(until: float) -> None:
        while trio.current_time() < until:
            status.changed()
            await trio.sleep(0.05)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(status.run)
            await passes(until=0.8)  # the last at 0.75 (or 0.8): made 0.1 s later
            await trio.sleep(6.2)
            assert len(made) == 1
            assert 0.85 <= made[0] <= 0.95
            made.clear()
            await passes(until=8.5)  # from 7.0: due at 7.0, made at 8.0
            assert len(made) == 1
            assert 7.95 <= made[0] <= 8.05
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_at_rest_comes_before_each_snapshot_is_written(tmp_path: Path) -> None:
    """The agent tidies up at rest (its journal: `fusevol.fuse.snapshot.Journal.tidy`) when the
    reporter has waited for a quiet moment, before the write that trims the heap after it."""
    path = layout.status_file(tmp_path)
    rested: list[bytes | None] = []  # the file as it was at each call
    status = reporter(
        tmp_path, at_rest=lambda: rested.append(path.read_bytes() if path.exists() else None)
    )
    written: list[bytes] = []

    async def next_snapshot() -> None:
        status.changed()
        with trio.fail_after(10):
            while not path.exists() or path.read_bytes() in written:
                await trio.sleep(0.01)
        written.append(path.read_bytes())

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(status.run)
            await next_snapshot()
            assert rested == [None]
            await next_snapshot()
            assert rested == [None, written[0]]
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_the_answer_to_status_is_made_in_steps_and_other_tasks_run_between(
    tmp_path: Path,
) -> None:
    """`/status` (`encoded`) is the snapshot made at the time of asking, in the file's steps,
    with a checkpoint after each: a FUSE request arriving meanwhile is answered between two steps,
    not after a whole snapshot of thousands of volumes (100-300 ms at 3000 pods)."""
    status = reporter(tmp_path)
    ran_between = 0

    async def main() -> bytes:
        nonlocal ran_between
        answered = False

        async def another_task() -> None:
            nonlocal ran_between
            while not answered:
                await trio.lowlevel.checkpoint()
                ran_between += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(another_task)
            await trio.lowlevel.checkpoint()  # it starts
            ran_between = 0
            answer = await status.encoded()
            answered = True
        return answer

    answer = json.loads(trio.run(main))
    assert answer["node"] == "node-a"
    assert [pod["name"] for pod in answer["pods"]] == [f"p{i:03d}" for i in range(PODS)]
    # 120 pods, 50 a step: built in three steps, encoded in three; the other task ran after
    # each of the first five.
    assert _STEP == 50
    assert ran_between >= 4


def test_container_mounts_are_kept_only_for_pods_whose_subpaths_cost_an_expansion(
    tmp_path: Path,
) -> None:
    status = reporter(tmp_path)
    mounts = "volumeMounts: [{name: v, mountPath: /m, subPathExpr: $(POD)}]"
    env = "env: [{name: POD, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]"
    text = (
        "kind: Pod\nmetadata: {name: sub, uid: 00000000-0000-4000-8000-999999999999}\n"
        f"spec:\n  containers: [{{name: c, {mounts}, {env}}}]\n"
        "  volumes: [{name: v, emptyDir: {}}]\n"
    )
    [pod] = parse_manifest(text.encode(), origin="pods.yaml")
    assert isinstance(pod, Pod)
    status._desired.set_pod(pod, ())

    first = snapshot(status)
    containers = {p["name"]: p["containers"] for p in first["pods"]}
    assert containers["sub"][0]["mounts"][0]["subPath"] == "sub"
    assert containers["p000"] == [{"name": "c", "init": False, "mounts": []}]
    kept = status._mounts[pod.uid]
    snapshot(status)
    assert status._mounts[pod.uid] is kept  # kept: the same pod object
    assert list(status._mounts) == [pod.uid]  # p000's made again: nothing costly to keep
    status._desired.delete_pod(pod.uid)
    snapshot(status)
    assert status._mounts == {}


def test_the_source_s_pods_those_of_csi_publishes_and_those_of_volumes_left_set_up_are_shown(
    tmp_path: Path,
) -> None:
    """Sorted by namespace, name and uid: a pod of the source with its volumes and containers; a
    pod that only a CSI publish names (it is gone from the source), with its CSI volume; a pod
    gone from everything but a volume still set up, with no name. A step builds and encodes
    `_STEP` pods' entries, and never more."""
    text = (
        "kind: Pod\nmetadata:\n  name: web\n  namespace: shop\n"
        "  uid: 00000000-0000-4000-8000-0000000000a1\n"
        "spec:\n  containers: [{name: c, volumeMounts: [{name: config, mountPath: /etc/c}]}]\n"
        "  volumes: [{name: config, configMap: {name: settings}}]\n"
        "---\n"
        "kind: Pod\nmetadata:\n  name: api\n  namespace: shop\n"
        "  uid: 00000000-0000-4000-8000-0000000000a2\n"
        "spec:\n  containers: [{name: c}]\n"
        "  volumes: [{name: data, csi: {driver: fusevol.io}}]\n"
    )
    web, api = parse_manifest(text.encode(), origin="pods.yaml")
    assert isinstance(web, Pod)
    assert isinstance(api, Pod)
    desired, actual = DesiredState(), ActualState()
    config = VolumeToServe(
        unique_volume_name(Plugin.CONFIG_MAP, web.uid, "config"),
        Plugin.CONFIG_MAP,
        web,
        web.volumes[0],
        spec_name="config",
    )
    desired.set_pod(web, (config,))
    csi_name = UniqueVolumeName("fusevol.io/api-data")
    desired.set_csi(CsiVolume(csi_name, api, api.volumes[0], tmp_path / "target"))
    desired.set_resolved(
        csi_name,
        VolumeToServe(csi_name, Plugin.CONFIG_MAP, api, api.volumes[0], spec_name="data"),
    )
    gone = PodUID("00000000-0000-4000-8000-0000000000ff")
    for name, plugin, uid, spec_name in (
        (config.name, Plugin.CONFIG_MAP, web.uid, "config"),
        (unique_volume_name(Plugin.EMPTY_DIR, gone, "scratch"), Plugin.EMPTY_DIR, gone, "scratch"),
    ):
        actual.mark_mounted(MountedVolume(name, plugin, uid, spec_name, f"/v/{spec_name}", ()))
    status = reporter_of(
        tmp_path,
        desired,
        actual,
        object_versions=lambda volume: {"settings": "7"} if volume is config else {},
    )

    pods = snapshot(status)["pods"]

    assert [(p["namespace"], p["name"], p["desired"]) for p in pods] == [
        ("", "", False),
        ("shop", "api", True),
        ("shop", "web", True),
    ]
    scratch, data, config_entry = (p["volumes"] for p in pods)
    assert [(v["name"], v["type"], v["state"], v["path"]) for v in scratch] == [
        ("scratch", "empty-dir", "mounted", "/v/scratch")
    ]
    assert [(v["name"], v["type"], v["state"], v["read_only"]) for v in data] == [
        ("data", "configmap", "waiting", False)
    ]
    assert [(v["name"], v["state"], v["objects"], v["path"]) for v in config_entry] == [
        ("config", "mounted", {"settings": "7"}, "/v/config")
    ]
    assert "containers" not in pods[0]
    assert "containers" not in pods[1]
    assert pods[2]["containers"][0]["mounts"][0]["mountPath"] == "/etc/c"


def test_a_volume_of_a_claim_is_shown_once_by_its_pod_s_name_for_it(tmp_path: Path) -> None:
    """Set up as its PersistentVolume (directory `pv-1`), a claim's volume is the pod's `data`,
    not that and a volume `pv-1` besides; a pod deleted once the pods were listed, before its
    step, still shows it (it is still set up: torn down next)."""
    text = (
        "kind: Pod\nmetadata: {name: db, uid: 00000000-0000-4000-8000-0000000000b1}\n"
        "spec:\n  containers: [{name: c}]\n"
        "  volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]\n"
    )
    [pod] = parse_manifest(text.encode(), origin="pods.yaml")
    assert isinstance(pod, Pod)
    desired, actual = DesiredState(), ActualState()
    name = unique_volume_name(Plugin.HOST_PATH, pod.uid, "pv-1")
    desired.set_pod(
        pod, (VolumeToServe(name, Plugin.HOST_PATH, pod, pod.volumes[0], spec_name="pv-1"),)
    )
    actual.mark_mounted(MountedVolume(name, Plugin.HOST_PATH, pod.uid, "pv-1", "/srv/pv-1", ()))
    status = reporter_of(tmp_path, desired, actual)

    [shown] = snapshot(status)["pods"]
    assert [(v["name"], v["state"], v["path"]) for v in shown["volumes"]] == [
        ("data", "mounted", "/srv/pv-1")
    ]

    async def deleted_before_its_step() -> list[bytes]:
        steps = status._encoded()
        next(steps)  # the pods listed; the first step of entries comes next
        desired.delete_pod(pod.uid)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return list(done.value)

    [shown] = json.loads(b"".join(trio.run(deleted_before_its_step)))["pods"]
    assert [(v["name"], v["state"]) for v in shown["volumes"]] == [("data", "mounted")]


def snapshot(status: StatusReporter) -> dict[str, Any]:
    """`status`'s snapshot, as `/status` answers it."""
    return dict(json.loads(trio.run(status.encoded)))
