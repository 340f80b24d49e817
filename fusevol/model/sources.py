"""The volume sources of a pod's `spec.volumes[]` (and a PersistentVolume's), as frozen types:
configMap, secret, downwardAPI, projected, nfs, hostPath, emptyDir, persistentVolumeClaim, local,
gitRepo, csi, and what fusevol does not serve. Re-exported by `fusevol.model`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True, slots=True)
class KeyToPath:
    """`items[]` of a configMap or secret volume: project `key` at relative `path` with `mode`."""

    key: str
    path: str
    mode: int | None = None


DEFAULT_MODE = 0o644
"""API defaulting of `defaultMode` for configMap, secret, downwardAPI and projected volumes."""


@dataclass(frozen=True, slots=True)
class ConfigMapVolumeSource:
    name: str
    items: tuple[KeyToPath, ...] = ()
    default_mode: int = DEFAULT_MODE
    optional: bool = False


@dataclass(frozen=True, slots=True)
class SecretVolumeSource:
    secret_name: str
    items: tuple[KeyToPath, ...] = ()
    default_mode: int = DEFAULT_MODE
    optional: bool = False


@dataclass(frozen=True, slots=True)
class ObjectFieldSelector:
    """`fieldRef`: a field of the pod, e.g. `metadata.labels` or `metadata.annotations['k']`."""

    field_path: str
    api_version: str = "v1"


@dataclass(frozen=True, slots=True)
class ResourceFieldSelector:
    """`resourceFieldRef`: a container's limit or request, e.g. `limits.memory`."""

    resource: str
    container_name: str = ""
    divisor: str = ""
    """A Kubernetes quantity (`1m`, `1Mi`, ...); empty means 1."""


@dataclass(frozen=True, slots=True)
class DownwardAPIVolumeFile:
    path: str
    field_ref: ObjectFieldSelector | None = None
    resource_field_ref: ResourceFieldSelector | None = None
    mode: int | None = None


@dataclass(frozen=True, slots=True)
class DownwardAPIVolumeSource:
    items: tuple[DownwardAPIVolumeFile, ...] = ()
    default_mode: int = DEFAULT_MODE


@dataclass(frozen=True, slots=True)
class ConfigMapProjection:
    name: str
    items: tuple[KeyToPath, ...] = ()
    optional: bool = False


@dataclass(frozen=True, slots=True)
class SecretProjection:
    name: str
    items: tuple[KeyToPath, ...] = ()
    optional: bool = False


@dataclass(frozen=True, slots=True)
class DownwardAPIProjection:
    items: tuple[DownwardAPIVolumeFile, ...] = ()


@dataclass(frozen=True, slots=True)
class ServiceAccountTokenProjection:
    path: str
    audience: str = ""
    expiration_seconds: int = 3600


VolumeProjection = (
    ConfigMapProjection | SecretProjection | DownwardAPIProjection | ServiceAccountTokenProjection
)


@dataclass(frozen=True, slots=True)
class ProjectedVolumeSource:
    sources: tuple[VolumeProjection, ...] = ()
    default_mode: int = DEFAULT_MODE


@dataclass(frozen=True, slots=True)
class NFSVolumeSource:
    server: str
    path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class HostPathVolumeSource:
    path: str
    type: str = ""
    """"", DirectoryOrCreate, Directory, FileOrCreate, File, Socket, CharDevice or BlockDevice."""


@dataclass(frozen=True, slots=True)
class EmptyDirVolumeSource:
    medium: str = ""
    """"" (a directory on the node's disk) or "Memory" (a tmpfs)."""
    size_limit: str = ""
    """A quantity; with medium Memory it sizes the tmpfs."""


@dataclass(frozen=True, slots=True)
class PersistentVolumeClaimVolumeSource:
    claim_name: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class LocalVolumeSource:
    """A PersistentVolume's `spec.local`: a path on the node, bind-mounted into pods."""

    path: str


@dataclass(frozen=True, slots=True)
class GitRepoVolumeSource:
    """`gitRepo`: an emptyDir into which `git clone` runs once per pod (kubelet's git_repo)."""

    repository: str
    revision: str = ""
    directory: str = ""
    """Where to clone inside the volume: "" (git's default name), "." (the volume root) or a
    directory name."""


@dataclass(frozen=True, slots=True)
class CSIVolumeSource:
    """`csi`: an inline volume of a CSI driver, which kubelet sets up through the driver (the
    agent's own, `fusevol.io`, publishes it: `fusevol.csi`). fusevol serves none as a pod-spec
    volume; it reads a `fusevol.io` volume's attributes to prepare it before kubelet publishes
    it (`fusevol.csi.preparing`)."""

    driver: str
    attributes: tuple[tuple[str, str], ...] = ()
    """`volumeAttributes` as pairs, of a `fusevol.io` volume only (another driver's are not
    kept: nothing reads them)."""
    type_name: ClassVar[str] = "csi"


@dataclass(frozen=True, slots=True)
class UnsupportedVolumeSource:
    """A volume type fusevol does not serve (yet); the pod's other volumes are still served."""

    type_name: str


@dataclass(frozen=True, slots=True)
class InvalidVolumeSource:
    """A volume whose source fusevol cannot read: that volume fails with `error` (kubelet's
    FailedMount), the pod's other volumes are still served."""

    type_name: str
    error: str
    """The field and what is wrong with it (`spec.volumes[1].secret.items[0].path: ...`)."""


VolumeSource = (
    ConfigMapVolumeSource
    | SecretVolumeSource
    | DownwardAPIVolumeSource
    | ProjectedVolumeSource
    | NFSVolumeSource
    | HostPathVolumeSource
    | EmptyDirVolumeSource
    | PersistentVolumeClaimVolumeSource
    | GitRepoVolumeSource
    | CSIVolumeSource
    | UnsupportedVolumeSource
    | InvalidVolumeSource
)

PersistentVolumeSource = (
    NFSVolumeSource | LocalVolumeSource | HostPathVolumeSource | UnsupportedVolumeSource
)
