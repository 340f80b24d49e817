"""Frozen volumes: pod volume binds that still show a FUSE connection no agent serves.

Every bind of a served volume shows a subtree of one of the agent's FUSE connections. A new agent
normally takes the last one over (`fusevol.agent.launcher`), and every bind keeps working. When
it cannot (no process kept the connection, stock pyfuse3, a takeover that failed), it mounts a
new connection and stacks fresh binds on the old ones; a container whose bind is a private copy
of the old one (CRI's default propagation) then reads a *frozen* volume: the old content for ever,
or ENOTCONN, and no update again. Nothing fails loudly, so this module finds them.

All from mountinfo, never a `stat` (a bind of a connection nobody answers would hang it):
- a bind of another connection than `serving` is a mount of type `fuse.fusevol` whose device
  (`major:minor`, one per connection) differs;
- the node's own mount table names the volume: the stale bind is still at its pod volume
  directory or CSI target (covered by the fresh bind, or not);
- a container's mount namespace (one process of each, found through /proc/<pid>/ns/mnt) shows the
  copy it reads: the same device and root in the file system, frozen unless a later mount covers
  it at the same place (an rslave copy received the fresh bind). The container's pod is read from
  its cgroup (kubelet's `pod<uid>`) where it can be, since volumes with the same content share
  one subtree, hence one root. A namespace that shows the stale bind where the node does, below
  the pods directories, holds a private copy of the node's mount table (a build tool's, an
  `unshare -m` shell), not a container's view: a container sees its volumes at its own paths.
An agent that sees no other mount namespace (in a pod without the host's PID namespace) cannot
count the containers: it then reports every stale bind on the node as possibly frozen.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass

from fusevol.model import PodUID
from fusevol.mount import mountinfo
from fusevol.node import layout


@dataclass(frozen=True, slots=True)
class FrozenVolume:
    """A pod volume bound on the node to a connection that no agent serves."""

    uid: PodUID
    volume: str
    """The volume's name in the pod spec."""
    path: str
    """Where the stale bind is on the node (a pod volume directory or a CSI target)."""
    device: str
    """The dead connection's `major:minor`."""
    containers: int | None
    """Mount namespaces other than the node's that still read it, or None if we see none."""


_POD_VOLUME = re.compile(
    r"/pods/(?P<uid>[0-9a-f-]{36})/volumes/[^/]+/(?P<volume>[^/]+)(?:/mount)?$"
)
"""A pod volume directory (`<root>/pods/...`) or kubelet's CSI target (`.../<volume>/mount`)."""
_POD_CGROUP = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)
"""kubelet's pod cgroup, `pod<uid>` (cgroupfs) or `pod<uid with _>.slice` (systemd driver)."""


def find(mountpoint: str, below: list[str], *, proc: str = "/proc") -> list[FrozenVolume] | None:
    """The pod volumes bound below `below` (our pods directories: `<root>/pods`, kubelet's for
    CSI targets) to another FUSE connection than the one mounted at `mountpoint` (ours), with
    the containers that still read them where we can see them; None if nothing is mounted
    there."""
    prefixes = tuple(os.path.join(path, "") for path in below)
    mounts = mountinfo.read(f"{proc}/self/mountinfo")
    serving = _device_of(mounts, mountpoint)
    if serving is None:
        return None
    stale = [
        (match, mp)
        for mp in mounts
        if mp.fstype == layout.FUSE_FSTYPE and mp.device != serving
        if mp.path.startswith(prefixes) and (match := _POD_VOLUME.search(mp.path))
    ]
    if not stale:
        return []
    namespaces = _namespaces(proc, _namespace(f"{proc}/self"))
    read_in: dict[tuple[str, str], list[str | None]] = {}
    """(device, root) of a stale bind -> the pod uid (if known) of each namespace reading it."""
    for pid in namespaces:
        with contextlib.suppress(OSError, ValueError):  # gone meanwhile
            mounts = mountinfo.read(f"{proc}/{pid}/mountinfo")
            pod = _pod_of(f"{proc}/{pid}")
            covered = {(mp.parent_id, mp.path) for mp in mounts}
            for key in {
                (mp.device, mp.root)
                for mp in mounts
                if mp.fstype == layout.FUSE_FSTYPE and mp.device != serving
                if (mp.mount_id, mp.path) not in covered  # else an rslave copy got the new bind
                if not mp.path.startswith(prefixes)  # else a copy of the node's table
            }:
                read_in.setdefault(key, []).append(pod)
    frozen = []
    for match, mp in stale:
        uid = match["uid"]
        readers = [pod for pod in read_in.get((mp.device, mp.root), []) if pod in (None, uid)]
        frozen.append(
            FrozenVolume(
                uid=PodUID(uid),
                volume=match["volume"],
                path=mp.path,
                device=mp.device,
                containers=len(readers) if namespaces else None,
            )
        )
    return frozen


def device_of(mountpoint: str, *, proc: str = "/proc") -> str | None:
    """The device (`major:minor`) of the FUSE mount at `mountpoint`, read from mountinfo."""
    return _device_of(mountinfo.read(f"{proc}/self/mountinfo"), mountpoint)


def _device_of(mounts: tuple[mountinfo.MountPoint, ...], mountpoint: str) -> str | None:
    devices = [
        mp.device for mp in mounts if mp.path == mountpoint and mp.fstype == layout.FUSE_FSTYPE
    ]
    return devices[-1] if devices else None


def _namespace(process: str) -> str:
    return os.readlink(f"{process}/ns/mnt")


def _namespaces(proc: str, ours: str) -> list[str]:
    """One process of each mount namespace other than `ours` (the node's, for the agent)."""
    seen: dict[str, str] = {}
    for pid in os.listdir(proc):
        if pid.isdigit():
            with contextlib.suppress(OSError):
                seen.setdefault(_namespace(f"{proc}/{pid}"), pid)
    seen.pop(ours, None)
    return list(seen.values())


def _pod_of(process: str) -> str | None:
    """The pod uid in the process's cgroup (a kubelet pod's container), or None."""
    with (
        contextlib.suppress(OSError),
        open(f"{process}/cgroup", encoding="ascii", errors="replace") as f,
    ):
        if match := _POD_CGROUP.search(f.read()):
            return match[1].replace("_", "-")
    return None
