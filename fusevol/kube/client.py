"""KubeClient: the agent's one module that imports `kubernetes`; plain JSON dicts in and out.

Owns the client configuration, read by the `kubernetes` package (an explicit kubeconfig, else
in-cluster when running in a pod, else the standard kubeconfig resolution: `$KUBECONFIG`,
`~/.kube/config`; exec credential plugins and the in-cluster token's rotation through its refresh
hook; the TLS material, a kubeconfig's embedded keys kept in memory, never in files; the webhook's
client, `fusevol.webhook.cluster`, is configured here too), and the calls fusevol makes: list
(objects, or only their names and versions), watch, get, TokenRequest, Events, the create/delete of
the PersistentVolumes the node provisions, and `post` of any object (a review). The calls themselves
go over HTTP/2 (`http2`): awaited on the trio thread, every one a stream of the same connection, so
a thousand watches cost one connection and no thread. Results are raw JSON, so that the one
converter of `fusevol.decode.manifest` reads API objects and manifests alike.

Authentication is a seam: `KubeClient` authenticates with the configuration's bearer token or
client certificate (in its TLS context: a node's kubelet credentials, whose file kubelet rotates,
is read again for every new connection); `with_token(token)` and `with_authorization(value)` are
clients for the same connections that send another bearer token (a pod's service account's); a
client certificate is a TLS identity, so another one needs its own `KubeClient` (its own
connections). `whoami()` asks the API server who the client is (SelfSubjectReview).

Failures are turned into two exceptions: `ApiError` (the server answered with a Status: 404, 410,
403, ...) and `ApiUnavailable` (no answer: refused, reset, timed out, cut mid-stream), of which
`ApiUnreachable` (no connection at all: nothing was sent). Nothing is retried here; the reflector
backs off itself, or waits for the server's return (`wait_reachable`).

Excludes: what is listed or watched and why (`reflector`, `source`), token and event policy,
HTTP/2 itself (`http2`).
"""

from __future__ import annotations

import fcntl
import functools
import json
import logging
import math
import os
import re
import ssl
import threading
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import kubernetes
import trio

import fusevol
from fusevol.base.errors import FusevolError
from fusevol.kube.http2.errors import ConnectionLost, Unreachable
from fusevol.kube.http2.pool import Pool
from fusevol.kube.listing import Items, lazy_list, read_list
from fusevol.model import Kind

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from fusevol.kube.http2.response import Response
    from fusevol.kube.http2.state import Header

log = logging.getLogger(__name__)

Obj = dict[str, Any]

CONNECT_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 30.0
"""For lists, gets and posts, and for a watch to start (its response headers); an open watch
lasts until the server ends it, and a dead connection is found by its PINGs (`http2`)."""
REQUESTS_IN_FLIGHT = 64
"""Requests sent and not yet answered (a watch: until its headers), at most: thousands of
watches opened at once are a queue, not a burst that the server's priority and fairness would
answer with 429s, and they stay within one connection's streams."""
LARGE_BODY = 1 << 18
"""An answer this long (a list of thousands of pods) is decoded in a worker thread (a list's items
then one at a time: `listing`): json holds the GIL, but not for longer than its switch interval
while the trio thread has work."""
CREDENTIALS_S = 10.0
"""How long an authorization header is used before the configuration is asked again (its
refresh hook rereads the in-cluster token, or runs an exec plugin once the token expired)."""
_IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"


_METADATA_LIST = b"application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"

TOO_OLD = re.compile(r"too old resource version: \d+ \((\d+)\)")
"""kube-apiserver's 410 from its watch cache (k8s.io/apiserver cacher's watch_cache.go): the
version asked for, and the oldest it can still watch from (older ones get this 410)."""


class ApiError(FusevolError):
    """The API server answered with an error Status."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(f"{reason or code}: {message}" if message else str(reason or code))
        self.code = code
        self.reason = reason


class ApiUnavailable(FusevolError):
    """No usable answer from the API server (connection refused, reset, timed out, cut)."""

    def __init__(self, message: str, *, said: bool = False) -> None:
        super().__init__(message)
        self.said = said
        """A connection lost under many requests at once: it was logged once, for all."""


class ApiUnreachable(ApiUnavailable):
    """No connection to the API server could be made, and none is open: nothing was sent
    (`wait_reachable` says when one is)."""


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


def in_cluster() -> bool:
    """True inside a pod (the service account's API server address is in the environment)."""
    return bool(os.environ.get(_IN_CLUSTER_ENV))


class KubeClient:
    """Calls to the API server, awaited on the trio thread; see the module docstring."""

    def __init__(self, *, kubeconfig: Path | None) -> None:
        config = load_configuration(kubeconfig)
        self.host: str = config.host
        url = urllib.parse.urlsplit(config.host)
        if url.scheme not in ("https", "http") or not url.hostname:
            raise FusevolError(f"Kubernetes client configuration: bad server {config.host!r}")
        tls = url.scheme == "https"
        self._prefix = url.path.rstrip("/")
        self._authority = url.netloc.rpartition("@")[2].encode()
        self._scheme = url.scheme.encode()
        pool = functools.partial(
            Pool,
            host=url.hostname,
            port=url.port or (443 if tls else 80),
            server_hostname=getattr(config, "tls_server_name", None) or None,
            connect_timeout_s=CONNECT_TIMEOUT_S,
        )
        self._pool = pool(ssl_context=_TlsContexts(config) if tls else None)
        self._bearer_pool = self._pool
        """Where bearer tokens of others go: with a client certificate, connections that
        present none (kube-apiserver authenticates a connection's certificate before any token:
        a pod's token sent over the node's connection would read as the node)."""
        if tls and config.cert_file:
            self._bearer_pool = pool(ssl_context=_ssl_context(config, client_certificate=False))
        self._credentials: _Credentials = _ConfiguredCredentials(config)
        self._in_flight = trio.Semaphore(REQUESTS_IN_FLIGHT)
        self.horizon: dict[Kind, int] = {}
        """Where the server's watch caches start, by kind, as its 410s said: the reflectors'
        (`learn_horizon`); shared with `with_token`'s clients (the same server)."""

    def with_token(self, token: str) -> KubeClient:
        """A client for the same server and connections that authenticates as `token`'s
        owner (a bearer token: a service account's, a TokenRequest's answer)."""
        return self.with_authorization(lambda: f"Bearer {token}")

    def with_authorization(self, value: Callable[[], str]) -> KubeClient:
        """A client for the same server and connections whose `Authorization` header is
        `value()`, asked for every request (the freshest of tokens that change)."""
        other = object.__new__(KubeClient)
        other.__dict__.update(self.__dict__)
        other._pool = self._bearer_pool
        other._credentials = _CallableCredentials(value)
        return other

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

    async def wait_reachable(self) -> None:
        """After `ApiUnreachable`: until a connection to the API server is open again (one
        dialer for all the agent's waiters, jittered, every 2 s at most)."""
        await self._pool.wait_reachable()

    def statistics(self) -> ClientStatistics:
        return ClientStatistics(
            connections=self._pool.connections,
            connections_made=self._pool.connections_made,
            streams=self._pool.streams(),
            requests=sum(pool.requests for pool in {self._pool, self._bearer_pool}),
        )

    def close(self) -> None:
        """Close the connections (requests made after it open new ones)."""
        self._pool.close()
        self._bearer_pool.close()

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

    async def _read(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        data: bytes | None = None,
        content_type: str = "application/json",
        *,
        accept: bytes = b"application/json",
    ) -> bytes:
        """One request and its whole answer, within REQUEST_TIMEOUT_S."""
        try:
            async with self._in_flight:
                with trio.fail_after(REQUEST_TIMEOUT_S):
                    response = await self._send(
                        method, path, query, data, content_type, accept=accept
                    )
                    try:
                        return await response.read()
                    except ConnectionLost as exc:
                        raise ApiUnavailable(str(exc), said=exc.said) from None
                    finally:
                        response.close()
        except trio.TooSlowError:
            raise ApiUnavailable(f"{self.host}: {method} {path}: timed out") from None

    async def _send(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        data: bytes | None,
        content_type: str,
        *,
        accept: bytes = b"application/json",
    ) -> Response:
        """Send the request; its response once it has headers and a success status (the
        caller bounds the time and holds `_in_flight`)."""
        target = self._prefix + path
        if params := {k: v for k, v in query.items() if v}:
            target += "?" + urllib.parse.urlencode(params)
        headers: list[Header] = [
            (b":method", method.encode()),
            (b":scheme", self._scheme),
            (b":authority", self._authority),
            (b":path", target.encode()),
            (b"accept", accept),
            (b"user-agent", _USER_AGENT),
        ]
        if authorization := await self._credentials.authorization():
            headers.append((b"authorization", authorization.encode()))
        if data is not None:
            headers += [
                (b"content-type", content_type.encode()),
                (b"content-length", b"%d" % len(data)),
            ]
        try:
            response = await self._pool.request(headers, data)
            if response.status < 400:
                return response
            try:
                text = await response.read()
            finally:
                response.close()
        except Unreachable as exc:
            raise ApiUnreachable(str(exc)) from None
        except ConnectionLost as exc:
            raise ApiUnavailable(str(exc), said=exc.said) from None
        raise _api_error(response.status, text)


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


@dataclass(frozen=True, slots=True)
class ClientStatistics:
    connections: int
    """Open now."""
    connections_made: int
    """Since the start, the open ones included."""
    streams: int
    """Requests and watches open now."""
    requests: int = 0
    """Since the start (watches included)."""


class WatchStream:
    """One open watch: `next_event()` awaits the next event; `close()` (idempotent, never
    blocks) ends it. A reader that holds no task while the watch is idle asks `ready()`, and
    when it is not, `park(callback)`: `callback()` is called once it is."""

    __slots__ = ("_buffer", "_response")

    def __init__(self, response: Response) -> None:
        self._response = response
        self._buffer = b""

    async def next_event(self) -> Obj | None:
        """The next `{type, object}`; None when the server ended the watch."""
        while True:
            line, newline, rest = self._buffer.partition(b"\n")
            if newline:
                self._buffer = rest
                if not line.strip():
                    continue
                try:
                    event: Obj = json.loads(line)
                except ValueError as exc:
                    raise ApiUnavailable(f"watch: undecodable event: {exc}") from None
                return event
            try:
                data = await self._response.receive()
            except ConnectionLost as exc:
                raise ApiUnavailable(f"watch: {exc}", said=exc.said) from None
            if not data:
                if self._buffer.strip():
                    raise ApiUnavailable("watch: the stream ended in the middle of an event")
                return None
            self._buffer += data

    def ready(self) -> bool:
        """Whether `next_event()` has something to work on without waiting for the server: an
        event, the end, an error, or data (that may still be the start of an event only)."""
        return b"\n" in self._buffer or self._response.ready()

    def park(self, callback: Callable[[], None]) -> None:
        """Call `callback()` (once, from the connection's task: it must not block) when
        `ready()`; while it is not. Closing the stream drops it."""
        self._response.park(callback)

    def close(self) -> None:
        self._response.close()


class _Credentials:
    async def authorization(self) -> str:
        """The `Authorization` header's value ("" for none)."""
        raise NotImplementedError


class _CallableCredentials(_Credentials):
    def __init__(self, value: Callable[[], str]) -> None:
        self._value = value

    async def authorization(self) -> str:
        return self._value()


class _ConfiguredCredentials(_Credentials):
    """The configuration's bearer token, asked for again every CREDENTIALS_S (in a worker
    thread: an exec plugin's refresh runs a program)."""

    def __init__(self, config: Any) -> None:
        self._config = config
        self._value = ""
        self._at = -math.inf
        self._lock = trio.Lock()

    async def authorization(self) -> str:
        if trio.current_time() - self._at >= CREDENTIALS_S:
            async with self._lock:
                if trio.current_time() - self._at >= CREDENTIALS_S:
                    value = await trio.to_thread.run_sync(self._read)
                    self._value, self._at = value, trio.current_time()
        return self._value

    def _read(self) -> str:
        """The `authorization` header of the client library's own auth settings (which run its
        refresh hook)."""
        for setting in self._config.auth_settings().values():
            if setting.get("in") == "header" and setting.get("key") == "authorization":
                return str(setting.get("value") or "")
        return ""


def load_configuration(kubeconfig: Path | None) -> Any:
    """The `kubernetes` package's client configuration: `kubeconfig`, else in-cluster in a pod,
    else the standard kubeconfig resolution ($KUBECONFIG, ~/.kube/config).

    A kubeconfig's embedded data (`certificate-authority-data`, `client-certificate-data`,
    `client-key-data`, an exec plugin's `clientKeyData`) is handed to TLS as files: the package
    writes them to $TMPDIR, removed only at a clean exit. Here they are memory files instead
    (`_memory_file`), so a private key never reaches a disk and a killed agent leaves none."""
    kube_config = kubernetes.config.kube_config
    kube_config._create_temp_file_with_content = _memory_file  # its one writer of files
    config = kubernetes.client.Configuration()
    try:
        if kubeconfig is not None:
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(kubeconfig), client_configuration=config
            )
        elif in_cluster():
            kubernetes.config.load_incluster_config(client_configuration=config)  # type: ignore[no-untyped-call]
        else:
            kubernetes.config.load_kube_config(client_configuration=config)  # type: ignore[no-untyped-call]
    except (kubernetes.config.ConfigException, OSError) as exc:
        where = kubeconfig or ("in-cluster" if in_cluster() else "kubeconfig")
        raise FusevolError(f"Kubernetes client configuration ({where}): {exc}") from None
    return config


_memory_files: dict[bytes, str] = {}
_memory_files_lock = threading.Lock()


def _memory_file(
    content: bytes | str, temp_file_path: str | None = None, force_recreate: bool = False
) -> str:
    """The kubeconfig loader's `_create_temp_file_with_content` (its one writer of files, called
    while loading and from the refresh hook), with a memfd for the file: sealed, closed on exec,
    gone with the process, named `/proc/self/fd/N` for `ssl` to open. One per content, as the
    loader's own cache keeps one file per content; nothing can remove one, so `force_recreate`
    (for a file removed meanwhile) has nothing to do, and `temp_file_path` no place to say."""
    del temp_file_path, force_recreate
    data = content.encode() if isinstance(content, str) else content
    with _memory_files_lock:
        if (path := _memory_files.get(data)) is None:
            fd = os.memfd_create("kubeconfig-data", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            with open(fd, "wb", closefd=False) as file:
                file.write(data)
            seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
            path = _memory_files[data] = f"/proc/self/fd/{fd}"
    return path


class _TlsContexts:
    """The TLS context of each new connection: made again when the client certificate's file
    changed (kubelet rotates its client certificate by pointing `kubelet-client-current.pem` at
    a new file), so that connections made after a rotation present the new one."""

    def __init__(self, config: Any) -> None:
        self._config = config
        self._context = _ssl_context(config)
        self._version = self._file_version()

    def __call__(self) -> ssl.SSLContext:
        if (version := self._file_version()) != self._version:
            try:
                self._context = _ssl_context(self._config)
                self._version = version
            except FusevolError as exc:  # half-written: the old one, and again next time
                log.warning("client certificate not reloaded, keeping the old one: %s", exc)
        return self._context

    def _file_version(self) -> tuple[int, int] | None:
        if not self._config.cert_file:
            return None
        try:
            stat = os.stat(self._config.cert_file)  # through the symlink
        except OSError:
            return None
        return stat.st_ino, stat.st_mtime_ns


def _ssl_context(config: Any, *, client_certificate: bool = True) -> ssl.SSLContext:
    """The configuration's TLS: its CA (else the system's), its client certificate (unless
    not `client_certificate`), whether to verify; ALPN offers h2 only."""
    try:
        context = ssl.create_default_context(cafile=config.ssl_ca_cert or None)
        if config.cert_file and client_certificate:
            context.load_cert_chain(config.cert_file, config.key_file or None)
    except (OSError, ssl.SSLError) as exc:
        raise FusevolError(f"Kubernetes client configuration: TLS: {exc}") from None
    if not config.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    return context


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


def _api_error(status: int, text: bytes) -> ApiError:
    reason, message = "", ""
    try:
        body = json.loads(text or b"{}")
        reason, message = str(body.get("reason", "")), str(body.get("message", ""))
    except (ValueError, AttributeError):
        message = text[:200].decode(errors="replace")
    return ApiError(status, reason, message)


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


_USER_AGENT = f"fusevol/{fusevol.__version__}".encode()
