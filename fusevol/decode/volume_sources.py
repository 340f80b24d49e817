"""`spec.volumes` of a manifest Pod -> model volume sources, validated as the API server would.

Owns the volume types fusevol serves from memory (configMap, secret, downwardAPI, projected), their
API defaulting (`defaultMode` 0644, fieldRef `apiVersion` v1, token `expirationSeconds` 3600) and
the part of `pkg/apis/core/validation` that shapes them (docs/kubelet.md fact 4): one type per
volume and at most one per projected source; `KeyToPath` and downward API item paths local and not
reserved; fieldRef limited to the pod's name, namespace, uid, labels and annotations (one key of the
last two by subscript, the key a qualified name, lower-cased first for annotations);
resourceFieldRef naming a container and a cpu, memory, ephemeral-storage or hugepages limit or
request, with a divisor from the API's list; serviceAccountToken between 10 minutes and 2^32
seconds; no item path twice across a projected volume's sources. Any other type becomes
`UnsupportedVolumeSource`, and so does a projected volume with a clusterTrustBundle or
podCertificate source, which the model cannot carry. The mount-backed types are read here too: nfs,
hostPath, emptyDir, persistentVolumeClaim and gitRepo (a repository is required; its directory is
relative and has no '..' element).

A divisor is compared in its canonical form, as the API server compares it (`1024Ki` is `1Mi`),
and a zero divisor is no divisor (what the API server stores for an omitted one: `"0"`). As on
the API server, an empty projected source is allowed (it projects nothing), and the first error
found in a volume is the one reported. A volume whose source breaks these rules becomes
`InvalidVolumeSource`: it alone fails, with that error.

Excludes: the other pod fields (`fusevol.decode.objects`), field readers
(`fusevol.decode.reader`), and what kubelet checks again when it renders
(`fusevol.projection.downward`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fusevol import model
from fusevol.base import quantity
from fusevol.base.errors import ManifestError
from fusevol.decode.reader import DNS_SUBDOMAIN, describe_type, quote
from fusevol.model import VolumeName

if TYPE_CHECKING:
    from collections.abc import Mapping

    from fusevol.decode.reader import Reader

_FIELD_PATHS = (
    "metadata.annotations",
    "metadata.labels",
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
)
_RESOURCES = (
    "limits.cpu",
    "limits.ephemeral-storage",
    "limits.memory",
    "requests.cpu",
    "requests.ephemeral-storage",
    "requests.memory",
)
_HUGEPAGES = ("limits.hugepages-", "requests.hugepages-")
_CPU_DIVISORS = frozenset({"1m", "1"})
_BYTE_DIVISORS = frozenset(
    {"1", "1k", "1M", "1G", "1T", "1P", "1E", "1Ki", "1Mi", "1Gi", "1Ti", "1Pi", "1Ei"}
)
_BYTE_DIVISOR_LIST = "1, 1k, 1M, 1G, 1T, 1P, 1E, 1Ki, 1Mi, 1Gi, 1Ti, 1Pi, 1Ei"
CSI_DRIVER = "fusevol.io"
"""fusevol's CSI driver (`fusevol.csi.attributes.DRIVER`): the one whose attributes are kept."""
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_SERVED_PROJECTIONS = frozenset({"configMap", "secret", "downwardAPI", "serviceAccountToken"})
_DEFAULT_TOKEN_SECONDS = 3600


def parse_volumes(r: Reader, value: object) -> tuple[model.Volume, ...]:
    """`spec.volumes`: unique DNS-label names, one type each (no type: an emptyDir).

    A volume whose name is wrong fails the pod: nothing could refer to it. One whose source is
    wrong is an `InvalidVolumeSource` carrying the error, so that it fails alone, as a volume
    kubelet cannot set up does, and the pod's other volumes are still served."""
    volumes: list[model.Volume] = []
    for index, raw in enumerate(r.sequence(value, "spec.volumes")):
        path = f"spec.volumes[{index}]"
        entry = r.mapping(raw, path)
        name = r.term(entry.get("name"), f"{path}.name", required=True)
        r.dns_name(name, f"{path}.name", subdomain=False)
        if any(volume.name == name for volume in volumes):
            r.fail(f"{path}.name", f"Duplicate value: {quote(name)}")
        # A key set to null is no volume type; no type at all is defaulted to emptyDir.
        types = [key for key, item in entry.items() if key != "name" and item is not None]
        type_name = " and ".join(sorted(map(str, types))) if types else "emptyDir"
        try:
            if len(types) > 1:
                r.fail(path, "may not specify more than 1 volume type")
            source = _volume_source(
                r, type_name=type_name, value=entry.get(type_name), path=f"{path}.{type_name}"
            )
        except ManifestError as exc:
            source = model.InvalidVolumeSource(type_name, exc.field or str(exc))
        volumes.append(model.Volume(VolumeName(name), source))
    return tuple(volumes)


def _volume_source(r: Reader, *, type_name: str, value: object, path: str) -> model.VolumeSource:
    if type_name == "downwardAPI":
        source = r.mapping(value, path)
        return model.DownwardAPIVolumeSource(
            items=_downward_items(r, source.get("items"), f"{path}.items", claims=None),
            default_mode=_default_mode(r, source.get("defaultMode"), f"{path}.defaultMode"),
        )
    if type_name == "projected":
        return _projected(r, value, path)
    if type_name in ("nfs", "hostPath"):
        inline = persistent_source(r, type_name=type_name, value=value, path=path)
        assert not isinstance(inline, model.LocalVolumeSource)  # `local` exists in PVs only
        return inline
    if type_name == "emptyDir":
        source = r.mapping(value or {}, path)
        medium = r.string(source.get("medium"), f"{path}.medium")
        if medium not in ("", "Memory"):
            r.fail(f"{path}.medium", f'unsupported value {quote(medium)}: use "" or "Memory"')
        limit = source.get("sizeLimit")
        size_limit = (
            "" if limit is None else r.quantity_map({"sizeLimit": limit}, path)["sizeLimit"]
        )
        return model.EmptyDirVolumeSource(medium, size_limit)
    if type_name == "gitRepo":
        return _git_repo(r, value, path)
    if type_name == "persistentVolumeClaim":
        source = r.mapping(value, path)
        return model.PersistentVolumeClaimVolumeSource(
            r.term(source.get("claimName"), f"{path}.claimName", required=True),
            r.boolean(source.get("readOnly"), f"{path}.readOnly"),
        )
    if type_name == "csi":
        return _csi(r, value, path)
    if type_name not in ("configMap", "secret"):
        return model.UnsupportedVolumeSource(type_name=type_name)
    source = r.mapping(value, path)
    name_field = "name" if type_name == "configMap" else "secretName"
    name = r.term(source.get(name_field), f"{path}.{name_field}", required=True)
    items = r.items(source.get("items"), f"{path}.items")
    default_mode = _default_mode(r, source.get("defaultMode"), f"{path}.defaultMode")
    optional = r.boolean(source.get("optional"), f"{path}.optional")
    if type_name == "configMap":
        return model.ConfigMapVolumeSource(name, items, default_mode, optional)
    return model.SecretVolumeSource(name, items, default_mode, optional)


def _git_repo(r: Reader, value: object, path: str) -> model.GitRepoVolumeSource:
    """`validateGitRepoVolumeSource`: a repository, and a directory that is a local descending
    path. What kubelet checks again at set-up (no leading '-') is left to it."""
    source = r.mapping(value, path)
    repository = r.string(source.get("repository"), f"{path}.repository", required=True)
    directory = r.string(source.get("directory"), f"{path}.directory")
    if directory.startswith("/"):
        r.fail(f"{path}.directory", f"invalid value {quote(directory)}: must be a relative path")
    if ".." in directory.split("/"):
        r.fail(f"{path}.directory", f"invalid value {quote(directory)}: must not contain '..'")
    revision = r.string(source.get("revision"), f"{path}.revision")
    return model.GitRepoVolumeSource(repository, revision, directory)


def persistent_source(
    r: Reader, *, type_name: str, value: object, path: str
) -> model.NFSVolumeSource | model.HostPathVolumeSource | model.LocalVolumeSource:
    """nfs, hostPath (in a pod or a PersistentVolume) and local (PersistentVolume only)."""
    source = r.mapping(value, path)
    if type_name == "nfs":
        server = r.string(source.get("server"), f"{path}.server", required=True)
        export = r.string(source.get("path"), f"{path}.path", required=True)
        if not export.startswith("/"):
            r.fail(f"{path}.path", f"invalid value {quote(export)}: must be an absolute path")
        return model.NFSVolumeSource(
            server, export, r.boolean(source.get("readOnly"), f"{path}.readOnly")
        )
    local_path = r.string(source.get("path"), f"{path}.path", required=True)
    if ".." in local_path.split("/"):
        r.fail(f"{path}.path", f"invalid value {quote(local_path)}: must not contain '..'")
    if type_name == "local":
        return model.LocalVolumeSource(local_path)
    host_type = r.string(source.get("type"), f"{path}.type")
    if host_type not in _HOST_PATH_TYPES:
        r.fail(f"{path}.type", f"unsupported value {quote(host_type)}")
    return model.HostPathVolumeSource(local_path, host_type)


_HOST_PATH_TYPES = frozenset(
    {
        "",
        "DirectoryOrCreate",
        "Directory",
        "FileOrCreate",
        "File",
        "Socket",
        "CharDevice",
        "BlockDevice",
    }
)


def _default_mode(r: Reader, value: object, path: str) -> int:
    mode = r.mode(value, path)
    return model.DEFAULT_MODE if mode is None else mode


# -- projected -------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Claims:
    """The item paths a projected volume's sources have taken so far (the API's `allPaths`)."""

    root: str
    """The projected volume's field path, where the API server reports a duplicate."""
    taken: set[str] = field(default_factory=set)

    def claim(self, r: Reader, target: str, *, shown: str) -> None:
        """Take `target`; `shown` is what the API server's error names (a source name or path)."""
        if target in self.taken:
            r.fail(self.root, f"invalid value {quote(shown)}: conflicting duplicate paths")
        self.taken.add(target)


def _projected(r: Reader, value: object, path: str) -> model.VolumeSource:
    source = r.mapping(value, path)
    default_mode = _default_mode(r, source.get("defaultMode"), f"{path}.defaultMode")
    claims = _Claims(path)
    projections: list[model.VolumeProjection] = []
    unsupported = ""
    for index, raw in enumerate(r.sequence(source.get("sources"), f"{path}.sources")):
        at = f"{path}.sources[{index}]"
        entry = r.mapping(raw, at)
        types = [key for key, item in entry.items() if item is not None]
        if len(types) > 1:
            r.fail(at, "may not specify more than 1 volume type")
        if not types:
            continue  # the API server accepts an empty source; it projects nothing
        type_name, value = str(types[0]), entry[types[0]]
        if type_name in _SERVED_PROJECTIONS:
            projections.append(
                _projection(r, type_name, value, path=f"{at}.{type_name}", claims=claims)
            )
            continue
        if type_name == "clusterTrustBundle":  # its path still counts against duplicates
            target = r.string(
                r.mapping(value, f"{at}.{type_name}").get("path"),
                f"{at}.{type_name}.path",
                required=True,
            )
            r.local_path(target, f"{at}.{type_name}.path")
            claims.claim(r, target, shown=target)
        unsupported = unsupported or f"projected with {type_name}"
    if unsupported:
        return model.UnsupportedVolumeSource(type_name=unsupported)
    return model.ProjectedVolumeSource(sources=tuple(projections), default_mode=default_mode)


def _csi(r: Reader, value: object, path: str) -> model.CSIVolumeSource:
    """`csi`: its driver, and for fusevol's own (`CSI_DRIVER`) its attributes (the API server
    checked both: a string, a map of strings)."""
    source = r.mapping(value, path)
    driver = r.string(source.get("driver"), f"{path}.driver", required=True)
    if driver != CSI_DRIVER:
        return model.CSIVolumeSource(driver)
    attributes = r.string_map(source.get("volumeAttributes") or {}, f"{path}.volumeAttributes")
    return model.CSIVolumeSource(driver, tuple(attributes.items()))


def _projection(
    r: Reader, type_name: str, value: object, *, path: str, claims: _Claims
) -> model.VolumeProjection:
    source = r.mapping(value, path)
    if type_name == "downwardAPI":
        files = _downward_items(r, source.get("items"), f"{path}.items", claims=claims)
        return model.DownwardAPIProjection(items=files)
    if type_name == "serviceAccountToken":
        return _service_account_token(r, source, path)
    name = r.term(source.get("name"), f"{path}.name", required=True)
    items = r.items(source.get("items"), f"{path}.items")
    for item in items:
        claims.claim(r, item.path, shown=name)
    optional = r.boolean(source.get("optional"), f"{path}.optional")
    if type_name == "configMap":
        return model.ConfigMapProjection(name, items, optional)
    return model.SecretProjection(name, items, optional)


def _service_account_token(
    r: Reader, token: Mapping[object, object], path: str
) -> model.ServiceAccountTokenProjection:
    seconds = token.get("expirationSeconds")
    if seconds is None:
        seconds = _DEFAULT_TOKEN_SECONDS
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        r.fail(f"{path}.expirationSeconds", f"must be an integer, not {describe_type(seconds)}")
    if seconds < 10 * 60:
        r.fail(
            f"{path}.expirationSeconds",
            f"invalid value {seconds}: may not specify a duration less than 10 minutes",
        )
    if seconds > 1 << 32:
        r.fail(
            f"{path}.expirationSeconds",
            f"invalid value {seconds}: may not specify a duration larger than 2^32 seconds",
        )
    target = r.string(token.get("path"), f"{path}.path", required=True)
    r.local_path(target, f"{path}.path")
    audience = r.string(token.get("audience"), f"{path}.audience")
    return model.ServiceAccountTokenProjection(
        path=target, audience=audience, expiration_seconds=seconds
    )


# -- downward API ----------------------------------------------------------------------------------


def _downward_items(
    r: Reader, value: object, path: str, *, claims: _Claims | None
) -> tuple[model.DownwardAPIVolumeFile, ...]:
    """Items of a downwardAPI volume, or of a projected source (which `claims` their paths)."""
    files: list[model.DownwardAPIVolumeFile] = []
    for index, raw in enumerate(r.sequence(value, path)):
        at = f"{path}[{index}]"
        item = r.mapping(raw, at)
        target = r.term(item.get("path"), f"{at}.path", required=True)
        r.local_path(target, f"{at}.path")
        field_ref = item.get("fieldRef")
        resource_ref = item.get("resourceFieldRef")
        if field_ref is not None and resource_ref is not None:
            r.fail(at, "fieldRef and resourceFieldRef can not be specified simultaneously")
        if field_ref is None and resource_ref is None:
            r.fail(at, "Required value: one of fieldRef and resourceFieldRef is required")
        mode = r.mode(item.get("mode"), f"{at}.mode")
        if claims is not None:
            claims.claim(r, target, shown=target)
        files.append(
            model.DownwardAPIVolumeFile(
                path=target,
                field_ref=None if field_ref is None else _field_ref(r, field_ref, f"{at}.fieldRef"),
                resource_field_ref=None
                if resource_ref is None
                else _resource_ref(r, resource_ref, f"{at}.resourceFieldRef"),
                mode=mode,
            )
        )
    return tuple(files)


def _field_ref(r: Reader, value: object, path: str) -> model.ObjectFieldSelector:
    ref = r.mapping(value, path)
    api_version = r.term(ref.get("apiVersion"), f"{path}.apiVersion") or "v1"
    at = f"{path}.fieldPath"
    field_path = r.term(ref.get("fieldPath"), at, required=True)
    converting = f"invalid value {quote(field_path)}: error converting fieldPath"
    if api_version != "v1":
        r.fail(at, f"{converting}: unsupported pod version: {api_version}")
    subscripted = _split_subscript(field_path)
    if subscripted is None:
        if field_path not in _FIELD_PATHS:
            supported = ", ".join(quote(name) for name in _FIELD_PATHS)
            r.fail(at, f"unsupported value {quote(field_path)}: supported values: {supported}")
        return model.ObjectFieldSelector(field_path=field_path, api_version=api_version)
    prefix, key = subscripted
    if prefix not in ("metadata.annotations", "metadata.labels"):
        r.fail(at, f"{converting}: field label does not support subscript")
    if prefix == "metadata.annotations":  # Go's strings.ToLower: U+0130 becomes a plain i
        key = key.replace("\u0130", "i").lower()
    if not _is_qualified_name(key):
        r.fail(
            path,
            f"invalid value {quote(key)}: a qualified name must consist of alphanumeric "
            "characters, '-', '_' or '.', and must start and end with an alphanumeric character, "
            "with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
        )
    return model.ObjectFieldSelector(field_path=field_path, api_version=api_version)


def _split_subscript(field_path: str) -> tuple[str, str] | None:
    """`fieldpath.SplitMaybeSubscriptedPath` (kubelet's copy: `projection.downward`)."""
    if not field_path.endswith("']"):
        return None
    prefix, bracket, key = field_path[:-2].partition("['")
    return (prefix, key) if bracket and prefix else None


def _is_qualified_name(value: str) -> bool:
    """`IsQualifiedName(value)` is empty (kubelet's copy, with messages: `projection.downward`)."""
    prefix, slash, name = value.rpartition("/")
    if slash and not (prefix and len(prefix) <= 253 and DNS_SUBDOMAIN.fullmatch(prefix)):
        return False
    return len(name) <= 63 and _QUALIFIED_NAME.fullmatch(name) is not None


def _resource_ref(r: Reader, value: object, path: str) -> model.ResourceFieldSelector:
    ref = r.mapping(value, path)
    container = r.string(ref.get("containerName"), f"{path}.containerName", required=True)
    resource = r.string(ref.get("resource"), f"{path}.resource", required=True)
    if resource not in _RESOURCES and not resource.startswith(_HUGEPAGES):
        supported = ", ".join(quote(name) for name in _RESOURCES)
        r.fail(
            f"{path}.resource",
            f"unsupported value {quote(resource)}: supported values: {supported}",
        )
    divisor = ref.get("divisor")
    if isinstance(divisor, int) and not isinstance(divisor, bool):
        divisor = str(divisor)
    text = r.string(divisor, f"{path}.divisor")
    if text:
        try:
            form = quantity.canonical(text)
        except ValueError as exc:
            r.fail(f"{path}.divisor", str(exc))
        # `validateContainerResourceDivisor`: zero, however written, is unset (the API server
        # stores an omitted divisor as "0"); any other is compared in its canonical form.
        allowed, message = _divisors(resource)
        if form != "0" and form not in allowed:
            r.fail(f"{path}.divisor", f"invalid value {quote(text)}: {message}")
        text = "" if form == "0" else form
    return model.ResourceFieldSelector(resource=resource, container_name=container, divisor=text)


def _divisors(resource: str) -> tuple[frozenset[str], str]:
    """The divisors allowed with `resource`, and the API server's message naming them."""
    if resource in ("limits.cpu", "requests.cpu"):
        return _CPU_DIVISORS, "only divisor's values 1m and 1 are supported with the cpu resource"
    kind = {
        "limits.memory": "memory",
        "requests.memory": "memory",
        "limits.ephemeral-storage": "local ephemeral storage",
        "requests.ephemeral-storage": "local ephemeral storage",
    }.get(resource, "hugepages")
    message = f"only divisor's values {_BYTE_DIVISOR_LIST} are supported with the {kind} resource"
    return _BYTE_DIVISORS, message
