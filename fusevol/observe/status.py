"""What the agent is doing, for `fusevol status`: pods, their volumes, state and last error.

The agent writes a JSON snapshot to `<root>/fusevol/status.json` (atomically, at most every
`min_interval_s`, from a worker thread) after reconciler passes ran, once they pause for
`_QUIET_S` (at the latest `_LATEST_S` after the first); `fusevol status` reads it, so it works
without any connection to the agent. The snapshot holds names, versions and error
messages, never payload bytes.

A snapshot outlives its agent, so `fusevol status` first finds out whether an agent runs
(`agent_state`): the agent holds an flock on `<root>/fusevol/lock`, which `/proc/locks` shows
without taking it (taking it, even for a moment, could make an agent starting then refuse to
run). Without an agent the snapshot is not shown as current; what is really still mounted below
the root comes from `/proc/self/mountinfo` (`mounted_below`).
"""

from __future__ import annotations

import json
import os
import time
import tracemalloc
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from fusevol.base import heap
from fusevol.base.fsutil import flock_held, replace_file
from fusevol.mount.linux import LinuxMountBackend
from fusevol.node import layout
from fusevol.node.container_mounts import container_mounts
from fusevol.volumemanager.cache.actual import MountState

if TYPE_CHECKING:
    from collections.abc import Callable, Generator

    from fusevol.model import Pod, UniqueVolumeName
    from fusevol.volumemanager.cache.actual import ActualState
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
        self._min_interval_s = min_interval_s
        self._at_rest = at_rest
        self._dirty = trio.Event()
        self._mounts: dict[str, tuple[Pod, list[dict[str, Any]]]] = {}

    def changed(self) -> None:
        self._dirty.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        trace = os.environ.get(TRACEMALLOC_ENV)
        async with trio.open_nursery() as nursery:
            if trace:
                nursery.start_soon(_trace_memory, Path(trace))
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
            steps = self._encoded()
            spent = 0.0
            while True:
                started = trio.current_time()
                try:
                    next(steps)
                except StopIteration as done:
                    parts: list[bytes] = done.value
                    break
                finally:
                    spent += trio.current_time() - started
                await trio.sleep(_PAUSE_S)
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

    def snapshot(self) -> dict[str, Any]:
        steps = self._build()
        while True:
            try:
                next(steps)
            except StopIteration as done:
                snapshot: dict[str, Any] = done.value
                return snapshot

    def _encoded(self) -> Generator[None, None, list[bytes]]:
        """The snapshot as JSON, in parts, in steps: its pods are encoded `_STEP` at a time."""
        snapshot = yield from self._build()
        pods = snapshot.pop("pods")
        parts = [json.dumps(snapshot)[:-1].encode(), b', "pods": [']
        for i in range(0, len(pods), _STEP):
            if i:
                yield None
                parts.append(b", ")
            # Without indent: json's C encoder (with one, its pure Python encoder, four times
            # slower).
            parts.append(json.dumps(pods[i : i + _STEP])[1:-1].encode())
        parts.append(b"]}")
        return parts

    def _build(self) -> Generator[None, None, dict[str, Any]]:
        """The snapshot, built in steps: a step ends after every `_STEP` entries."""
        now = trio.current_time()
        pods: dict[str, dict[str, Any]] = {}
        for i, pod in enumerate(self._desired.pods(), 1):
            if i % _STEP == 0:
                yield None
            pods[pod.uid] = {
                "uid": pod.uid,
                "namespace": pod.namespace,
                "name": pod.name,
                "desired": True,
                "volumes": {},
                "containers": self._container_mounts(pod),
            }
        for i, volume in enumerate(self._desired.volumes_to_serve(), 1):
            if i % _STEP == 0:
                yield None
            pod = volume.pod  # a CSI volume's pod may be gone from the source (not unpublished)
            entry = pods.setdefault(
                pod.uid,
                {
                    "uid": pod.uid,
                    "namespace": pod.namespace,
                    "name": pod.name,
                    "desired": True,
                    "volumes": {},
                },
            )["volumes"]
            entry[volume.volume.name] = self._volume(volume.name, volume.volume.name, now)
            entry[volume.volume.name]["objects"] = self._object_versions(volume)
            entry[volume.volume.name]["type"] = (
                volume.plugin.short_name if volume.plugin else "unresolved"
            )
            entry[volume.volume.name]["read_only"] = volume.read_only  # fusevol mounts: ro
        for i, mounted in enumerate(self._actual.mounted_volumes(), 1):
            if i % _STEP == 0:
                yield None
            pod_entry = pods.setdefault(
                mounted.pod_uid,
                {
                    "uid": mounted.pod_uid,
                    "namespace": "",
                    "name": "",
                    "desired": False,
                    "volumes": {},
                },
            )
            if mounted.spec_name not in pod_entry["volumes"]:
                pod_entry["volumes"][mounted.spec_name] = self._volume(
                    mounted.name, mounted.spec_name, now
                )
                pod_entry["volumes"][mounted.spec_name]["type"] = mounted.plugin.short_name
        for gone in self._mounts.keys() - pods.keys():
            del self._mounts[gone]
        for pod_entry in pods.values():
            pod_entry["volumes"] = list(pod_entry["volumes"].values())
        return {
            "node": self._node_name,
            "written_at": time.time(),
            "pods": sorted(pods.values(), key=lambda p: (p["namespace"], p["name"], p["uid"])),
            "statistics": self._statistics(),
        }

    def _container_mounts(self, pod: Pod) -> list[dict[str, Any]]:
        """`container_mounts(pod)`, computed again only when the pod object changed."""
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
            "path": str(mounted.path) if mounted else None,
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


def _write(path: Path, parts: list[bytes]) -> None:
    """Write the snapshot (worker thread), then give the heap's free pages back (`heap.trim`):
    the snapshot is made once the reconciler is quiet, after the work that freed them."""
    replace_file(path, b"".join(parts))
    parts.clear()
    heap.trim()


TRACEMALLOC_ENV = "FUSEVOL_TRACEMALLOC"
"""A directory: with it set, the agent traces its allocations (tracemalloc), and each time a file
`take` appears there it writes a snapshot `<n>.tracemalloc` and removes `take` (bench/soak.py
`--trace` diffs them across its checkpoints, to find what grows). A debugging aid: tracing costs
memory and time."""


async def _trace_memory(directory: Path) -> None:
    tracemalloc.start(8)
    request = directory / "take"
    n = 0
    while True:
        await trio.sleep(0.2)  # polled: a file written by another process, a debugging aid
        if not await trio.to_thread.run_sync(request.exists):
            continue
        snapshot = tracemalloc.take_snapshot()
        await trio.to_thread.run_sync(snapshot.dump, str(directory / f"{n}.tracemalloc"))
        await trio.to_thread.run_sync(request.unlink)
        n += 1


@dataclass(frozen=True, slots=True)
class AgentState:
    running: bool
    """An agent holds the lock on the root: it reconciles, and its snapshot is current."""
    pid: int | None
    """The running agent's, or the lame duck's (from the lock file; None if unreadable)."""
    lame_duck: bool
    """No agent runs, but the last one handed over and still serves its volumes."""


def agent_state(root: Path, *, locks: str = "/proc/locks") -> AgentState:
    """Whether an agent runs on `root`, from `/proc/locks` (module docstring)."""
    lock = layout.agent_dir(root) / "lock"
    try:
        st = os.stat(lock)
    except FileNotFoundError:
        return AgentState(running=False, pid=None, lame_duck=False)
    held = flock_held(st, locks=locks)
    pid, handing_over = None, False
    try:
        words = lock.read_text(encoding="utf-8", errors="replace").split()
        pid = int(words[0]) if words and words[0].isdigit() else None
        handing_over = len(words) > 1
    except OSError:  # not root: the lock file is 0600
        pass
    lame_duck = not held and handing_over and pid is not None and _alive(pid)
    return AgentState(running=held, pid=pid if held or lame_duck else None, lame_duck=lame_duck)


def mounted_below(root: Path) -> list[dict[str, str]]:
    """Every mount at or below `root` now, outermost first: path (relative to the root),
    file system type and source."""
    top = os.path.realpath(root)
    table = LinuxMountBackend(command_timeout_s=0, systemd_run=False).mount_points()
    return [
        {"path": os.path.relpath(m.path, top), "fstype": m.fstype, "source": m.source}
        for m in table
        if m.path == top or m.path.startswith(top.rstrip("/") + "/")
    ]


def collect(root: Path) -> dict[str, Any]:
    """What `fusevol status` shows: the agent's snapshot if an agent runs (else its pods are
    not shown: nothing serves them), with `agent` and `mounts` (the mount table) added."""
    state = agent_state(root)
    try:
        snapshot = read(root)
    except FileNotFoundError:
        snapshot = None
    if not state.running:
        snapshot = {
            "node": snapshot["node"] if snapshot else None,
            "written_at": snapshot["written_at"] if snapshot else None,
            "pods": [],
        }
    result: dict[str, Any] = dict(snapshot or {"node": None, "written_at": None, "pods": []})
    result["agent"] = asdict(state)
    result["mounts"] = mounted_below(root)
    return result


def read(root: Path) -> dict[str, Any]:
    with open(layout.status_file(root), encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


def render_collected(status: dict[str, Any], root: Path) -> str:
    """`collect()`'s answer for people: the snapshot when an agent runs, else what is mounted."""
    agent = status["agent"]
    if agent["running"]:
        head = f"agent running pid={agent['pid'] or '?'} root={root}"
        if status["written_at"] is None:
            return f"{head}\nno status written yet"
        return f"{head}\n{render(status)}"
    lines = [f"no agent runs on {root}"]
    if status["written_at"] is not None:
        age = time.time() - status["written_at"]
        lines[0] += f" (the last agent's status, written {age:.1f}s ago, is not shown)"
    if agent["lame_duck"]:
        lines.append(
            f"a lame duck (pid {agent['pid']}) still serves the last agent's volumes until an "
            "agent starts"
        )
    mounts = status["mounts"]
    if not mounts:
        lines.append(f"nothing is mounted below {root}")
        return "\n".join(lines)
    lines.append(f"still mounted below {root} (from /proc/self/mountinfo):")
    width = max(len(m["path"]) for m in mounts)
    lines.extend(f"  {m['path']:<{width}}  {m['fstype']}" for m in mounts)
    if not agent["lame_duck"]:
        lines.append(f"start an agent to serve them again, or `fusevol teardown --root {root}`")
    return "\n".join(lines)


def render(status: dict[str, Any]) -> str:
    """A human-readable table of a status snapshot."""
    age = time.time() - status["written_at"]
    lines = [f"node {status['node']} (status written {age:.1f}s ago)"]
    if not status["pods"]:
        lines.append("no pods")
    for pod in status["pods"]:
        title = f"{pod['namespace']}/{pod['name']}" if pod["name"] else "(pod gone)"
        lines.append(f"pod {title} uid={pod['uid']}")
        for volume in pod["volumes"]:
            line = f"  {volume['name']:<24} {volume['type']:<12} {volume['state']:<14}"
            versions = volume.get("objects") or {}
            if versions:
                line += " " + ",".join(f"{k}@{v or 'missing'}" for k, v in versions.items())
            if volume.get("updated_at"):
                line += f"  updated {time.time() - volume['updated_at']:.0f}s ago"
            if volume["last_error"]:
                line += f"  error: {volume['last_error']}"
            if volume["next_retry_in_s"] is not None:
                line += f"  (retry in {volume['next_retry_in_s']:.1f}s)"
            lines.append(line)
    return "\n".join(lines)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
