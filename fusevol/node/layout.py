"""Where things live on the node: kubelet's directory layout, and the volume plugins' names.

    <root>/pods/<uid>/volumes/<plugin dir>/<spec name>   a pod volume (docs/kubelet.md fact 1)
    <root>/pods/<uid>/plugins/<plugin dir>/<spec name>   a volume's metadata (gitRepo's `ready`)
    <root>/pods/<uid>/volume-subpaths/<volume>/<container>/<index>   a subPath view
    <root>/fusevol/follow                                 the views' FUSE mount (its own process;
                                                          follow.lock, follow.log beside it)
    <root>/fusevol/audit                                  the audited volumes' FUSE mount (its own
                                                          process; audit.lock, audit.log beside it)
    <root>/fusevol/audit-index/<subtree>.json             what it knows of each audited volume
    <root>/fusevol/audit.jsonl                            the audit's records (rotated: .1, .2, ...)
    <root>/fusevol/mnt                                    the agent's FUSE mount
    <root>/fusevol/fuse.key                               its connection's key (fuse/naming.py)
    <root>/fusevol/status.json                            what `fusevol status` reads
    <root>/fusevol/provisioned.json                       local PVs provisioned by this node
    <root>/fusevol/seen.json                              when each pod was first seen
    <root>/fusevol/csi/<volume id>.json                   a CSI target kubelet published
    <root>/fusevol/hostpath/<pv name>                     their directories (default basePath)

Modes: `<root>` (made if missing), `pods/` and everything below it that the agent makes are
0750 or tighter, as kubelet's `setupDataDirs` makes `/var/lib/kubelet`; `<root>/fusevol/` is
0700, since it holds the agent's read-write FUSE mount and its sockets; files are 0600. They do
not depend on the umask fusevol was started with: every fusevol process runs with `UMASK`, and
`make_root` sets the two directories' modes even where they exist already.

Plugin directory names are kubelet's `EscapeQualifiedName` of the plugin name ("/" -> "~"). The
spec name is the pod's volume name, or the PersistentVolume's name for a volume that comes
through a claim (kubelet's `volume.Spec.Name()`).
"""

from __future__ import annotations

import contextlib
import enum
import os
from typing import TYPE_CHECKING

from fusevol.base.fsutil import mkdir_all
from fusevol.model import (
    ConfigMapVolumeSource,
    DownwardAPIVolumeSource,
    EmptyDirVolumeSource,
    GitRepoVolumeSource,
    HostPathVolumeSource,
    LocalVolumeSource,
    NFSVolumeSource,
    PersistentVolumeSource,
    PodUID,
    ProjectedVolumeSource,
    SecretVolumeSource,
    UniqueVolumeName,
    VolumeSource,
)

if TYPE_CHECKING:
    from pathlib import Path

UMASK = 0o027
"""The umask of every fusevol process, whatever it was started with (`fusevol.cli.main`): a
directory made with kubelet's 0750 is 0750, a file made 0600 or 0640 is that, and nothing the
agent makes under the root is ever world-accessible."""

ROOT_MODE = 0o750
PODS_MODE = 0o750
AGENT_DIR_MODE = 0o700

FUSE_SUBTYPE = "fusevol"
FUSE_FSTYPE = f"fuse.{FUSE_SUBTYPE}"
"""The file system type of the agent's FUSE mount (and of every bind of it) in mountinfo."""


class Plugin(enum.Enum):
    CONFIG_MAP = "kubernetes.io/configmap"
    SECRET = "kubernetes.io/secret"
    DOWNWARD_API = "kubernetes.io/downward-api"
    PROJECTED = "kubernetes.io/projected"
    EMPTY_DIR = "kubernetes.io/empty-dir"
    NFS = "kubernetes.io/nfs"
    LOCAL = "kubernetes.io/local-volume"
    HOST_PATH = "kubernetes.io/host-path"
    GIT_REPO = "kubernetes.io/git-repo"

    @property
    def dir_name(self) -> str:
        return self.value.replace("/", "~")

    @property
    def short_name(self) -> str:
        return self.value.rsplit("/", 1)[1]

    @property
    def served_from_memory(self) -> bool:
        """Served by the FUSE file system (else set up by the mount backend)."""
        return self in _SERVED_FROM_MEMORY

    @classmethod
    def from_dir_name(cls, name: str) -> Plugin | None:
        return next((p for p in cls if p.dir_name == name), None)


_SERVED_FROM_MEMORY = frozenset(
    {Plugin.CONFIG_MAP, Plugin.SECRET, Plugin.DOWNWARD_API, Plugin.PROJECTED}
)


def plugin_for(source: VolumeSource | PersistentVolumeSource) -> Plugin | None:
    """The plugin that serves `source`, or None for a volume type fusevol does not serve."""
    match source:
        case ConfigMapVolumeSource():
            return Plugin.CONFIG_MAP
        case SecretVolumeSource():
            return Plugin.SECRET
        case DownwardAPIVolumeSource():
            return Plugin.DOWNWARD_API
        case ProjectedVolumeSource():
            return Plugin.PROJECTED
        case EmptyDirVolumeSource():
            return Plugin.EMPTY_DIR
        case NFSVolumeSource():
            return Plugin.NFS
        case LocalVolumeSource():
            return Plugin.LOCAL
        case HostPathVolumeSource():
            return Plugin.HOST_PATH
        case GitRepoVolumeSource():
            return Plugin.GIT_REPO
        case _:
            return None


def unique_volume_name(plugin: Plugin, uid: PodUID, spec_name: str) -> UniqueVolumeName:
    """Kubelet's unique name of a non-attachable volume: `<plugin>/<pod uid>-<spec name>`."""
    return UniqueVolumeName(f"{plugin.value}/{uid}-{spec_name}")


def pods_dir(root: Path) -> Path:
    return root / "pods"


def pod_dir(root: Path, uid: PodUID) -> Path:
    return pods_dir(root) / uid


def volume_dir(root: Path, uid: PodUID, plugin: Plugin, spec_name: str) -> Path:
    return pod_dir(root, uid) / "volumes" / plugin.dir_name / spec_name


def volume_meta_dir(volume_dir: Path, plugin: Plugin) -> Path:
    """kubelet's `GetPodPluginDir(uid, plugin)/<spec name>` for the pod volume at `volume_dir`."""
    return volume_dir.parents[2] / "plugins" / plugin.dir_name / volume_dir.name


def agent_dir(root: Path) -> Path:
    return root / "fusevol"


def make_root(root: Path) -> None:
    """Make `root` (0750, if missing), `pods/` (0750) and `fusevol/` (0700), and give the last
    two their modes if they were there with others (an older agent's, or another umask's)."""
    mkdir_all(root, ROOT_MODE)
    for directory, mode in ((pods_dir(root), PODS_MODE), (agent_dir(root), AGENT_DIR_MODE)):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, mode)
        os.chmod(directory, mode)


def lock_file(root: Path) -> Path:
    """The agent lock (`fusevol.agent.lock`): an flock, and the holder's pid."""
    return agent_dir(root) / "lock"


def fuse_mountpoint(root: Path) -> Path:
    return agent_dir(root) / "mnt"


def handover_socket(root: Path) -> Path:
    """Where a stopping agent that still serves waits for its successor
    (`fusevol.agent.handover`)."""
    return agent_dir(root) / "handover.sock"


def holder_socket(root: Path) -> Path:
    """Where `fusevol hold` keeps the agent's FUSE connection for the next agent
    (`fusevol.agent.holder`)."""
    return agent_dir(root) / "holder.sock"


def fuse_key_file(root: Path) -> Path:
    """The FUSE connection's key (`fusevol.fuse.naming`): made with the mount, read by an agent
    that takes the connection over."""
    return agent_dir(root) / "fuse.key"


def status_file(root: Path) -> Path:
    return agent_dir(root) / "status.json"


def provisioned_file(root: Path) -> Path:
    return agent_dir(root) / "provisioned.json"


def first_seen_file(root: Path) -> Path:
    """When the agent first saw each pod (`fusevol.volumemanager.cache.seen`): pod uids and times
    only."""
    return agent_dir(root) / "seen.json"


def csi_records(root: Path) -> Path:
    """The CSI targets kubelet published, a file each (`fusevol.csi.state`): served again after
    a restart."""
    return agent_dir(root) / "csi"


def default_provisioning_base(root: Path) -> Path:
    """Where provisioned local PVs live when their StorageClass gives no `basePath`."""
    return agent_dir(root) / "hostpath"


def fuse_name(uid: PodUID, spec_name: str) -> bytes:
    """The name of a pod volume's subtree on the FUSE mount. Pod UIDs and volume names (DNS
    labels) never contain "_", so the name is unique."""
    return f"{uid}_{spec_name}".encode()
