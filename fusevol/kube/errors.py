"""How a call to the API server fails, drawn:

    FusevolError
     ├── ApiError            the server answered with an error Status: 404, 410, 403, ...
     └── ApiUnavailable      no usable answer: refused, reset, timed out, cut mid-stream
          └── ApiUnreachable no connection at all: nothing was sent

Nothing is retried where they are raised; the reflector backs off itself, or waits for the
server's return (`KubeClient.wait_reachable`). `api_error` reads an error answer's Status.

Excludes: how HTTP/2 fails (`http2`; `transport` turns its failures into these).
"""

from __future__ import annotations

import json

from fusevol.base.errors import FusevolError


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


def api_error(status: int, text: bytes) -> ApiError:
    """The error of an answer with `status`: its Status's reason and message, else its start."""
    reason, message = "", ""
    try:
        body = json.loads(text or b"{}")
        reason, message = str(body.get("reason", "")), str(body.get("message", ""))
    except (ValueError, AttributeError):
        message = text[:200].decode(errors="replace")
    return ApiError(status, reason, message)
