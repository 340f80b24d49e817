"""Who made a FUSE request: the calling process, and the container and pod it runs in, read from
`/proc` while the request waits for its answer (so the process still exists). No pyfuse3.

The kernel gives a request's thread id, uid and gid, as the server's PID namespace sees them (0:
a thread that namespace cannot see). The rest is read here:
- the process: its thread group id, `comm` and executable;
- its container: the last element of its cgroup path, less the runtimes' decorations
  (`cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`, or `<id>` as containerd
  and the cgroupfs driver name it), taken for a container id when the runtime's bundle for it
  exists (`<runtime state>/io.containerd.runtime.v2.task/<namespace>/<id>/config.json`), or when
  it is 64 hex digits or below a `kubepods` cgroup;
- its container's name and pod: the CRI annotations of that bundle's OCI config
  (`io.kubernetes.cri.container-name`, `sandbox-name`, `sandbox-namespace`, `sandbox-uid`), else
  the pod uid of a kubelet cgroup (`pod<uid>`, `-pod<uid_with_underscores>.slice`);
- where it runs: `container` (a container id), `host` (the mount namespace of PID 1, or this
  server's own where PID 1's cannot be read), or `unknown` (neither, or a pid this namespace
  cannot see). Recorded with what is known, never
  dropped.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cachetools import TTLCache

if TYPE_CHECKING:
    from pathlib import Path

_DECORATED = re.compile(r"^(?:cri-containerd-|crio-|docker-|containerd-)?(?P<id>.+?)(?:\.scope)?$")
_HEX_ID = re.compile(r"^[0-9a-f]{64}$")
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_TASKS = "io.containerd.runtime.v2.task"
_CRI = "io.kubernetes.cri."


@dataclass(frozen=True, slots=True)
class Container:
    id: str
    name: str | None = None
    pod_namespace: str | None = None
    pod_name: str | None = None
    pod_uid: str | None = None


def container_of(cgroup_text: str) -> tuple[str, str | None, bool] | None:
    """(candidate id, pod uid, certain) from a `/proc/<pid>/cgroup`'s text, or None for the root
    cgroup. `certain`: the path says it is a container (kubepods, or a 64-hex id)."""
    path = ""
    for line in cgroup_text.splitlines():  # v2's, or v1's pids (a hybrid's v2 path may be "/")
        hierarchy, _, rest = line.partition(":")
        controllers, _, cgroup = rest.partition(":")
        if (hierarchy == "0" or "pids" in controllers.split(",")) and len(cgroup) > len(path):
            path = cgroup
    parts = [p for p in path.split("/") if p]
    if not parts:
        return None
    match = _DECORATED.match(parts[-1])
    candidate = match.group("id") if match else parts[-1]
    pod = _POD.search(path)
    pod_uid = pod.group(1).replace("_", "-") if pod else None
    certain = "kubepods" in path or bool(_HEX_ID.match(candidate))
    return candidate, pod_uid, certain


class Callers:
    """Facts about calling processes. `runtime_state`: containerd's state directory (None: no
    bundle is read)."""

    def __init__(self, runtime_state: Path | None, *, proc: str = "/proc") -> None:
        self._state = runtime_state
        self._proc = proc
        self._containers: TTLCache[str, Container | None] = TTLCache(maxsize=4096, ttl=60)
        self._host_mnt = {self._mnt_ns(1), self._mnt_ns(os.getpid())} - {None}

    def describe(self, pid: int, uid: int, gid: int) -> dict[str, Any]:
        """The record's `reader` part for a request of thread `pid`."""
        reader: dict[str, Any] = {"where": "unknown", "pid": pid, "uid": uid, "gid": gid}
        if pid <= 0:
            return reader
        base = f"{self._proc}/{pid}"
        status = _read(f"{base}/status")
        for line in (status or "").splitlines():
            if line.startswith("Tgid:") and line.split()[1:2] and line.split()[1].isdigit():
                reader["pid"] = int(line.split()[1])
        comm = _read(f"{base}/comm")
        if comm is not None:
            reader["command"] = comm.rstrip("\n")
        with contextlib.suppress(OSError):
            reader["executable"] = os.readlink(f"{base}/exe")
        cgroup = _read(f"{base}/cgroup")
        container = None if cgroup is None else self._container(cgroup)
        if container is not None:
            reader["where"] = "container"
            reader["container"] = {"id": container.id, "name": container.name}
            if container.pod_uid is not None:
                reader["pod"] = {
                    "namespace": container.pod_namespace,
                    "name": container.pod_name,
                    "uid": container.pod_uid,
                }
        elif self._mnt_ns(pid) in self._host_mnt:
            reader["where"] = "host"
        return reader

    def _container(self, cgroup_text: str) -> Container | None:
        found = container_of(cgroup_text)
        if found is None:
            return None
        candidate, pod_uid, certain = found
        key = f"{candidate}\0{pod_uid}"
        if key in self._containers:
            return self._containers[key]
        annotations = self._bundle_annotations(candidate)
        if annotations is None and not certain:
            container = None
        else:
            annotations = annotations or {}
            container = Container(
                id=candidate,
                name=annotations.get(_CRI + "container-name"),
                pod_namespace=annotations.get(_CRI + "sandbox-namespace"),
                pod_name=annotations.get(_CRI + "sandbox-name"),
                pod_uid=annotations.get(_CRI + "sandbox-uid", pod_uid),
            )
        self._containers[key] = container
        return container

    def _bundle_annotations(self, container_id: str) -> dict[str, str] | None:
        if self._state is None or "/" in container_id or container_id in (".", ".."):
            return None
        tasks = self._state / _TASKS
        try:
            namespaces = os.listdir(tasks)
        except OSError:
            return None
        for namespace in namespaces:
            try:
                with open(tasks / namespace / container_id / "config.json", "rb") as config:
                    spec = json.load(config)
            except (OSError, ValueError):
                continue
            annotations = spec.get("annotations") if isinstance(spec, dict) else None
            return {k: v for k, v in (annotations or {}).items() if isinstance(v, str)}
        return None

    def _mnt_ns(self, pid: int) -> int | None:
        try:
            return os.stat(f"{self._proc}/{pid}/ns/mnt").st_ino
        except OSError:
            return None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None
