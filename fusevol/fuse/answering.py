"""No request ends a FUSE server: every failure of a handler is an answer.

pyfuse3 ends `main()`, and with it the mount, when a handler raises anything but `FUSEError`;
for the agent's mount that is every pod's volumes on the node. `answering_errors` makes a handler
answer an OSError with its errno and anything else (a bug, or input nothing bounded) with EIO,
and `Failures` counts the latter and logs them, one line at most a minute per handler and kind.
"""

from __future__ import annotations

import collections
import errno
import functools
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

import pyfuse3

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger(__name__)

LOG_INTERVAL_S = 60.0
"""A handler's failures of one kind are logged once in this long; all are counted."""


class Failures:
    """Requests answered EIO for an unexpected exception, by handler name."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self._logged: dict[tuple[str, str], float] = {}

    def record(self, handler: str, exc: Exception) -> None:
        """Count a request that raised `exc`; log it unless one like it was logged lately."""
        self.counts[handler] += 1
        what = (handler, type(exc).__name__)
        now = time.monotonic()
        if now - self._logged.get(what, -LOG_INTERVAL_S) >= LOG_INTERVAL_S:
            self._logged[what] = now
            log.error(
                "FUSE %s request failed, answered EIO (%d so far): %s: %.200s",
                handler,
                self.counts[handler],
                type(exc).__name__,
                exc,
            )


class _HasFailures(Protocol):
    failures: Failures


def answering_errors(handler: Callable[..., Any]) -> Callable[..., Any]:
    """Make the async `handler` (a method of an object with `failures`) answer every failure."""
    name = handler.__name__

    @functools.wraps(handler)
    async def answering(self: _HasFailures, *args: Any) -> Any:
        try:
            return await handler(self, *args)
        except pyfuse3.FUSEError:
            raise
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
        except Exception as exc:
            self.failures.record(name, exc)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return answering
