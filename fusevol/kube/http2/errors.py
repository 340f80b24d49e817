"""How a request over HTTP/2 fails, drawn:

    FusevolError
     └── ConnectionLost   nothing, or not all, came back (refused, reset, timed out, GOAWAY):
          │               retryable
          └── Unreachable no connection could be made, and none is open: nothing was sent

Excludes: the HTTP status of an answer that came (`fusevol.kube.transport` reads it).
"""

from __future__ import annotations

from fusevol.base.errors import FusevolError


class ConnectionLost(FusevolError):
    """The request could not be sent, or its answer was cut (refused, reset, timed out, GOAWAY)."""

    def __init__(self, message: str, *, said: bool = False) -> None:
        super().__init__(message)
        self.said = said
        """The loss of the whole connection, under every stream it carried, was logged once
        (its streams need not each say it again)."""


class Unreachable(ConnectionLost):
    """No connection to the server could be made, and none is open: nothing was sent."""
