"""What the agent is doing, for `fusevol status`: pods, their volumes, state and last error.

The agent writes a JSON snapshot to `<root>/fusevol/status.json` (atomically, at most every
`min_interval_s`, from a worker thread) whenever a reconciler pass ran; `fusevol status` reads it,
so it works without any connection to the agent. The snapshot holds names, versions and error
messages, never payload bytes.
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Any

import trio

from fusevol import layout
from fusevol.cache.actual import MountState

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from fusevol.cache.actual import ActualState
    from fusevol.cache.desired import DesiredState, VolumeToServe
    from fusevol.model import UniqueVolumeName
    from fusevol.reconciler.executor import Executor


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
    ) -> None:
        """`statistics`: the components' counters, included in every snapshot."""
        self._path = layout.status_file(root)
        self._node_name = node_name
        self._desired = desired
        self._actual = actual
        self._executor = executor
        self._statistics = statistics
        self._object_versions = object_versions
        self._min_interval_s = min_interval_s
        self._dirty = trio.Event()

    def changed(self) -> None:
        self._dirty.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._dirty.wait()
            self._dirty = trio.Event()
            await trio.to_thread.run_sync(_write_atomically, self._path, self.snapshot())
            await trio.sleep(self._min_interval_s)

    def snapshot(self) -> dict[str, Any]:
        now = trio.current_time()
        pods: dict[str, dict[str, Any]] = {}
        for pod in self._desired.pods():
            pods[pod.uid] = {
                "uid": pod.uid,
                "namespace": pod.namespace,
                "name": pod.name,
                "desired": True,
                "volumes": {},
            }
        for volume in self._desired.volumes_to_serve():
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
        for mounted in self._actual.mounted_volumes():
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
        for pod_entry in pods.values():
            pod_entry["volumes"] = list(pod_entry["volumes"].values())
        return {
            "node": self._node_name,
            "written_at": time.time(),
            "pods": sorted(pods.values(), key=lambda p: (p["namespace"], p["name"], p["uid"])),
            "statistics": self._statistics(),
        }

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


def read(root: Path) -> dict[str, Any]:
    with open(layout.status_file(root), encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


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


def _write_atomically(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(tmp, path)
