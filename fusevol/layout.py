"""Where things live on the node: kubelet's directory layout, and the volume plugins' names.

    <root>/pods/<uid>/volumes/<plugin dir>/<volume name>   a pod volume (KUBELET.md A1)
    <root>/fusevol/mnt                                       the agent's FUSE mount
    <root>/fusevol/status.json                               what `fusevol status` reads

Plugin directory names are kubelet's `EscapeQualifiedName` of the plugin name ("/" -> "~").
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from fusevol.model import (
    ConfigMapVolumeSource,
    PodUID,
    SecretVolumeSource,
    UniqueVolumeName,
    VolumeName,
    VolumeSource,
)

if TYPE_CHECKING:
    from pathlib import Path


class Plugin(enum.Enum):
    CONFIG_MAP = "kubernetes.io/configmap"
    SECRET = "kubernetes.io/secret"

    @property
    def dir_name(self) -> str:
        return self.value.replace("/", "~")

    @property
    def short_name(self) -> str:
        return self.value.rsplit("/", 1)[1]


def plugin_for(source: VolumeSource) -> Plugin | None:
    """The plugin that serves `source`, or None for a volume type fusevol does not serve."""
    match source:
        case ConfigMapVolumeSource():
            return Plugin.CONFIG_MAP
        case SecretVolumeSource():
            return Plugin.SECRET
        case _:
            return None


def unique_volume_name(plugin: Plugin, uid: PodUID, volume: VolumeName) -> UniqueVolumeName:
    """Kubelet's unique name of a non-attachable volume: `<plugin>/<pod uid>-<volume name>`."""
    return UniqueVolumeName(f"{plugin.value}/{uid}-{volume}")


def pods_dir(root: Path) -> Path:
    return root / "pods"


def pod_dir(root: Path, uid: PodUID) -> Path:
    return pods_dir(root) / uid


def volume_dir(root: Path, uid: PodUID, plugin: Plugin, volume: VolumeName) -> Path:
    return pod_dir(root, uid) / "volumes" / plugin.dir_name / volume


def agent_dir(root: Path) -> Path:
    return root / "fusevol"


def fuse_mountpoint(root: Path) -> Path:
    return agent_dir(root) / "mnt"


def status_file(root: Path) -> Path:
    return agent_dir(root) / "status.json"


def fuse_name(uid: PodUID, volume: VolumeName) -> bytes:
    """The name of a pod volume's subtree on the FUSE mount. Pod UIDs and volume names (DNS
    labels) never contain "_", so the name is unique."""
    return f"{uid}_{volume}".encode()
