"""fusevol's exceptions, and the one place that decides which failures are expected.

    FusevolError
     ├── InvalidInput            user data fusevol refuses (names the object and field)
     │    ├── ManifestError      a manifest file that cannot be read or parsed
     │    └── InvalidPayload     a path or key kubelet's AtomicWriter would reject
     ├── VolumeSetupError       a volume cannot be set up now (missing object, missing key, ...)
     ├── MountError             mount(8)/umount(8) failed; carries the (masked) argv and output
     └── OperationNotStarted    the executor did not start an operation (expected, see below)
          ├── AlreadyPending    an operation on that volume is in flight
          ├── InBackoff         that volume failed recently and waits for its next retry
          └── ExecutorStopped   the agent is stopping: no new operation starts

`is_expected(exc)` separates what is logged at DEBUG (the reconciler will simply come back) from
what deserves an ERROR line. Call sites never repeat that condition.
"""

from __future__ import annotations


class FusevolError(Exception):
    """Base of every error fusevol raises on purpose."""


class InvalidInput(FusevolError):
    """User data fusevol refuses. The message names the object and the field."""


class ManifestError(InvalidInput):
    """A manifest file that cannot be read, parsed or understood."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field
        """For a field's error: the field and what is wrong with it, without file and object."""


class InvalidPayload(InvalidInput):
    """A payload path or key that kubelet's AtomicWriter would reject."""


class VolumeSetupError(FusevolError):
    """A volume cannot be set up now; the reconciler retries with backoff."""


class MountError(FusevolError):
    """A mount or unmount command failed."""


class OperationNotStarted(FusevolError):
    """The executor declined to start an operation; the next reconcile will ask again."""


class AlreadyPending(OperationNotStarted):
    """An operation on the same volume is still running."""


class InBackoff(OperationNotStarted):
    """The volume's last operation failed and its retry time has not come yet."""


class ExecutorStopped(OperationNotStarted):
    """The executor is not running (the agent is stopping, or not started yet)."""


def is_expected(exc: BaseException) -> bool:
    """True for failures that are part of normal operation and need no ERROR log line."""
    return isinstance(exc, OperationNotStarted)
