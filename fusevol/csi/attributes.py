"""A NodePublishVolume request -> what to serve, for whom, where: checked, or a `CsiError`.

Owns the volume attributes fusevol's CSI driver reads (a pod's `csi.volumeAttributes`, which
kubelet passes as `volume_context`), kubelet's `podInfoOnMount` keys, its
`serviceAccount.tokens`, and the checks of the target path. What to serve is exactly one of:

    configMap: NAME          shorthand for `configMap: {name: NAME}`
    secret: NAME             shorthand for `secret: {secretName: NAME}`
    volume: <YAML or JSON>   one configMap, secret, downwardAPI or projected volume source, as in
                             a pod spec (`{configMap: {name: app, items: [...]}}`)

parsed by the pod-spec parser (`fusevol.decode.volume_sources.parse_volumes`), so the same
defaulting and validation apply. Anyone who may create a pod writes these attributes, so `volume`
is bounded before it is built: at most `MAX_VOLUME_BYTES` (a ConfigMap's own limit), nested at
most `MAX_DEPTH` levels, no YAML aliases (which make a few bytes into a graph that every walk
over it takes exponentially long to visit), and whatever else the YAML parser refuses is an
INVALID_ARGUMENT too. Confinement (anyone who may create a pod writes these attributes):
objects come from the pod's own namespace only, so an attribute `namespace` (or a `namespace` key
anywhere in `volume`) naming another one is refused; any other volume type (hostPath, ...) is
refused; the target must be kubelet's `<kubelet dir>/pods/<pod
uid>/volumes/kubernetes.io~csi/<volume>/mount` for the pod the request names, below no symlink; and
the volume handle must be kubelet's handle for that pod volume (`csi-` + hex sha256 of pod uid and
volume name).

Excludes: whether the pod is one of this node's (`fusevol.csi.pods`), the gRPC codes
(`fusevol.csi.server`).
"""

from __future__ import annotations

import enum
import functools
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from fusevol.base.errors import FusevolError, ManifestError
from fusevol.decode.reader import MAX_DATA_BYTES, Reader
from fusevol.decode.volume_sources import CSI_DRIVER, parse_volumes
from fusevol.model import (
    CSIVolumeSource,
    InvalidVolumeSource,
    Pod,
    PodUID,
    UniqueVolumeName,
    Volume,
    VolumeName,
    VolumeSource,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

DRIVER = CSI_DRIVER
POD_NAME = "csi.storage.k8s.io/pod.name"
POD_NAMESPACE = "csi.storage.k8s.io/pod.namespace"
POD_UID = "csi.storage.k8s.io/pod.uid"
SERVICE_ACCOUNT = "csi.storage.k8s.io/serviceAccount.name"
EPHEMERAL = "csi.storage.k8s.io/ephemeral"
TOKENS = "csi.storage.k8s.io/serviceAccount.tokens"
KUBELET_PREFIX = "csi.storage.k8s.io/"
ATTRIBUTES = ("configMap", "secret", "volume")
AUDIT = "fusevol.io/audit"
"""`"true"`: every open of the volume's files is recorded (`fusevol.model.audit`)."""
SERVED_TYPES = ("configMap", "secret", "downwardAPI", "projected")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
MAX_VOLUME_BYTES = MAX_DATA_BYTES
"""The `volume` attribute's size at most: what a whole ConfigMap may hold (a volume source
with a thousand items of 1 KiB paths fits)."""
MAX_DEPTH = 32
"""Nesting of the `volume` attribute at most: a volume source needs six levels (projected,
sources, a source, its type, items, an item); the manifest decoder's 500 is for whole objects."""

try:
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]


class Code(enum.Enum):
    """The gRPC status a failed request answers (`fusevol.csi.server` maps them)."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    UNAVAILABLE = "UNAVAILABLE"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    ABORTED = "ABORTED"
    INTERNAL = "INTERNAL"


class CsiError(FusevolError):
    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """Who kubelet says the volume is for (`podInfoOnMount`)."""

    namespace: str
    name: str
    uid: PodUID
    service_account: str


@dataclass(frozen=True, slots=True)
class Publication:
    """One checked NodePublishVolume: everything but the tokens is what the agent records."""

    volume_id: str
    target: Path
    pod: PodIdentity
    volume: Volume
    attributes: Mapping[str, str]
    """The volume context without the tokens: compared on a repeated publish, recorded."""
    fs_group: int | None = None
    tokens: Mapping[str, bytes] = field(default_factory=dict, repr=False)
    """audience -> token, from `csi.storage.k8s.io/serviceAccount.tokens`; memory only."""
    audit: bool = False
    """The `fusevol.io/audit` attribute: audit every open of the volume's files."""


def parse(
    *,
    volume_id: str,
    target_path: str,
    context: Mapping[str, str],
    volume_mount_group: str,
    kubelet_dir: Path,
    made: bool = True,
) -> Publication:
    """Check a NodePublishVolume request and say what it asks for (module docstring). Not
    `made`: the request kubelet is yet to make, whose target's parent it has yet to make
    (`fusevol.csi.preparing`)."""
    pod = _pod_identity(context)
    volume_name = _check_target(target_path, pod.uid, kubelet_dir, made=made)
    expected = volume_handle(pod.uid, volume_name)
    if volume_id != expected:
        raise CsiError(
            Code.INVALID_ARGUMENT,
            f"volume_id {volume_id!r} is not kubelet's handle of volume {volume_name!r} of pod "
            f"{pod.namespace}/{pod.name} ({expected}); only inline ephemeral volumes are served",
        )
    attributes = without_tokens(context)
    source = _volume_source(attributes, pod, volume_name)
    fs_group = None
    if volume_mount_group:
        if not volume_mount_group.isdigit() or int(volume_mount_group) > 2**31 - 1:
            raise CsiError(
                Code.INVALID_ARGUMENT,
                f"volume_mount_group {volume_mount_group!r} is not a group id",
            )
        fs_group = int(volume_mount_group)
    return Publication(
        volume_id,
        Path(target_path),
        pod,
        Volume(VolumeName(volume_name), source),
        attributes,
        fs_group,
        _tokens(context.get(TOKENS)),
        _audit(attributes.get(AUDIT, "false")),
    )


def without_tokens(context: Mapping[str, str]) -> dict[str, str]:
    """A volume context without kubelet's tokens: what is compared and recorded of it."""
    return {k: v for k, v in context.items() if k != TOKENS}


def volume_mount_group(fs_group: int | None) -> str:
    """The `volume_mount_group` kubelet sends for a pod's fsGroup (none: empty)."""
    return "" if fs_group is None else str(fs_group)


def _audit(value: str) -> bool:
    if value not in ("true", "false"):
        raise CsiError(
            Code.INVALID_ARGUMENT, f'volumeAttributes {AUDIT}: {value!r} is not "true" or "false"'
        )
    return value == "true"


def volume_handle(uid: str, volume_name: str) -> str:
    """kubelet's handle of an inline CSI volume (`makeVolumeHandle`)."""
    return "csi-" + hashlib.sha256(f"{uid}{volume_name}".encode()).hexdigest()


def _pod_identity(context: Mapping[str, str]) -> PodIdentity:
    missing = [k for k in (POD_NAME, POD_NAMESPACE, POD_UID) if not context.get(k)]
    if missing:
        raise CsiError(
            Code.INVALID_ARGUMENT,
            f"volume_context has no {', '.join(missing)}: the CSIDriver {DRIVER} must set "
            "podInfoOnMount: true",
        )
    if context.get(EPHEMERAL, "true") != "true":
        raise CsiError(
            Code.INVALID_ARGUMENT,
            f"{EPHEMERAL} is {context[EPHEMERAL]!r}: {DRIVER} serves inline ephemeral volumes only",
        )
    return PodIdentity(
        context[POD_NAMESPACE],
        context[POD_NAME],
        PodUID(context[POD_UID]),
        context.get(SERVICE_ACCOUNT) or "default",
    )


def target(kubelet_dir: Path, uid: str, volume_name: str) -> Path:
    """kubelet's target path of CSI volume `volume_name` of pod `uid`."""
    return kubelet_dir / "pods" / uid / "volumes" / "kubernetes.io~csi" / volume_name / "mount"


def unique_name(volume_id: str) -> UniqueVolumeName:
    """kubelet's unique name of a CSI volume: `kubernetes.io/csi/<driver>^<handle>`."""
    return UniqueVolumeName(f"kubernetes.io/csi/{DRIVER}^{volume_id}")


def _check_target(target_path: str, uid: str, kubelet_dir: Path, *, made: bool) -> str:
    """The pod volume name, if `target_path` is kubelet's target of a CSI volume of pod `uid`.
    In gRPC's thread, whose every system call may wait for the GIL: a handful of them."""
    parts = Path(target_path).parts
    if (
        not os.path.isabs(target_path)
        or os.path.normpath(target_path) != target_path
        or len(parts) < 7
        or parts[-6:] != ("pods", uid, "volumes", "kubernetes.io~csi", parts[-2], "mount")
        or not _NAME.fullmatch(parts[-2])
        or not _same_directory(Path(*parts[:-6]), kubelet_dir)
    ):
        raise CsiError(
            Code.INVALID_ARGUMENT,
            f"target_path {target_path!r} is not {kubelet_dir}/pods/{uid}/volumes/"
            "kubernetes.io~csi/<volume>/mount (the kubelet directory is --kubelet-dir)",
        )
    if made and not target_made(target_path, kubelet_dir):
        raise CsiError(
            Code.INVALID_ARGUMENT,
            f"target_path {target_path!r}: its parent is not a directory kubelet made "
            "(missing, or a symlink)",
        )
    return parts[-2]


def target_made(target_path: str, kubelet_dir: Path) -> bool:
    """Whether the directories kubelet makes for a CSI target (its pod's, and the volume's,
    which holds the target) are there, none of them a symlink: of a target path `parse` took."""
    return _directories(kubelet_dir / "pods", Path(target_path).parts[-5:-1])


def _same_directory(given: Path, kubelet_dir: Path) -> bool:
    return given == kubelet_dir or os.path.realpath(given) == _real(kubelet_dir)


@functools.lru_cache(maxsize=4)
def _real(kubelet_dir: Path) -> str:
    """The kubelet directory's real path: resolved once (the node's, fixed)."""
    return os.path.realpath(kubelet_dir)


def _directories(below: Path, names: tuple[str, ...]) -> bool:
    """`below/names[0]/names[1]/...` are directories, none of them a symlink."""
    path = below
    for name in names:
        path = path / name
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return False
        except OSError:
            return False
    return True


def _volume_source(
    attributes: Mapping[str, str], pod: PodIdentity, volume_name: str
) -> VolumeSource:
    for key, value in attributes.items():
        if key == "namespace":
            if value != pod.namespace:
                raise CsiError(
                    Code.PERMISSION_DENIED,
                    f"volumeAttributes namespace {value!r}: objects come only from the pod's own "
                    f"namespace {pod.namespace!r}",
                )
        elif key not in (*ATTRIBUTES, AUDIT) and not key.startswith(KUBELET_PREFIX):
            raise CsiError(
                Code.INVALID_ARGUMENT,
                f"volumeAttributes {key!r} is not known: give one of configMap, secret, volume",
            )
    given = [key for key in ATTRIBUTES if key in attributes]
    if len(given) != 1:
        raise CsiError(
            Code.INVALID_ARGUMENT,
            "volumeAttributes must give exactly one of configMap, secret, volume"
            + (f" (got {', '.join(given)})" if given else ""),
        )
    key = given[0]
    value = attributes[key]
    entry: dict[str, object]
    if key == "configMap":
        entry = {"configMap": {"name": value}}
    elif key == "secret":
        entry = {"secret": {"secretName": value}}
    else:
        entry = _parse_volume(value, pod)
    reader = Reader(origin=f"volumeAttributes {key!r}", subject=f"pod {pod.namespace}/{pod.name}")
    try:
        (volume,) = parse_volumes(reader, [{"name": volume_name, **entry}])
    except ManifestError as exc:
        raise CsiError(Code.INVALID_ARGUMENT, _in_attribute(str(exc))) from None
    if isinstance(volume.source, InvalidVolumeSource):
        error = f"{reader.origin}: {reader.subject}: {volume.source.error}"
        raise CsiError(Code.INVALID_ARGUMENT, _in_attribute(error))
    return volume.source


read_source = _volume_source  # public: fusevol.webhook reads its conversions back through it


def pod_sources(pod: Pod) -> list[VolumeSource]:
    """What the `fusevol.io` volumes of `pod` serve (their attributes, as the store keeps them:
    `CSIVolumeSource`), before kubelet publishes them (the API source tracks what they reference
    from the moment it sees the pod). A volume whose attributes do not read, in whatever way (a
    tenant wrote them), is left out: its publish refuses it, saying why."""
    identity = PodIdentity(pod.namespace, pod.name, pod.uid, pod.service_account_name)
    sources: list[VolumeSource] = []
    for volume in pod.volumes:
        source = volume.source
        if not isinstance(source, CSIVolumeSource) or source.driver != DRIVER:
            continue
        try:
            sources.append(_volume_source(dict(source.attributes), identity, volume.name))
        except Exception:  # a tenant wrote them: left to its publish (docstring)
            continue
    return sources


def _in_attribute(error: str) -> str:
    """The parser names the field from the pod spec down; the volume entry here is implied."""
    return error.replace("spec.volumes[0].", "", 1)


def _parse_volume(text: str, pod: PodIdentity) -> dict[str, object]:
    value = _load(text)
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in SERVED_TYPES:
        raise CsiError(
            Code.INVALID_ARGUMENT,
            "volumeAttributes 'volume' must be a mapping with one key, the volume type: "
            + ", ".join(SERVED_TYPES),
        )
    for namespace in _namespaces(value):
        if namespace != pod.namespace:
            raise CsiError(
                Code.PERMISSION_DENIED,
                f"volumeAttributes 'volume' names namespace {namespace!r}: objects come only "
                f"from the pod's own namespace {pod.namespace!r}",
            )
    return value


def _load(text: str) -> object:
    """The `volume` attribute's value, bounded (module docstring), or INVALID_ARGUMENT."""
    size = len(text.encode(errors="surrogatepass"))
    if size > MAX_VOLUME_BYTES:
        raise _refused(f"is too long: must have at most {MAX_VOLUME_BYTES} bytes (has {size})")
    try:  # JSON first, as the webhook writes it: a tenth of the time of YAML's two readings
        value = json.loads(text)
    except (ValueError, RecursionError):
        pass  # YAML, or JSON that YAML's reading below refuses with the reason
    else:
        if _depth(value) > MAX_DEPTH:
            raise _refused(f"is nested more than {MAX_DEPTH} levels deep")
        return value
    try:
        depth = 0
        for event in yaml.parse(text, Loader=_SafeLoader):  # JSON is YAML
            if isinstance(event, yaml.AliasEvent):
                raise _refused("holds a YAML alias: not accepted")
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise _refused(f"is nested more than {MAX_DEPTH} levels deep")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
        return yaml.load(text, Loader=_SafeLoader)
    except CsiError:
        raise
    except yaml.YAMLError as exc:
        raise _refused(f"is not YAML or JSON: {' '.join(str(exc).split())}") from None
    except Exception as exc:  # a tag's constructor (`!!timestamp x`): whatever Python raises
        raise _refused(
            f"is not YAML or JSON: a tagged value cannot be constructed ({type(exc).__name__})"
        ) from None


def _depth(value: object) -> int:
    """How many collections deep `value` is nested (a stack of its own: no recursion)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        each, depth = stack.pop()
        if isinstance(each, dict):
            each = list(each.values())
        if isinstance(each, list):
            deepest = max(deepest, depth)
            stack.extend((item, depth + 1) for item in each)
    return deepest


def _refused(why: str) -> CsiError:
    return CsiError(Code.INVALID_ARGUMENT, f"volumeAttributes 'volume' {why}")


def _namespaces(value: object) -> list[object]:
    """Every value of a `namespace` key, at any depth (a stack of its own: no recursion)."""
    found: list[object] = []
    stack = [value]
    while stack:
        each = stack.pop()
        if isinstance(each, dict):
            for key, item in each.items():
                if key == "namespace":
                    found.append(item)
                stack.append(item)
        elif isinstance(each, list):
            stack.extend(each)
    return found


def _tokens(text: str | None) -> dict[str, bytes]:
    """kubelet's `serviceAccount.tokens`: audience -> {"token", "expirationTimestamp"}."""
    if not text:
        return {}
    try:
        value = json.loads(text)
        return {str(aud): str(status["token"]).encode() for aud, status in value.items()}
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        raise CsiError(
            Code.INVALID_ARGUMENT, f"{TOKENS} is not kubelet's map of audience to token"
        ) from None
