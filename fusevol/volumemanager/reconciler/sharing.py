"""Which served volumes share one subtree of the agent's FUSE mount: the subtree's readable name.

Volumes that would hold the same files share one subtree (`subtree_name`): configMap, secret and
projected volumes of one namespace with the same spec, the same fsGroup and the same nested
mountpoints (`nested_mountpoints`, part of the files: runc's mountpoint directories), as long as
nothing in them depends on the pod (downward API, service account tokens). Any other volume has
a subtree of its own, named for the pod volume (`layout.fuse_name`).

Names only: what a subtree holds, who uses it and when it goes are `served.ServedVolumes`'s; the
name on the mount is the readable one's keyed hash (`ServedVolumes`'s `subtree_names`).
"""

from __future__ import annotations

import hashlib
import posixpath
from typing import TYPE_CHECKING

from fusevol.model import (
    ConfigMapVolumeSource,
    DownwardAPIProjection,
    ProjectedVolumeSource,
    SecretVolumeSource,
    ServiceAccountTokenProjection,
)
from fusevol.node import layout

if TYPE_CHECKING:
    from fusevol.volumemanager.cache.desired import VolumeToServe

SHARED = b"shared-"
"""The name prefix of the subtrees that several pods' volumes may share (`subtree_name`)."""


AUDITED = b".audited"
"""The name suffix of an audited volume's own subtree (`subtree_name`)."""


def subtree_name(volume: VolumeToServe, *, audited: bool = False) -> bytes:
    """The readable name of the volume's subtree on the FUSE mount: shared by every volume that
    would hold the same files (module docstring), else the pod volume's own (`layout.fuse_name`);
    an audited volume's is its own, under a name of its own, so that a volume whose audit is
    turned on or off gets another subtree, bound anew. `ServedVolumes` names the subtree by its
    keyed hash (`subtree_names`)."""
    if audited:
        return layout.fuse_name(volume.pod.uid, volume.spec_name) + AUDITED
    if _depends_on_pod(volume):
        return layout.fuse_name(volume.pod.uid, volume.spec_name)
    spec = (
        volume.plugin,
        volume.pod.namespace,
        volume.source,
        volume.pod.fs_group,
        nested_mountpoints(volume),
    )
    return SHARED + hashlib.sha256(repr(spec).encode()).hexdigest()[:32].encode()


def nested_mountpoints(volume: VolumeToServe) -> tuple[str, ...]:
    """kubelet's `MakeNestedMountpoints`: for every other volume a container mounts *below* this
    volume's mount path, the first path element below it, so that runc finds a mountpoint
    directory inside this (read-only) volume."""
    names: set[str] = set()
    for container in (*volume.pod.containers, *volume.pod.init_containers):
        own = [m.mount_path for m in container.volume_mounts if m.name == volume.volume.name]
        for mount in container.volume_mounts:
            if mount.name == volume.volume.name:
                continue
            for base in own:
                relative = posixpath.relpath(posixpath.normpath(mount.mount_path), base)
                if relative != "." and not relative.startswith(".."):
                    names.add(relative.split("/", 1)[0])
    return tuple(sorted(names))


def _depends_on_pod(volume: VolumeToServe) -> bool:
    """True if the files depend on the pod itself: downward API fields, or its own tokens."""
    match volume.source:
        case ConfigMapVolumeSource() | SecretVolumeSource():
            return False
        case ProjectedVolumeSource(sources=sources):
            return any(
                isinstance(p, DownwardAPIProjection | ServiceAccountTokenProjection)
                for p in sources
            )
        case _:
            return True
