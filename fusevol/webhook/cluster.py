"""The CSIDriver fusevol.io as the API server has it, kept current in memory for the webhook.

`DriverWatch.run` (a thread of its own) lists the CSIDriver (field selector `metadata.name`),
then watches it from the list's resourceVersion, with bookmarks, and starts again with a list
when the watch ends, fails or is too old (410). After an error it waits with client-go's
backoff (0.8 s doubling to 30 s) before listing again, and keeps what it knew meanwhile: the
driver does not come and go with the API server's availability. `driver()` answers from memory,
so an admission never waits for the API server; until the first list, it says the driver is not
known yet (nothing is converted).

The one module of the webhook that imports the `kubernetes` client; it reads raw JSON
(`_preload_content=False`), never the client's models. Excludes: what the CSIDriver allows
(`fusevol.webhook.convert.Driver`).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import TYPE_CHECKING, Any

import kubernetes

from fusevol.kube.configuration import load_configuration
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
_SELECTOR = f"metadata.name={DRIVER}"


def api_client(kubeconfig: Path | None) -> Any:
    """A client for the API server, configured as the agent's (`load_configuration`)."""
    config = load_configuration(kubeconfig)
    config.retries = False  # the watch loop backs off itself
    return kubernetes.client.ApiClient(config)


class DriverWatch:
    def __init__(self, client: Any) -> None:
        self._api: Any = kubernetes.client.StorageV1Api(client)
        self._driver: Driver | None = None
        self.listed = threading.Event()
        """Set once the first list has answered (readiness)."""
        self._stop = threading.Event()

    def driver(self) -> Driver:
        """The CSIDriver as last seen (module docstring)."""
        known = self._driver
        if known is None:
            return Driver.missing(f"the CSIDriver {DRIVER} is not known yet")
        return known

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
                    "csidriver list or watch failed, retrying in %.1fs error=%s", delay, exc
                )
                self._stop.wait(delay)
                delay = min(delay * 2, BACKOFF_MAX_S)

    def _list(self) -> str:
        response = self._api.list_csi_driver(
            field_selector=_SELECTOR, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
        )
        value = json.loads(response.data)
        items = [item for item in value.get("items") or [] if _named(item)]
        self._set(items[0] if items else None)
        self.listed.set()
        return str(value.get("metadata", {}).get("resourceVersion") or "")

    def _watch(self, version: str) -> str:
        """One watch from `version`: the version to go on from, or "" to list again."""
        response = self._api.list_csi_driver(
            field_selector=_SELECTOR,
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_TIMEOUT_S,
            _preload_content=False,
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
                    log.info("csidriver watch ended, listing again reason=%s", obj.get("reason"))
                    return ""
                version = str(obj.get("metadata", {}).get("resourceVersion") or version)
                if kind in ("ADDED", "MODIFIED") and _named(obj):
                    self._set(obj)
                elif kind == "DELETED" and _named(obj):
                    self._set(None)
        finally:
            response.close()
        return version

    def _set(self, obj: Any) -> None:
        """The CSIDriver object, or None when there is none."""
        if obj is None:
            driver = Driver.missing(f"the CSIDriver {DRIVER} does not exist")
        else:
            driver = Driver.from_object(obj)
        if driver != self._driver:
            log.info("csidriver driver=%s state=%s", DRIVER, driver.problem or "usable")
        self._driver = driver


def _named(obj: Any) -> bool:
    return isinstance(obj, dict) and (obj.get("metadata") or {}).get("name") == DRIVER
