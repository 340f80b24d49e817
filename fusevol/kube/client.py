"""KubeClient: the calls fusevol makes to the API server; plain JSON dicts in and out.

list (objects, or only their names and versions), watch, get, TokenRequest, Events, the
create/delete of the PersistentVolumes the node provisions, and `post` of any object (a review);
`whoami()` asks the API server who the client is (SelfSubjectReview). Each is a request of
`transport` (a `KubeClient` is a `Transport`: the client configuration, its TLS, its credentials,
HTTP/2), and an open watch is a `watch.WatchStream`. Results are raw JSON, so that the one
converter of `fusevol.decode.manifest` reads API objects and manifests alike.

Failures are the `errors`: `ApiError` (the server answered with a Status: 404, 410, 403, ...) and
`ApiUnavailable` (no answer), of which `ApiUnreachable` (nothing was sent). Nothing is retried
here; the reflector backs off itself, or waits for the server's return (`wait_reachable`). A
watch's 410 says where the server's watch cache starts: the client keeps that horizon for the
reflectors (`learn_horizon`).

Excludes: what is listed or watched and why (`reflector`, `source`), token and event policy,
how a request reaches the server (`transport`).
"""

from __future__ import annotations

import functools
import json
import re
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from fusevol.kube.errors import ApiError, ApiUnavailable
from fusevol.kube.listing import Items, lazy_list, read_list
from fusevol.kube.transport import REQUEST_TIMEOUT_S, Transport
from fusevol.kube.watch import WatchStream
from fusevol.model import Kind

if TYPE_CHECKING:
    from pathlib import Path

    from fusevol.kube.kubelet_credentials import ClientCertificate

Obj = dict[str, Any]

LARGE_BODY = 1 << 18
"""An answer this long (a list of thousands of pods) is decoded in a worker thread (a list's items
then one at a time: `listing`): json holds the GIL, but not for longer than its switch interval
while the trio thread has work."""


_METADATA_LIST = b"application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"

TOO_OLD = re.compile(r"too old resource version: \d+ \((\d+)\)")
"""kube-apiserver's 410 from its watch cache (k8s.io/apiserver cacher's watch_cache.go): the
version asked for, and the oldest it can still watch from (older ones get this 410)."""


def learn_horizon(horizon: dict[Kind, int], kind: Kind, expired: ApiError) -> bool:
    """Take in a watch's 410: True if it moved the server's horizon of `kind` on (the oldest
    resourceVersion its watch cache can still watch from; the reflector's step 4)."""
    found = TOO_OLD.search(str(expired))
    if found is None:
        return False
    oldest = int(found[1])
    if oldest <= horizon.get(kind, 0):
        return False
    horizon[kind] = oldest
    return True


def behind_horizon(horizon: dict[Kind, int], kind: Kind, resource_version: str) -> bool:
    """A watch of `kind` from `resource_version` would be answered 410 (`horizon`: a client's)."""
    return resource_version.isdigit() and int(resource_version) < horizon.get(kind, 0)


@dataclass(frozen=True, slots=True)
class Resource:
    kind: Kind
    namespaced: bool
    plural: str
    group: str = ""
    """"" for core/v1, `storage.k8s.io` for storage.k8s.io/v1."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/v1" if self.group else "v1"

    def path(self, namespace: str | None, name: str = "") -> str:
        base = f"/apis/{self.group}/v1" if self.group else "/api/v1"
        scope = f"/namespaces/{_quote(namespace)}" if self.namespaced and namespace else ""
        return f"{base}{scope}/{self.plural}" + (f"/{_quote(name)}" if name else "")


RESOURCES = {
    Kind.POD: Resource(Kind.POD, True, "pods"),
    Kind.CONFIG_MAP: Resource(Kind.CONFIG_MAP, True, "configmaps"),
    Kind.SECRET: Resource(Kind.SECRET, True, "secrets"),
    Kind.PERSISTENT_VOLUME_CLAIM: Resource(
        Kind.PERSISTENT_VOLUME_CLAIM, True, "persistentvolumeclaims"
    ),
    Kind.PERSISTENT_VOLUME: Resource(Kind.PERSISTENT_VOLUME, False, "persistentvolumes"),
    Kind.STORAGE_CLASS: Resource(Kind.STORAGE_CLASS, False, "storageclasses", "storage.k8s.io"),
}


class KubeClient(Transport):
    """Calls to the API server, awaited on the trio thread; see the module docstring."""

    def __init__(self, *, kubeconfig: Path | ClientCertificate | None) -> None:
        super().__init__(kubeconfig=kubeconfig)
        self.horizon: dict[Kind, int] = {}
        """Where the server's watch caches start, by kind, as its 410s said: the reflectors'
        (`learn_horizon`); shared with `with_token`'s clients (the same server)."""

    async def whoami(self) -> Identity | None:
        """Who the API server says this client is (SelfSubjectReview, authentication.k8s.io/v1,
        GA in v1.28); None from a server without it (404)."""
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        try:
            answer = await self.post("/apis/authentication.k8s.io/v1/selfsubjectreviews", body)
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise
        info = (answer.get("status") or {}).get("userInfo") or {}
        return Identity(str(info.get("username", "")), tuple(info.get("groups") or ()))

    # -- reads -------------------------------------------------------------------------------------

    async def list(
        self,
        kind: Kind,
        *,
        namespace: str | None,
        field_selector: str = "",
        label_selector: str = "",
        resource_version: str = "",
    ) -> tuple[Items, str]:
        """(items, the list's resourceVersion). With `resource_version`, a state no older than it
        (which the API server serves from its watch cache; "0": any state it has); without, the
        latest (from etcd). A large answer's items are decoded one at a time, as they are read
        (`listing`)."""
        resource = RESOURCES[kind]
        query = {"fieldSelector": field_selector, "labelSelector": label_selector}
        if resource_version == "0":
            query["resourceVersion"] = "0"
        elif resource_version:
            query |= {"resourceVersion": resource_version, "resourceVersionMatch": "NotOlderThan"}
        path = resource.path(namespace)
        text = await self._read("GET", path, query)
        if len(text) >= LARGE_BODY:
            read = functools.partial(lazy_list, kind=kind.value, api_version=resource.api_version)
            try:  # the trio thread runs meanwhile, at the GIL's switch interval
                return await trio.to_thread.run_sync(read, text)
            except ValueError as exc:
                raise _not_json(self.host, "GET", path, exc) from None
        body = _decoded(self.host, "GET", path, text)
        items: list[Obj] = body.get("items") or []
        for item in items:  # items of a list carry no kind; the converter needs it
            item.setdefault("kind", kind.value)
            item.setdefault("apiVersion", resource.api_version)
        return items, str(body.get("metadata", {}).get("resourceVersion", ""))

    async def list_versions(
        self, kind: Kind, *, namespace: str | None, resource_version: str, limit: int
    ) -> Versions:
        """The names and resourceVersions of the objects of `kind` in `namespace` (at most
        `limit` of them), no older than `resource_version`: a list of the objects' metadata alone
        (`PartialObjectMetadataList`, meta.k8s.io/v1, as client-go's metadata client asks for it),
        never their data, however large their data are. With a limit, kube-apiserver v1.28 reads
        the list from etcd, not from its watch cache: a page of at most `limit` objects."""
        query = {
            "resourceVersion": resource_version,
            "resourceVersionMatch": "NotOlderThan",
            "limit": str(limit),
        }
        path = RESOURCES[kind].path(namespace)
        text = await self._read("GET", path, query, accept=_METADATA_LIST)
        try:
            if len(text) < LARGE_BODY:
                return _versions(text)
            return await trio.to_thread.run_sync(_versions, text)
        except ValueError as exc:
            raise _not_json(self.host, "GET", path, exc) from None

    async def get(self, kind: Kind, *, namespace: str, name: str) -> Obj | None:
        """The object, or None if it does not exist."""
        resource = RESOURCES[kind]
        try:
            obj = await self.request("GET", resource.path(namespace, name))
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise
        obj.setdefault("kind", kind.value)
        obj.setdefault("apiVersion", resource.api_version)
        return obj

    async def open_watch(
        self,
        kind: Kind,
        *,
        namespace: str | None,
        field_selector: str,
        resource_version: str,
        timeout_s: int,
        label_selector: str = "",
    ) -> WatchStream:
        """Start a watch from `resource_version`, bookmarks requested; the server ends it after
        `timeout_s`."""
        query = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_s),
            "fieldSelector": field_selector,
            "labelSelector": label_selector,
        }
        try:
            async with self._in_flight:
                if behind_horizon(self.horizon, kind, resource_version):  # learnt while queued
                    oldest = self.horizon[kind]
                    message = f"too old resource version: {resource_version} ({oldest})"
                    raise ApiError(410, "Expired", message)  # what the server would answer
                with trio.fail_after(REQUEST_TIMEOUT_S):
                    response = await self._send(
                        "GET", RESOURCES[kind].path(namespace), query, None, ""
                    )
        except trio.TooSlowError:
            self._unanswered("GET")
            raise ApiUnavailable(
                f"{self.host}: watch {query['fieldSelector']}: no answer"
            ) from None
        return WatchStream(response)

    # -- writes ------------------------------------------------------------------------------------

    async def request_token(self, *, namespace: str, service_account: str, spec: Obj) -> Obj:
        """TokenRequest for `service_account`: the answer's `spec` and `status`."""
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        path = f"/api/v1/namespaces/{_quote(namespace)}/serviceaccounts/"
        return await self.post(f"{path}{_quote(service_account)}/token", body)

    async def create_event(self, *, namespace: str, event: Obj) -> Obj:
        return await self.post(f"/api/v1/namespaces/{_quote(namespace)}/events", event)

    async def patch_event(self, *, namespace: str, name: str, patch: Obj) -> Obj:
        return await self.request(
            "PATCH",
            f"/api/v1/namespaces/{_quote(namespace)}/events/{_quote(name)}",
            body=patch,
            content_type="application/strategic-merge-patch+json",
        )

    async def create_persistent_volume(self, pv: Obj) -> Obj:
        """POST the PV; `ApiError` 409 AlreadyExists if one of that name exists."""
        return await self.post(RESOURCES[Kind.PERSISTENT_VOLUME].path(None), pv)

    async def delete_persistent_volume(self, name: str) -> bool:
        """DELETE the PV; False if there was none (404)."""
        try:
            await self.request("DELETE", RESOURCES[Kind.PERSISTENT_VOLUME].path(None, name))
        except ApiError as exc:
            if exc.code == 404:
                return False
            raise
        return True

    async def post(self, path: str, body: Obj) -> Obj:
        """POST `body` (an object: a TokenRequest, a TokenReview, a SubjectAccessReview, ...)
        to `path`; the server's answer."""
        return await self.request("POST", path, body=body)

    # -- plumbing ----------------------------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        body: Obj | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        """One request and its whole JSON answer, within REQUEST_TIMEOUT_S."""
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        text = await self._read(method, path, query or {}, data, content_type)
        if len(text) < LARGE_BODY:
            return _decoded(self.host, method, path, text)
        # the trio thread runs meanwhile, at the GIL's switch interval
        return await trio.to_thread.run_sync(_decoded, self.host, method, path, text)


@dataclass(frozen=True, slots=True)
class Versions:
    """A list of names and versions (`KubeClient.list_versions`)."""

    names: dict[str, str]
    """Each listed object's resourceVersion, by name."""
    resource_version: str
    """The list's."""
    total: int
    """How many objects there are: more than `names` holds when the limit cut the list short."""


@dataclass(frozen=True, slots=True)
class Identity:
    """A user as the API server authenticated it."""

    username: str
    groups: tuple[str, ...]

    @property
    def node(self) -> str | None:
        """The node's name if this is a node's identity, as kube's Node authorizer reads it
        (user `system:node:<name>` in group `system:nodes`); else None."""
        prefix = "system:node:"
        if "system:nodes" in self.groups and self.username.startswith(prefix):
            return self.username.removeprefix(prefix) or None
        return None


def _versions(text: bytes) -> Versions:
    """A metadata list's answer (ValueError if it is none). Its items are decoded one at a time:
    a large list is transient, and its dicts would otherwise be scattered among what the agent
    keeps (`listing`)."""
    items, listed = read_list(text, kind="PartialObjectMetadata", api_version="meta.k8s.io/v1")
    names: dict[str, str] = {}
    for item in items:
        metadata = item.get("metadata")
        if not isinstance(metadata, dict) or not isinstance(name := metadata.get("name"), str):
            raise ValueError("an item without metadata.name")
        names[name] = str(metadata.get("resourceVersion", ""))
    total = len(names)
    if listed.get("continue"):  # cut short by the limit: how many more, if the server says
        total += max(1, int(listed.get("remainingItemCount") or 0))
    return Versions(names, str(listed.get("resourceVersion", "")), total)


def _decoded(host: str, method: str, path: str, text: bytes) -> Obj:
    try:
        result: Obj = json.loads(text)
    except ValueError as exc:
        raise _not_json(host, method, path, exc) from None
    return result


def _not_json(host: str, method: str, path: str, exc: ValueError) -> ApiUnavailable:
    return ApiUnavailable(f"{host}: {method} {path}: not JSON: {exc}")


def _quote(part: str) -> str:
    return urllib.parse.quote(part, safe="")
