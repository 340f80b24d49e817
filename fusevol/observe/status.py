"""What the agent is doing, for `fusevol status`: pods, their volumes, state and last error.

The agent writes a JSON snapshot to `<root>/fusevol/status.json` (atomically, at most every
`min_interval_s`, from a worker thread) after reconciler passes ran, once they pause for
`_QUIET_S` (at the latest `_LATEST_S` after the first); `fusevol status` (`fusevol.cli.status`)
reads it, so it works without any connection to the agent. The agent's `/status` answers the
same snapshot made at the time of asking (`encoded`). The snapshot holds names, versions and
error messages, never payload bytes.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from fusevol.base import heap
from fusevol.base.fsutil import replace_file
from fusevol.node import layout
from fusevol.node.container_mounts import container_mounts, has_subpaths
from fusevol.volumemanager.cache.actual import MountState

if TYPE_CHECKING:
    from collections.abc import Callable, Generator

    from fusevol.model import Pod, PodUID, UniqueVolumeName
    from fusevol.volumemanager.cache.actual import ActualState, MountedVolume
    from fusevol.volumemanager.cache.desired import DesiredState, VolumeToServe
    from fusevol.volumemanager.reconciler.executor import Executor


class StatusReporter:
    def __init__(
        self,
        *,
        root: Path,
        node_name: str,
        desired: DesiredState,
        actual: ActualState,
        executor: Executor,
        statistics: Callable[[], dict[str, Any]] = dict,
        object_versions: Callable[[VolumeToServe], dict[str, str | None]] = lambda _: {},
        frozen: Callable[[], list[dict[str, Any]]] = list,
        audited: Callable[[], list[dict[str, Any]]] = list,
        min_interval_s: float = 0.2,
        at_rest: Callable[[], None] = lambda: None,
    ) -> None:
        """`statistics`: the components' counters, included in every snapshot. `at_rest`: called
        before each snapshot is written, once the reconciler has been quiet: the time to tidy up
        after a burst of work (`fusevol.fuse.snapshot.Journal.tidy`)."""
        self._path = layout.status_file(root)
        self._node_name = node_name
        self._desired = desired
        self._actual = actual
        self._executor = executor
        self._statistics = statistics
        self._object_versions = object_versions
        self._frozen = frozen
        self._audited = audited
        self._min_interval_s = min_interval_s
        self._at_rest = at_rest
        self._dirty = trio.Event()
        self._mounts: dict[str, tuple[Pod, list[dict[str, Any]]]] = {}

    def changed(self) -> None:
        self._dirty.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        trace = os.environ.get(heap.TRACEMALLOC_ENV)
        async with trio.open_nursery() as nursery:
            if trace:
                nursery.start_soon(heap.trace_allocations, Path(trace))
            await self._write_snapshots(task_status)

    async def _write_snapshots(self, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        while True:
            await self._dirty.wait()
            await self._quiet()
            # Built and encoded on the trio thread (it reads the states), in steps of `_STEP`
            # pods with a pause after each. The snapshot is the agent's least urgent work: with
            # thousands of volumes it costs tens of milliseconds, which an update must not wait
            # for. Encoding it whole in a worker thread held the GIL for all of that time (json's
            # encoder never lets go), and steps without a pause never let the trio thread sleep,
            # which is when a worker thread (the manifest parser) gets the GIL.
            parts, spent = await self._made(pause_s=_PAUSE_S)
            self._at_rest()
            await trio.to_thread.run_sync(_write, self._path, parts)  # and emptied
            # ... and written less often when it is costly: at most a tenth of the trio thread.
            await trio.sleep(max(self._min_interval_s, _SPACING * spent))

    async def _quiet(self) -> None:
        """Return once no change came for `_QUIET_S`, or `_LATEST_S` after the first one. The
        snapshot is not made while the reconciler is busy (pods being set up, a burst of edits):
        it would take the trio thread from that work, and its garbage, mixed with the objects
        that work keeps, would leave the heap fragmented."""
        latest = trio.current_time() + _LATEST_S
        while True:
            self._dirty = trio.Event()
            with trio.move_on_at(min(trio.current_time() + _QUIET_S, latest)):
                await self._dirty.wait()
            if not self._dirty.is_set():
                return

    async def encoded(self) -> bytes:
        """The snapshot as JSON, now (`/status`), made in the same steps as the file's, with a
        checkpoint after each: with thousands of volumes it costs 100-300 ms, for which a FUSE
        request must not wait."""
        parts, _ = await self._made(pause_s=0)
        return b"".join(parts)

    async def _made(self, *, pause_s: float) -> tuple[list[bytes], float]:
        """`_encoded`'s parts, its steps run with a pause of `pause_s` after each (0: a
        checkpoint), and the trio thread's time they took."""
        steps = self._encoded()
        spent = 0.0
        while True:
            started = trio.current_time()
            try:
                next(steps)
            except StopIteration as done:
                return done.value, spent + trio.current_time() - started
            spent += trio.current_time() - started
            await trio.sleep(pause_s)

    def _encoded(self) -> Generator[None, None, list[bytes]]:
        """The snapshot as JSON, in parts, made in steps: which pods there are first, a step
        after every `_STEP` of them, then `_STEP` pods' entries built and encoded in each step.
        No more than a step's entries exist at any time. Built whole, those of 3000 pods were
        some 10 MB of small objects at once, made while the pods' own work went on between the
        steps, and what that work kept lay scattered among them once they were freed: Python's
        heap keeps such holes, and the agent's RSS after its start at 3000 pods was 97.4 MiB
        against 94.1 built this way (`bench/kube_scale.py`, medians of three agents each)."""
        head = {
            "node": self._node_name,
            "written_at": time.time(),
            "frozen_volumes": self._frozen(),
            "audited_volumes": self._audited(),
            "statistics": self._statistics(),
        }
        pods = yield from self._pods()
        for gone in self._mounts.keys() - pods.keys():
            del self._mounts[gone]
        order = sorted(pods, key=lambda uid: (pods[uid].namespace, pods[uid].name, uid))
        parts = [json.dumps(head)[:-1].encode(), b', "pods": [']
        now = trio.current_time()
        for i in range(0, len(order), _STEP):
            yield None
            if i:
                parts.append(b", ")
            entries = [self._pod(uid, pods[uid], now) for uid in order[i : i + _STEP]]
            # Without indent: json's C encoder (with one, its pure Python encoder, four times
            # slower).
            parts.append(json.dumps(entries)[1:-1].encode())
        parts.append(b"]}")
        return parts

    def _pods(self) -> Generator[None, None, dict[PodUID, _PodRow]]:
        """Every pod the snapshot shows, in steps of `_STEP`: those of the source, those only a
        CSI publish names, those only a volume still set up names (a pod being torn down)."""
        pods: dict[PodUID, _PodRow] = {}
        for i, pod in enumerate(self._desired.pods(), 1):
            if i % _STEP == 0:
                yield None
            volumes = self._desired.volumes_of(pod.uid)
            pods[pod.uid] = _PodRow(pod.namespace, pod.name, pod, desired=True, volumes=volumes)
        for volume in self._desired.csi_to_serve():
            pod = volume.pod  # a CSI volume's pod may be gone from the source (not unpublished)
            if (row := pods.get(pod.uid)) is None:
                row = pods[pod.uid] = _PodRow(pod.namespace, pod.name, None, desired=True)
            row.csi.append(volume)
        for i, mounted in enumerate(self._actual.mounted_volumes(), 1):
            if i % _STEP == 0:
                yield None
            if mounted.name in self._desired:
                continue
            if (row := pods.get(mounted.pod_uid)) is None:
                row = pods[mounted.pod_uid] = _PodRow("", "", None, desired=False)
            row.leftover.append(mounted)
        return pods

    def _pod(self, uid: PodUID, row: _PodRow, now: float) -> dict[str, Any]:
        """One pod's entry: its volumes (those of the source's pod, then its CSI volumes, then
        those set up that neither wants any more), and the containers' mounts."""
        volumes: dict[str, dict[str, Any]] = {}
        for volume in (*row.volumes, *row.csi):
            entry = volumes[volume.volume.name] = self._volume(volume.name, volume.volume.name, now)
            entry["objects"] = self._object_versions(volume)
            entry["type"] = volume.plugin.short_name if volume.plugin else "unresolved"
            entry["read_only"] = volume.read_only  # fusevol mounts: ro
        for mounted in row.leftover:
            if mounted.spec_name not in volumes:
                entry = volumes[mounted.spec_name] = self._volume(
                    mounted.name, mounted.spec_name, now
                )
                entry["type"] = mounted.plugin.short_name
        pod_entry: dict[str, Any] = {
            "uid": uid,
            "namespace": row.namespace,
            "name": row.name,
            "desired": row.desired,
            "volumes": list(volumes.values()),
        }
        if row.pod is not None:
            pod_entry["containers"] = self._container_mounts(row.pod)
        return pod_entry

    def _container_mounts(self, pod: Pod) -> list[dict[str, Any]]:
        """`container_mounts(pod)`. For a pod with subPaths, whose expansion is the costly part,
        kept while the pod object is the same; for the others (most pods), made for each
        snapshot: kept, they held some hundreds of bytes per mount, on thousands of pods."""
        if not has_subpaths(pod):
            self._mounts.pop(pod.uid, None)
            return container_mounts(pod)
        cached = self._mounts.get(pod.uid)
        if cached is None or cached[0] is not pod:
            cached = self._mounts[pod.uid] = (pod, container_mounts(pod))
        return cached[1]

    def _volume(self, name: UniqueVolumeName, volume_name: str, now: float) -> dict[str, Any]:
        mounted = self._actual.get(name)
        status = self._executor.status(name)
        error = status.last_error if status else ""
        pending = status.pending if status else False
        if pending:
            state = f"{status.operation}ing" if status else "pending"
        elif mounted is not None and mounted.state is MountState.UNCERTAIN:
            state = "reconstructed"
        elif mounted is not None:
            state = "update-failed" if error else "mounted"
        else:
            state = "failed" if error else "waiting"
        retry_in = status.retry_at - now if status and status.retry_at > now else None
        return {
            "name": volume_name,
            "unique_name": name,
            "state": state,
            "path": mounted.path if mounted else None,
            "updated_at": mounted.updated_at if mounted else None,
            "last_error": error or None,
            "next_retry_in_s": None if retry_in is None else round(retry_in, 3),
        }


_SPACING = 10.0
_STEP = 50
"""Entries of a snapshot built, or pods encoded, in one step (`StatusReporter.run`)."""
_PAUSE_S = 0.001
"""The trio thread's pause after each step of a snapshot."""
_QUIET_S = 0.1
"""A snapshot waits until the reconciler has been quiet this long ..."""
_LATEST_S = 1.0
"""... or this long after the change that made it due."""


class _PodRow:
    """A pod of the snapshot, while it is made: where it sorts, and the volumes it shows
    (`StatusReporter._pods`)."""

    __slots__ = ("csi", "desired", "leftover", "name", "namespace", "pod", "volumes")

    def __init__(
        self,
        namespace: str,
        name: str,
        pod: Pod | None,
        *,
        desired: bool,
        volumes: tuple[VolumeToServe, ...] = (),
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.pod = pod
        """The source's pod, None for one only a CSI volume or a set-up volume names."""
        self.desired = desired
        self.volumes = volumes
        """The source's pod's, as they were when the pods were listed: a pod deleted before its
        step still shows the volumes it had (set up, or being torn down)."""
        self.csi: list[VolumeToServe] = []
        self.leftover: list[MountedVolume] = []
        """Its volumes set up that nobody wants any more."""


def _write(path: Path, parts: list[bytes]) -> None:
    """Write the snapshot (worker thread), then give the heap's free pages back (`heap.trim`):
    the snapshot is made once the reconciler is quiet, after the work that freed them."""
    replace_file(path, b"".join(parts))
    parts.clear()
    heap.trim()
