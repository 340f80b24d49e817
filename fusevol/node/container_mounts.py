"""A container's volumeMounts resolved as kubelet resolves them: pure, no I/O.

What the agent publishes for each container (`container_mounts`: the subPath of every mount,
`subPathExpr` expanded with the container's env) and what `fusevol mounts` turns into bind mounts
(`resolve`: the host path of each mount and its options), from the agent's status and the node
layout only.

1. **subPathExpr** (kubelet's `ExpandContainerVolumeMounts`): `$(VAR)` is replaced by the
   container's env var VAR, `$$` is a literal `$`, a `$(` that is never closed is kept as it is
   (Kubernetes' expansion rules). A variable that is not defined, or defined empty, is an error
   (`missing value for VAR`). Env values here are literal `value`s and downward-API `fieldRef`s
   of the pod's metadata and spec (`metadata.name`, `.namespace`, `.uid`, `.labels['k']`,
   `.annotations['k']`, `spec.nodeName`, `spec.serviceAccountName`); a variable kubelet fills from
   the runtime or another object (`status.podIP`, `secretKeyRef`, ...) is not known here and is
   an error when a subPathExpr uses it.
2. **subPath checks** (kubelet's `makeMounts`): an absolute path, or one with a `..` element, is
   an error; `a//b/` is cleaned to `a/b`.
3. **Host paths.** A mount without subPath binds the pod volume directory (or the volume's own
   path: hostPath). A subPath into a configMap, secret, downwardAPI or projected volume binds the
   volume's subPath *view*, kubelet's `<root>/pods/<uid>/volume-subpaths/<volume>/<container>/
   <index>` (index: the mount's position in the container's volumeMounts), which the agent keeps
   following the volume's current version (`fusevol.fuse.follow`). A subPath into another volume
   binds `<volume path>/<subPath>`.
4. **Options** (kubelet's CRI mounts): `ro` for readOnly mounts, for read-only volumes (a claim
   or an nfs source with `readOnly`) and for the served types (always read-only under kubelet);
   propagation `None` -> `rprivate`, `HostToContainer` -> `rslave`, `Bidirectional` -> `rshared`;
   served volumes and their views get at least `rslave`, so that a container sees the binds a
   restarted agent stacks on dead ones (README, "Restarts").
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fusevol.node.layout import Plugin

if TYPE_CHECKING:
    from collections.abc import Mapping

    from fusevol.model import Container, EnvVar, Pod, VolumeMount

PROPAGATION_OPTIONS = {"": "rprivate", "None": "rprivate", "HostToContainer": "rslave"}
PROPAGATION_OPTIONS["Bidirectional"] = "rshared"

_LABEL = re.compile(r"^metadata\.(labels|annotations)\['(.*)'\]$")


class SubPathError(ValueError):
    """A mount that cannot be resolved; the message names the container, mount and reason."""


@dataclass(frozen=True, slots=True)
class Mount:
    """One resolved bind mount: `source` on the host at `destination` in the container."""

    destination: str
    source: str
    read_only: bool
    propagation: str
    """`rprivate`, `rslave` or `rshared`."""

    @property
    def options(self) -> list[str]:
        return ["rbind", "ro" if self.read_only else "rw", self.propagation]

    def ctr(self) -> str:
        """ctr run's `--mount` value."""
        return (
            f"type=bind,src={self.source},dst={self.destination},options={':'.join(self.options)}"
        )

    def oci(self) -> dict[str, Any]:
        """An entry of the OCI runtime spec's `mounts`."""
        return {
            "destination": self.destination,
            "type": "bind",
            "source": self.source,
            "options": self.options,
        }


# -- 1. subPathExpr -------------------------------------------------------------------------------


def pod_field(pod: Pod, field_path: str) -> str | None:
    """A downward-API fieldRef value known without kubelet, or None."""
    simple = {
        "metadata.name": pod.name,
        "metadata.namespace": pod.namespace,
        "metadata.uid": pod.uid,
        "spec.nodeName": pod.node_name,
        "spec.serviceAccountName": pod.service_account_name,
    }
    if field_path in simple:
        return simple[field_path]
    match = _LABEL.match(field_path)
    if match is None:
        return None
    values = pod.labels if match.group(1) == "labels" else pod.annotations
    return values.get(match.group(2), "")


def env_values(pod: Pod, env: tuple[EnvVar, ...]) -> dict[str, str]:
    """The container's env vars known here (module docstring, 1); a later entry wins."""
    values: dict[str, str] = {}
    for var in env:
        if var.field_ref is not None:
            value = pod_field(pod, var.field_ref.field_path)
            if value is None:
                values.pop(var.name, None)
                continue
            values[var.name] = value
        elif var.other:
            values.pop(var.name, None)
        else:
            values[var.name] = expand(var.value, values)[0]
    return values


def expand(text: str, values: Mapping[str, str]) -> tuple[str, list[str]]:
    """`text` with `$(VAR)` expanded (Kubernetes' expansion rules), and the names referenced
    that have no (or an empty) value, sorted."""
    out: list[str] = []
    missing: set[str] = set()
    i = 0
    while i < len(text):
        char = text[i]
        if char != "$" or i + 1 >= len(text):
            out.append(char)
            i += 1
            continue
        following = text[i + 1]
        if following == "$":
            out.append("$")
            i += 2
        elif following == "(":
            end = text.find(")", i + 2)
            if end < 0:
                out.append(text[i:])
                break
            name = text[i + 2 : end]
            value = values.get(name, "")
            if not value:
                missing.add(name)
            out.append(value if name in values else f"$({name})")
            i = end + 1
        else:
            out.append(char)
            i += 1
    return "".join(out), sorted(missing)


def mount_subpath(pod: Pod, container: Container, index: int) -> str:
    """The subPath of `container`'s mount `index` (subPathExpr expanded), checked and cleaned;
    empty for none. Raises SubPathError."""
    mount = container.volume_mounts[index]
    if not (mount.sub_path or mount.sub_path_expr):
        return ""
    what = f"container {container.name!r} volumeMount {index} ({mount.name} at {mount.mount_path})"
    sub_path = mount.sub_path
    if mount.sub_path_expr:
        if sub_path:
            raise SubPathError(f"{what}: subPath and subPathExpr are mutually exclusive")
        sub_path, missing = expand(mount.sub_path_expr, env_values(pod, container.env))
        if missing:
            raise SubPathError(
                f"{what}: subPathExpr {mount.sub_path_expr!r}: missing value for "
                + ", ".join(missing)
            )
    if not sub_path:
        return ""
    if posixpath.isabs(sub_path):
        raise SubPathError(f"{what}: subPath {sub_path!r} must not be an absolute path")
    if ".." in sub_path.split("/"):
        raise SubPathError(f"{what}: subPath {sub_path!r} must not contain '..'")
    cleaned = posixpath.normpath(sub_path)
    return "" if cleaned == "." else cleaned


# -- what the agent publishes ---------------------------------------------------------------------


def has_subpaths(pod: Pod) -> bool:
    """Whether a mount of the pod's containers has a subPath or a subPathExpr."""
    return any(
        mount.sub_path or mount.sub_path_expr
        for container in (*pod.init_containers, *pod.containers)
        for mount in container.volume_mounts
    )


def container_mounts(pod: Pod) -> list[dict[str, Any]]:
    """Every container's mounts as the agent publishes them in its status (JSON-ready)."""
    containers = []
    for kind, group in (("init", pod.init_containers), ("", pod.containers)):
        for container in group:
            mounts = []
            for index, mount in enumerate(container.volume_mounts):
                entry = _mount_entry(mount, index)
                try:
                    entry["subPath"] = mount_subpath(pod, container, index)
                except SubPathError as exc:
                    entry["error"] = str(exc)
                mounts.append(entry)
            containers.append({"name": container.name, "init": bool(kind), "mounts": mounts})
    return containers


def _mount_entry(mount: VolumeMount, index: int) -> dict[str, Any]:
    return {
        "index": index,
        "name": mount.name,
        "mountPath": mount.mount_path,
        "readOnly": mount.read_only,
        "subPath": "",
        "mountPropagation": mount.mount_propagation,
        "error": None,
    }


# -- 3, 4. host paths and options -----------------------------------------------------------------


def view_path(root: str, uid: str, volume: str, container: str, index: int) -> str:
    """kubelet's place of a subPath bind: `<root>/pods/<uid>/volume-subpaths/<volume>/...`."""
    return posixpath.join(root, "pods", uid, "volume-subpaths", volume, container, str(index))


def resolve(root: str, pod: Mapping[str, Any], container_name: str) -> list[Mount]:
    """The bind mounts of `container_name` of `pod` (an entry of the agent's status: `uid`,
    `volumes` with `name`, `type`, `state`, `path`, `last_error`, `read_only`; `containers` as
    `container_mounts`). Raises SubPathError naming the container, the mount and the reason."""
    containers = {c["name"]: c for c in pod.get("containers") or []}
    if container_name not in containers:
        known = ", ".join(sorted(containers)) or "none"
        raise SubPathError(f"no container {container_name!r} (containers: {known})")
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = []
    for entry in containers[container_name]["mounts"]:
        what = (
            f"container {container_name!r} volumeMount {entry['index']} "
            f"({entry['name']} at {entry['mountPath']})"
        )
        if entry.get("error"):
            raise SubPathError(entry["error"])
        volume = volumes.get(entry["name"])
        if volume is None:
            raise SubPathError(f"{what}: unknown volume {entry['name']!r}")
        if volume["state"] != "mounted" or not volume.get("path"):
            reason = f": {volume['last_error']}" if volume.get("last_error") else ""
            raise SubPathError(
                f"{what}: volume {entry['name']!r} not ready ({volume['state']}){reason}"
            )
        served = _served(volume.get("type", ""))
        source = volume["path"]
        if entry["subPath"]:
            if served:
                source = view_path(root, pod["uid"], entry["name"], container_name, entry["index"])
            else:
                source = posixpath.join(source, entry["subPath"])
        propagation = PROPAGATION_OPTIONS[entry.get("mountPropagation") or ""]
        if served and propagation == "rprivate":
            propagation = "rslave"
        mounts.append(
            Mount(
                destination=entry["mountPath"],
                source=source,
                read_only=bool(entry["readOnly"] or volume.get("read_only")) or served,
                propagation=propagation,
            )
        )
    return mounts


def _served(short_name: str) -> bool:
    return any(p.served_from_memory and p.short_name == short_name for p in Plugin)
