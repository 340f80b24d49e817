"""What the webhook reads of the API server, kept current in memory: the CSIDriver fusevol.io, and
each namespace's audit level (its annotation `fusevol.io/audit`).

Each watch (`DriverWatch`, `NamespaceWatch`; `run` is a thread of its own) lists its objects
(the CSIDriver by the field selector `metadata.name`, the namespaces all), then watches them from
the list's resourceVersion, with bookmarks, and starts again with a list when the watch ends,
fails or is too old (410). After an error it waits with client-go's backoff (0.8 s doubling to
30 s) before listing again, and keeps what it knew meanwhile: neither the driver nor a namespace's
level comes and goes with the API server's availability. `DriverWatch.driver()` answers from
memory, so an admission never waits for the API server for it; until the first list, it says the
driver is not known yet (nothing is converted). `NamespaceWatch.level()` answers from memory too,
but for a namespace it has not seen (created since, or nothing listed yet: no permission, the API
server unreachable) it reads the namespace (GET, NAMESPACE_GET_TIMEOUT_S at most); a namespace
that cannot be read is one WARNING naming it, and the level `off`: the pod is converted without
the namespace's level, never held up.

The one module of the webhook that imports the `kubernetes` client; it reads raw JSON
(`_preload_content=False`), never the client's models. Excludes: what the CSIDriver allows
(`fusevol.webhook.convert.Driver`), what a level audits (`fusevol.model.audit`).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import TYPE_CHECKING, Any

import kubernetes

from fusevol.kube.configuration import load_configuration
from fusevol.model.audit import ANNOTATION as AUDIT_ANNOTATION, AuditLevel, pod_level
from fusevol.webhook.convert import DRIVER, Driver

if TYPE_CHECKING:
    from pathlib import Path

log = logging.getLogger(__name__)

BACKOFF_INITIAL_S = 0.8
BACKOFF_MAX_S = 30.0
WATCH_TIMEOUT_S = 300
"""The server ends each watch after this long (`timeoutSeconds`); then it is opened again."""
REQUEST_TIMEOUT_S = 10.0
"""Connect and read timeout of a list; a watch's read timeout is WATCH_TIMEOUT_S plus this."""
NAMESPACE_GET_TIMEOUT_S = 1.0
"""Connect and read timeout of the GET of a namespace not seen yet, during an admission (which
the API server gives up on after the webhook's timeoutSeconds, 5 s in the chart)."""
_SELECTOR = f"metadata.name={DRIVER}"
_UNSEEN = "\0unseen"
"""A namespace the watch has not seen (no annotation's text has a NUL)."""


def api_client(kubeconfig: Path | None) -> Any:
    """A client for the API server, configured as the agent's (`load_configuration`)."""
    config = load_configuration(kubeconfig)
    config.retries = False  # the watch loop backs off itself
    return kubernetes.client.ApiClient(config)


class _ListWatch:
    """List, then watch, until `stop` (module docstring); what is kept is the subclass's."""

    resource = ""
    """For the log: what is listed and watched."""

    def __init__(self) -> None:
        self.listed = threading.Event()
        """Set once the first list has answered (readiness)."""
        self._stop = threading.Event()

    def stop(self) -> None:
        """End `run`: at once when it waits, else when the watch in progress ends (at most
        WATCH_TIMEOUT_S; a thread of a stopping process need not wait for it: a daemon)."""
        self._stop.set()

    def run(self) -> None:
        """List and watch until `stop` (module docstring)."""
        delay = BACKOFF_INITIAL_S
        while not self._stop.is_set():
            try:
                version = self._list()
                delay = BACKOFF_INITIAL_S
                while version and not self._stop.is_set():
                    version = self._watch(version)
            except Exception as exc:  # the API server's or the network's: listed again later
                if self._stop.is_set():
                    return
                log.warning(
                    "%s list or watch failed, retrying in %.1fs error=%s",
                    self.resource,
                    delay,
                    _reason(exc),
                )
                self._stop.wait(delay)
                delay = min(delay * 2, BACKOFF_MAX_S)

    def _request(self, **kwargs: Any) -> Any:
        """The list (or with `watch=True` the watch) request, unread."""
        raise NotImplementedError

    def _replace(self, items: list[Any]) -> None:
        """What a list answered: every object there is."""
        raise NotImplementedError

    def _event(self, kind: str, obj: Any) -> None:
        """One event of a watch: ADDED, MODIFIED or DELETED (BOOKMARK: nothing)."""
        raise NotImplementedError

    def _list(self) -> str:
        response = self._request(_request_timeout=REQUEST_TIMEOUT_S)
        value = json.loads(response.data)
        self._replace([item for item in value.get("items") or [] if isinstance(item, dict)])
        self.listed.set()
        return str(value.get("metadata", {}).get("resourceVersion") or "")

    def _watch(self, version: str) -> str:
        """One watch from `version`: the version to go on from, or "" to list again."""
        response = self._request(
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_TIMEOUT_S,
            _request_timeout=(REQUEST_TIMEOUT_S, WATCH_TIMEOUT_S + REQUEST_TIMEOUT_S),
        )
        try:
            for line in response:
                if self._stop.is_set():
                    return ""
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":  # 410 Gone above all: the version is too old
                    log.info(
                        "%s watch ended, listing again reason=%s", self.resource, obj.get("reason")
                    )
                    return ""
                version = str(obj.get("metadata", {}).get("resourceVersion") or version)
                if kind in ("ADDED", "MODIFIED", "DELETED") and isinstance(obj, dict):
                    self._event(kind, obj)
        finally:
            response.close()
        return version


class DriverWatch(_ListWatch):
    resource = "csidriver"

    def __init__(self, client: Any) -> None:
        super().__init__()
        self._api: Any = kubernetes.client.StorageV1Api(client)
        self._driver: Driver | None = None

    def driver(self) -> Driver:
        """The CSIDriver as last seen (module docstring)."""
        known = self._driver
        if known is None:
            return Driver.missing(f"the CSIDriver {DRIVER} is not known yet")
        return known

    def _request(self, **kwargs: Any) -> Any:
        return self._api.list_csi_driver(field_selector=_SELECTOR, _preload_content=False, **kwargs)

    def _replace(self, items: list[Any]) -> None:
        named = [item for item in items if _named(item)]
        self._set(named[0] if named else None)

    def _event(self, kind: str, obj: Any) -> None:
        if _named(obj):
            self._set(None if kind == "DELETED" else obj)

    def _set(self, obj: Any) -> None:
        """The CSIDriver object, or None when there is none."""
        if obj is None:
            driver = Driver.missing(f"the CSIDriver {DRIVER} does not exist")
        else:
            driver = Driver.from_object(obj)
        if driver != self._driver:
            log.info("csidriver driver=%s state=%s", DRIVER, driver.problem or "usable")
        self._driver = driver


class NamespaceWatch(_ListWatch):
    """The audit level of each namespace, from its annotation (module docstring). Only the
    annotation's text is kept of a namespace."""

    resource = "namespace"

    def __init__(self, client: Any) -> None:
        super().__init__()
        self._api: Any = kubernetes.client.CoreV1Api(client)
        self._texts: dict[str, str | None] = {}
        """Namespace -> its annotation's text (None: none), of every namespace seen."""

    def level(self, namespace: str) -> AuditLevel:
        """The level `namespace`'s annotation asks for; `off` if it cannot be read (logged).
        Never raises."""
        try:
            seen = self._texts.get(namespace, _UNSEEN)  # one read: the watch changes it
            if seen is not _UNSEEN:
                return _level(seen)
            response = self._api.read_namespace(
                namespace, _preload_content=False, _request_timeout=NAMESPACE_GET_TIMEOUT_S
            )
            return _level(_annotation(json.loads(response.data)))
        except Exception as exc:  # no permission, the API server's or the network's failure
            log.warning(
                "namespace not read, its audit level is not applied namespace=%s error=%s",
                namespace,
                _reason(exc),
            )
            return AuditLevel.OFF

    def _request(self, **kwargs: Any) -> Any:
        return self._api.list_namespace(_preload_content=False, **kwargs)

    def _replace(self, items: list[Any]) -> None:
        texts = {}
        for item in items:
            name = (item.get("metadata") or {}).get("name")
            if isinstance(name, str):
                texts[name] = _annotation(item)
                self._changed(name, texts[name])
        self._texts = texts

    def _event(self, kind: str, obj: Any) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if not isinstance(name, str):
            return
        if kind == "DELETED":
            self._texts.pop(name, None)
        else:
            text = _annotation(obj)
            self._changed(name, text)
            self._texts[name] = text

    def _changed(self, name: str, text: str | None) -> None:
        """Log a level that is new or changed (a namespace without the annotation: none)."""
        if self._texts.get(name, None) == text:
            return
        log.info("namespace audit namespace=%s level=%s", name, _level(text).name.lower())
        if text is not None and text.strip().upper() not in AuditLevel.__members__:
            log.warning(
                "namespace annotation %s=%r is not one of off, secrets, all: audited as all "
                "namespace=%s",
                AUDIT_ANNOTATION,
                text,
                name,
            )


def _annotation(obj: Any) -> str | None:
    """A namespace's `fusevol.io/audit` annotation, or None."""
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    text = annotations.get(AUDIT_ANNOTATION) if isinstance(annotations, dict) else None
    return text if isinstance(text, str) else None


def _level(text: str | None) -> AuditLevel:
    """As a pod's annotation reads (`fusevol.model.audit.pod_level`): a typo audits `all`."""
    return pod_level({} if text is None else {AUDIT_ANNOTATION: text})


def _reason(exc: Exception) -> str:
    """One line: the API server's status and reason, or the error."""
    if isinstance(exc, kubernetes.client.ApiException):
        return f"{exc.status} {exc.reason}"
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _named(obj: Any) -> bool:
    return isinstance(obj, dict) and (obj.get("metadata") or {}).get("name") == DRIVER
