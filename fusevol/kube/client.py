"""KubeClient: the only module that imports `kubernetes`; plain JSON dicts in and out.

Owns the client configuration (an explicit kubeconfig, else in-cluster when running in a pod,
else the standard kubeconfig resolution: `$KUBECONFIG`, `~/.kube/config`) and the calls fusevol
makes: list, watch, get, TokenRequest, Events, and the create/delete of the PersistentVolumes the
node provisions. Every call blocks, so callers run them in worker
threads (`trio.to_thread`); results are raw JSON (`_preload_content=False`), so that the one
converter of `fusevol.decode.manifest` reads API objects and manifests alike, and no time goes into
building client model objects that would be thrown away.

Failures are turned into two exceptions: `ApiError` (the server answered with a Status: 404, 410,
403, ...) and `ApiUnavailable` (no answer: refused, reset, timed out, cut mid-stream). The client's
own retries are off; the reflector backs off itself.

Excludes: what is listed or watched and why (`reflector`, `source`), token and event policy.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from fusevol.base.errors import FusevolError
from fusevol.model import Kind

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

Obj = dict[str, Any]

CONNECT_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 30.0
"""For lists, gets and posts; a watch waits longer (see `open_watch`)."""
WATCH_SILENCE_S = 150.0
"""A watch silent this long is given up and resumed from its resourceVersion: the API server's
watch cache sends a bookmark about every minute (cacher.go `bookmarkFrequency`), so this much
silence is a connection that died without a word (no HTTP/2 health check here, unlike client-go)."""
_IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"


class ApiError(FusevolError):
    """The API server answered with an error Status."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(f"{reason or code}: {message}" if message else str(reason or code))
        self.code = code
        self.reason = reason


class ApiUnavailable(FusevolError):
    """No usable answer from the API server (connection refused, reset, timed out, cut)."""


@dataclass(frozen=True, slots=True)
class Resource:
    kind: Kind
    namespaced: bool
    list_name: str
    """The API class's list method (`list_namespaced_config_map`, ...)."""
    read_name: str
    group: str = ""
    """"" for core/v1 (CoreV1Api), `storage.k8s.io` (StorageV1Api)."""
    list_all_name: str = ""
    """The list method across namespaces, for a namespaced kind listed without a namespace."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/v1" if self.group else "v1"


RESOURCES = {
    Kind.POD: Resource(Kind.POD, True, "list_pod_for_all_namespaces", "read_namespaced_pod"),
    Kind.CONFIG_MAP: Resource(
        Kind.CONFIG_MAP, True, "list_namespaced_config_map", "read_namespaced_config_map"
    ),
    Kind.SECRET: Resource(Kind.SECRET, True, "list_namespaced_secret", "read_namespaced_secret"),
    Kind.PERSISTENT_VOLUME_CLAIM: Resource(
        Kind.PERSISTENT_VOLUME_CLAIM,
        True,
        "list_namespaced_persistent_volume_claim",
        "read_namespaced_persistent_volume_claim",
        list_all_name="list_persistent_volume_claim_for_all_namespaces",
    ),
    Kind.PERSISTENT_VOLUME: Resource(
        Kind.PERSISTENT_VOLUME, False, "list_persistent_volume", "read_persistent_volume"
    ),
    Kind.STORAGE_CLASS: Resource(
        Kind.STORAGE_CLASS, False, "list_storage_class", "read_storage_class", "storage.k8s.io"
    ),
}


def in_cluster() -> bool:
    """True inside a pod (the service account's API server address is in the environment)."""
    return bool(os.environ.get(_IN_CLUSTER_ENV))


class KubeClient:
    """Blocking calls to the API server; safe to use from several threads at once."""

    def __init__(self, *, kubeconfig: Path | None) -> None:
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
        config.retries = False  # the reflector backs off; a hidden retry would only delay it
        # One connection per watched object; urllib3 logs a warning for every connection it
        # discards beyond the pool's size, so the pool holds them all.
        config.connection_pool_maxsize = 1024
        self.host: str = config.host
        api_client = kubernetes.client.ApiClient(config)
        self._apis: dict[str, Any] = {
            "": kubernetes.client.CoreV1Api(api_client),
            "storage.k8s.io": kubernetes.client.StorageV1Api(api_client),
        }

    # -- reads -------------------------------------------------------------------------------------

    def list(
        self,
        kind: Kind,
        *,
        namespace: str | None,
        field_selector: str = "",
        label_selector: str = "",
    ) -> tuple[list[Obj], str]:
        """(items, the list's resourceVersion)."""
        body = self._call(
            *_list_call(kind, namespace),
            field_selector=field_selector or None,
            label_selector=label_selector or None,
            _request_timeout=(CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S),
            _group=RESOURCES[kind].group,
        )
        items: list[Obj] = body.get("items") or []
        for item in items:  # items of a list carry no kind; the converter needs it
            item.setdefault("kind", kind.value)
            item.setdefault("apiVersion", RESOURCES[kind].api_version)
        return items, str(body.get("metadata", {}).get("resourceVersion", ""))

    def get(self, kind: Kind, *, namespace: str, name: str) -> Obj | None:
        """The object, or None if it does not exist."""
        args = (name, namespace) if RESOURCES[kind].namespaced else (name,)
        try:
            obj = self._call(
                RESOURCES[kind].read_name,
                *args,
                _request_timeout=(CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S),
                _group=RESOURCES[kind].group,
            )
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise
        obj.setdefault("kind", kind.value)
        obj.setdefault("apiVersion", RESOURCES[kind].api_version)
        return obj

    def open_watch(
        self,
        kind: Kind,
        *,
        namespace: str | None,
        field_selector: str,
        resource_version: str,
        timeout_s: int,
        label_selector: str = "",
    ) -> WatchStream:
        """Start a watch from `resource_version`, bookmarks requested. The server ends it after
        `timeout_s`; a connection silent for WATCH_SILENCE_S is given up before that."""
        response = self._open(
            *_list_call(kind, namespace),
            field_selector=field_selector or None,
            label_selector=label_selector or None,
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_s,
            _request_timeout=(CONNECT_TIMEOUT_S, WATCH_SILENCE_S),  # per read, not in total
            _group=RESOURCES[kind].group,
        )
        return WatchStream(response)

    # -- writes ------------------------------------------------------------------------------------

    def request_token(self, *, namespace: str, service_account: str, spec: Obj) -> Obj:
        """TokenRequest for `service_account`: the answer's `spec` and `status`."""
        body = kubernetes.client.AuthenticationV1TokenRequest.from_dict(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        )
        return self._call(
            "create_namespaced_service_account_token",
            service_account,
            namespace,
            body,
            _request_timeout=(CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S),
        )

    def create_event(self, *, namespace: str, event: Obj) -> Obj:
        body = kubernetes.client.CoreV1Event.from_dict(event)
        return self._call(
            "create_namespaced_event",
            namespace,
            body,
            _request_timeout=(CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S),
        )

    def patch_event(self, *, namespace: str, name: str, patch: Obj) -> Obj:
        return self._call(
            "patch_namespaced_event",
            name,
            namespace,
            patch,
            _request_timeout=(CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S),
        )

    def create_persistent_volume(self, pv: Obj) -> Obj:
        """POST the PV; `ApiError` 409 AlreadyExists if one of that name exists."""
        return self._call(
            "create_persistent_volume", pv, _request_timeout=(CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S)
        )

    def delete_persistent_volume(self, name: str) -> bool:
        """DELETE the PV; False if there was none (404)."""
        try:
            self._call(
                "delete_persistent_volume",
                name,
                _request_timeout=(CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S),
            )
        except ApiError as exc:
            if exc.code == 404:
                return False
            raise
        return True

    # -- plumbing ----------------------------------------------------------------------------------

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Obj:
        response = self._open(method, *args, **kwargs)
        try:
            data = response.data
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiUnavailable(f"{self.host}: {exc}") from None
        finally:
            response.release_conn()
        result: Obj = json.loads(data)
        return result

    def _open(self, method: str, *args: Any, _group: str = "", **kwargs: Any) -> Any:
        """Send the request to the API class of `_group`; the urllib3 response, body not yet
        read."""
        try:
            return getattr(self._apis[_group], method)(*args, _preload_content=False, **kwargs)
        except ApiException as exc:
            raise _api_error(exc) from None
        except (urllib3.exceptions.HTTPError, OSError, http.client.HTTPException) as exc:
            raise ApiUnavailable(f"{self.host}: {exc}") from None


class WatchStream:
    """One open watch: `next_event()` blocks in a worker thread; `close()` from any thread."""

    def __init__(self, response: Any) -> None:
        self._response = response
        self._lines: Iterator[str] = iter_resp_lines(response)  # type: ignore[no-untyped-call]
        self._lock = threading.Lock()
        self._reading = False
        self._closed = False
        self._aborted = False

    def next_event(self) -> Obj | None:
        """The next `{type, object}`; None when the server ended the watch."""
        with self._lock:
            if self._closed:
                return None
            self._reading = True
        try:
            while True:
                line = next(self._lines, None)
                if line is None:
                    self._done(self._response.release_conn)  # a clean end: reusable
                    return None
                if line.strip():
                    event: Obj = json.loads(line)
                    return event
        except (urllib3.exceptions.HTTPError, OSError, http.client.HTTPException) as exc:
            self._done(self._response.close)
            raise ApiUnavailable(f"watch: {exc}") from None
        except json.JSONDecodeError as exc:
            self._done(self._response.close)
            raise ApiUnavailable(f"watch: undecodable event: {exc}") from None
        finally:
            with self._lock:
                self._reading = False
                if self._aborted:
                    _quietly(self._response.close)

    def close(self) -> None:
        """Stop the watch; a thread blocked in `next_event()` wakes and returns. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = self._aborted = True
            if self._reading:  # wake the reader; it closes the response on its way out
                _quietly(self._response.shutdown)
            else:
                _quietly(self._response.close)

    def _done(self, finish: Callable[[], object]) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                _quietly(finish)


def _list_call(kind: Kind, namespace: str | None) -> tuple[str, ...]:
    """The list method and its positional arguments."""
    resource = RESOURCES[kind]
    if namespace is None and resource.list_all_name:
        return (resource.list_all_name,)
    return (resource.list_name, *_namespace_arg(kind, namespace))


def _namespace_arg(kind: Kind, namespace: str | None) -> tuple[str, ...]:
    if kind is Kind.POD:
        if namespace is not None:
            raise ValueError("pods are listed across namespaces")
        return ()
    if RESOURCES[kind].namespaced:
        assert namespace is not None
        return (namespace,)
    return ()


def _api_error(exc: ApiException) -> ApiError:
    code = int(exc.status or 0)
    reason, message = str(exc.reason or ""), ""
    try:
        status = json.loads(exc.body or b"{}")
        reason, message = status.get("reason", reason), status.get("message", "")
    except (ValueError, AttributeError):
        pass
    if code == 0:
        raise ApiUnavailable(reason)
    return ApiError(code, reason, message)


def _quietly(call: Callable[[], object]) -> None:
    with contextlib.suppress(Exception):  # closing a connection that may be gone already
        call()
