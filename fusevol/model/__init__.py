"""The Kubernetes objects fusevol acts on, as frozen fusevol types.

Every source (the manifest directory, the Kubernetes API) converts what it reads into these types
on the way in, so nothing below `fusevol.source` ever sees YAML, JSON or a client object. Only
the fields fusevol uses are kept. Names follow the Kubernetes API, in snake_case.

This package imports nothing third-party and holds no behaviour beyond trivial derived properties.
The volume sources are in `sources.py`, re-exported here: import everything from `fusevol.model`.
Which served volumes are audited (levels, the annotation, the rule) is `audit.py`'s.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NewType

from fusevol.model.sources import (
    DEFAULT_MODE as DEFAULT_MODE,
    ConfigMapProjection as ConfigMapProjection,
    ConfigMapVolumeSource as ConfigMapVolumeSource,
    CSIVolumeSource as CSIVolumeSource,
    DownwardAPIProjection as DownwardAPIProjection,
    DownwardAPIVolumeFile as DownwardAPIVolumeFile,
    DownwardAPIVolumeSource as DownwardAPIVolumeSource,
    EmptyDirVolumeSource as EmptyDirVolumeSource,
    GitRepoVolumeSource as GitRepoVolumeSource,
    HostPathVolumeSource as HostPathVolumeSource,
    InvalidVolumeSource as InvalidVolumeSource,
    KeyToPath as KeyToPath,
    LocalVolumeSource as LocalVolumeSource,
    NFSVolumeSource as NFSVolumeSource,
    ObjectFieldSelector as ObjectFieldSelector,
    PersistentVolumeClaimVolumeSource as PersistentVolumeClaimVolumeSource,
    PersistentVolumeSource as PersistentVolumeSource,
    ProjectedVolumeSource as ProjectedVolumeSource,
    ResourceFieldSelector as ResourceFieldSelector,
    SecretProjection as SecretProjection,
    SecretVolumeSource as SecretVolumeSource,
    ServiceAccountTokenProjection as ServiceAccountTokenProjection,
    UnsupportedVolumeSource as UnsupportedVolumeSource,
    VolumeProjection as VolumeProjection,
    VolumeSource as VolumeSource,
)

PodUID = NewType("PodUID", str)
"""`metadata.uid` of a pod."""

VolumeName = NewType("VolumeName", str)
"""`spec.volumes[].name`, unique within one pod."""

UniqueVolumeName = NewType("UniqueVolumeName", str)
"""Kubelet's unique name of a non-attachable pod volume: `<plugin name>/<pod uid>-<volume name>`."""

ResourceVersion = NewType("ResourceVersion", str)
"""`metadata.resourceVersion`: opaque, compared only for equality."""

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
"""The pod phases a pod never leaves: its containers have stopped, and none starts again."""


class Kind(enum.Enum):
    """The kinds of object a source delivers."""

    POD = "Pod"
    CONFIG_MAP = "ConfigMap"
    SECRET = "Secret"
    PERSISTENT_VOLUME = "PersistentVolume"
    PERSISTENT_VOLUME_CLAIM = "PersistentVolumeClaim"
    SERVICE_ACCOUNT_TOKEN = "ServiceAccountToken"
    """Not an API kind: a token the API source obtained by TokenRequest for one pod."""
    STORAGE_CLASS = "StorageClass"


@dataclass(frozen=True, slots=True)
class ObjectKey:
    """Identity of an object; cluster-scoped ones (PersistentVolume, StorageClass) have namespace
    ""."""

    kind: Kind
    namespace: str
    name: str

    def __str__(self) -> str:
        if not self.namespace:
            return f"{self.kind.value.lower()} {self.name}"
        return f"{self.kind.value.lower()} {self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class ConfigMap:
    namespace: str
    name: str
    resource_version: ResourceVersion
    data: Mapping[str, bytes] = field(default_factory=dict)
    """`data`, UTF-8 encoded once by the source: every volume projecting a key shares its bytes."""
    binary_data: Mapping[str, bytes] = field(default_factory=dict)
    immutable: bool = False

    @property
    def key(self) -> ObjectKey:
        return ObjectKey(Kind.CONFIG_MAP, self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class Secret:
    """A Secret with its `data` already base64-decoded (and `stringData` merged, as the API does).

    `__repr__` hides the bytes so that a stray log line cannot print them.
    """

    namespace: str
    name: str
    resource_version: ResourceVersion
    data: Mapping[str, bytes] = field(default_factory=dict, repr=False)
    type: str = "Opaque"
    immutable: bool = False

    @property
    def key(self) -> ObjectKey:
        return ObjectKey(Kind.SECRET, self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class Volume:
    name: VolumeName
    source: VolumeSource


@dataclass(frozen=True, slots=True)
class VolumeMount:
    name: VolumeName
    mount_path: str
    read_only: bool = False
    sub_path: str = ""
    sub_path_expr: str = ""
    """Expanded with the container's env (`$(VAR)`) into the subPath
    (`fusevol.node.container_mounts`)."""
    mount_propagation: str = ""
    """`None`, `HostToContainer` or `Bidirectional`; empty: the API's default (`None`)."""


@dataclass(frozen=True, slots=True)
class EnvVar:
    """A container's env entry: a literal `value`, or a downward-API `field_ref` (the only
    sources a subPathExpr can use without kubelet; others are kept as `other`)."""

    name: str
    value: str = ""
    field_ref: ObjectFieldSelector | None = None
    other: str = ""
    """The name of another `valueFrom` source (`secretKeyRef`, ...): known, not resolvable."""


@dataclass(frozen=True, slots=True)
class ResourceRequirements:
    """A container's `resources`: resource name -> quantity string (`cpu: 500m`)."""

    limits: Mapping[str, str] = field(default_factory=dict)
    requests: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Container:
    name: str
    volume_mounts: tuple[VolumeMount, ...] = ()
    run_as_user: int | None = None
    resources: ResourceRequirements = field(default_factory=ResourceRequirements)
    env: tuple[EnvVar, ...] = ()


@dataclass(frozen=True, slots=True)
class Pod:
    uid: PodUID
    namespace: str
    name: str
    resource_version: ResourceVersion
    node_name: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    volumes: tuple[Volume, ...] = ()
    containers: tuple[Container, ...] = ()
    init_containers: tuple[Container, ...] = ()
    fs_group: int | None = None
    run_as_user: int | None = None
    """`spec.securityContext.runAsUser`: the default for containers that set none."""
    service_account_name: str = "default"
    """`spec.serviceAccountName` (API default "default"): whose tokens the pod's volumes get."""
    deleting: bool = False
    """`metadata.deletionTimestamp` is set: kubelet is stopping the pod's containers."""
    finished: bool = False
    """`status.phase` is Succeeded or Failed (`TERMINAL_PHASES`): its containers have stopped,
    and none starts again."""
    origin: str = field(default="", compare=False)
    """Where the pod was read, for error lines: its manifest file; empty from the API server.
    Not part of the pod's content: moving a pod to another file changes nothing."""

    @property
    def key(self) -> ObjectKey:
        return ObjectKey(Kind.POD, self.namespace, self.name)

    @property
    def stopping(self) -> bool:
        """kubelet starts nothing more for the pod, volumes included: it is being deleted, or
        has finished (kubelet's `ShouldPodContainersBeTerminating`)."""
        return self.deleting or self.finished


@dataclass(frozen=True, slots=True)
class PersistentVolume:
    name: str
    resource_version: ResourceVersion
    source: PersistentVolumeSource
    mount_options: tuple[str, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    claim_ref: tuple[str, str] | None = None
    """(namespace, name) of the claim this volume is bound to, if any."""
    storage_class_name: str = ""
    node_names: tuple[str, ...] = ()
    """Hostnames of its required node affinity (local volumes), empty if none."""
    claim_uid: str = ""
    """`spec.claimRef.uid`: a claim of the same name but another uid is not this volume's."""
    reclaim_policy: str = ""
    """`spec.persistentVolumeReclaimPolicy`: Delete, Retain (or Recycle), "" if not given."""
    capacity: str = ""
    """`spec.capacity.storage`, a quantity: recorded, not enforced."""

    @property
    def key(self) -> ObjectKey:
        return ObjectKey(Kind.PERSISTENT_VOLUME, "", self.name)


@dataclass(frozen=True, slots=True)
class PersistentVolumeClaim:
    namespace: str
    name: str
    resource_version: ResourceVersion
    volume_name: str = ""
    """`spec.volumeName`: the bound PersistentVolume, empty while unbound."""
    storage_class_name: str = ""
    read_only: bool = False
    uid: str = ""
    """`metadata.uid`; "" for a manifest claim that gives none."""
    storage_request: str = ""
    """`spec.resources.requests.storage`, a quantity."""
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> ObjectKey:
        return ObjectKey(Kind.PERSISTENT_VOLUME_CLAIM, self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class ServiceAccountToken:
    """A token for one pod's serviceAccountToken projection, from a TokenRequest; memory only.

    `name` is `token_key(...).name`; `resource_version` changes with every new token, so that the
    volumes using it are refreshed. `__repr__` hides the token.
    """

    namespace: str
    name: str
    resource_version: ResourceVersion
    token: bytes = field(default=b"", repr=False)

    @property
    def key(self) -> ObjectKey:
        return ObjectKey(Kind.SERVICE_ACCOUNT_TOKEN, self.namespace, self.name)


def token_key(pod: Pod, projection: ServiceAccountTokenProjection) -> ObjectKey:
    """Where the token of `projection` in `pod` is kept: kubelet's token cache key (service
    account, audience, expiration, bound pod)."""
    name = "/".join(
        (
            pod.service_account_name,
            pod.name,
            pod.uid,
            projection.audience,
            str(projection.expiration_seconds),
        )
    )
    return ObjectKey(Kind.SERVICE_ACCOUNT_TOKEN, pod.namespace, name)


def referenced_objects(pod: Pod, source: object) -> tuple[ObjectKey, ...]:
    """The objects whose content a volume of `pod` shows, in projection order: its ConfigMaps and
    Secrets (in the pod's namespace) and, for projected tokens, where each token is kept. A claim's
    objects (the claim, its PV or class) are the source's concern: they need the store."""
    match source:
        case ConfigMapVolumeSource(name=name):
            return (ObjectKey(Kind.CONFIG_MAP, pod.namespace, name),)
        case SecretVolumeSource(secret_name=name):
            return (ObjectKey(Kind.SECRET, pod.namespace, name),)
        case ProjectedVolumeSource(sources=sources):
            keys = []
            for projection in sources:
                if isinstance(projection, ConfigMapProjection):
                    keys.append(ObjectKey(Kind.CONFIG_MAP, pod.namespace, projection.name))
                elif isinstance(projection, SecretProjection):
                    keys.append(ObjectKey(Kind.SECRET, pod.namespace, projection.name))
                elif isinstance(projection, ServiceAccountTokenProjection):
                    keys.append(token_key(pod, projection))
            return tuple(keys)
        case _:
            return ()


def names_objects(source: object) -> bool:
    """Whether a volume of this source reads ConfigMaps or Secrets (by name, from its pod's
    namespace): what the API server's Node authorizer reads from a pod's spec."""
    match source:
        case ConfigMapVolumeSource() | SecretVolumeSource():
            return True
        case ProjectedVolumeSource(sources=sources):
            return any(isinstance(p, ConfigMapProjection | SecretProjection) for p in sources)
        case _:
            return False


@dataclass(frozen=True, slots=True)
class StorageClass:
    """A `storage.k8s.io/v1` StorageClass (cluster-scoped): who provisions its claims, and how."""

    name: str
    resource_version: ResourceVersion
    provisioner: str
    parameters: Mapping[str, str] = field(default_factory=dict)
    reclaim_policy: str = "Delete"
    """The API's default: Delete."""
    volume_binding_mode: str = "Immediate"
    """The API's default: Immediate (WaitForFirstConsumer delays binding until a pod uses it)."""

    @property
    def key(self) -> ObjectKey:
        return ObjectKey(Kind.STORAGE_CLASS, "", self.name)


KubeObject = (
    Pod
    | ConfigMap
    | Secret
    | PersistentVolume
    | PersistentVolumeClaim
    | StorageClass
    | ServiceAccountToken
)


# -- what a volume shows ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FileProjection:
    """One file of a payload: kubelet's `volumeutil.FileProjection`."""

    data: bytes = field(repr=False)
    mode: int
    fs_user: int | None = None


Payload = Mapping[str, FileProjection]
"""Relative, validated, cleaned path -> file. Directories are implied by the paths."""
