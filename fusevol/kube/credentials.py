"""The `Authorization` header of each request: the configuration's bearer token, asked for again
every CREDENTIALS_S (its refresh hook rereads the in-cluster token, or runs an exec plugin once
the token expired), or a value given (`KubeClient.with_authorization`: a pod's service account's
token).

Excludes: a client certificate, which is no header but a TLS identity (`tls`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from collections.abc import Callable

CREDENTIALS_S = 10.0
"""How long an authorization header is used before the configuration is asked again (its
refresh hook rereads the in-cluster token, or runs an exec plugin once the token expired)."""


class Credentials:
    async def authorization(self) -> str:
        """The `Authorization` header's value ("" for none)."""
        raise NotImplementedError


class CallableCredentials(Credentials):
    def __init__(self, value: Callable[[], str]) -> None:
        self._value = value

    async def authorization(self) -> str:
        return self._value()


class ConfiguredCredentials(Credentials):
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
