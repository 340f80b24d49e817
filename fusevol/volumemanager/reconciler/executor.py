"""Operation executor: at most one operation per volume, exponential backoff after a failure.

kubelet's nestedpendingoperations (docs/kubelet.md fact 9): a volume with an operation in flight
refuses a second one (`AlreadyPending`); a failed volume refuses new operations until its retry time
(`InBackoff`), the wait starting at 0.5 s and doubling up to 2m2s. Both refusals are expected
(`errors.is_expected`): the reconciler asks again on its next pass.

One difference from kubelet, on purpose: the backoff belongs to the inputs that failed. When the
inputs change (the missing ConfigMap appears, the pod is edited), the next attempt starts at once
instead of waiting out a backoff earned by different data.

Operations run as tasks of the executor's own nursery, so a hung one (a mount helper that never
returns) blocks only its own volume. Those of volumes served from memory (`served`) run at most
`SERVED_AT_ONCE` at a time, the others queued as a tuple each, not a task: they never wait on a
server or a disk of someone else's (only on the object store, the agent's own FUSE mount and
mount(2) of its subtrees), so a bound cannot leave them stuck behind a hung one; and 2000 pods
starting together were 2000 tasks alive at once, a few KiB each, whose garbage left the heap
fragmented long after they were gone (`bench/burst.py`). A refresh goes to the head of the
queue: an edit reaches running pods before the pods still starting are set up.
"""

from __future__ import annotations

import collections
import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from fusevol.base.errors import (
    AlreadyPending,
    ExecutorStopped,
    FusevolError,
    InBackoff,
    is_expected,
)
from fusevol.volumemanager.cache.changes import Subscribers

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Hashable

    from fusevol.model import UniqueVolumeName

    _Queued = tuple[
        UniqueVolumeName, "VolumeOperationStatus", Callable[[], Awaitable[None]], Hashable
    ]
    """A served volume's operation waiting for its turn: `Executor._run`'s arguments."""

log = logging.getLogger(__name__)

_NO_WAIT = -math.inf
"""`retry_at` of a volume with no failure to wait out: one float for all of them."""


@dataclass(slots=True)
class VolumeOperationStatus:
    """What `fusevol status` shows about a volume's operations: kept while one is pending and
    after a failure, dropped when one succeeds (nothing to show, no backoff to keep: a node's
    thousands of volumes at rest keep none, 130 bytes each)."""

    operation: str = ""
    """The last operation started: mount, refresh or unmount."""
    pending: bool = False
    ended: int = 0
    """How many of the volume's operations have ended, successfully or not."""
    failures: int = 0
    last_error: str = ""
    retry_at: float = _NO_WAIT
    """trio clock time before which no new operation starts."""
    failed_inputs: Hashable = field(default=None, repr=False)
    subject: str = field(default="", repr=False)
    """What the operation is for, in its error lines: `pod=ns/name file=...` (`Executor.start`)."""


SERVED_AT_ONCE = 64
"""Operations of served volumes running at once (module docstring); beyond this many, they queue."""


@dataclass(frozen=True, slots=True)
class ExecutorStatistics:
    pending: int
    in_backoff: int
    started: int
    failed: int


class Executor:
    def __init__(
        self,
        *,
        initial_backoff_s: float,
        max_backoff_s: float,
        on_finished: Callable[[UniqueVolumeName, str, float, bool], None] = lambda *_: None,
    ) -> None:
        """`on_finished(name, operation, seconds, ok)` after every operation, for metrics; the
        reconciler waits for operations to end with `wait_finished`."""
        self._on_finished = on_finished
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max_backoff_s
        self._finished = 0
        self._finished_event = trio.Event()
        self.subscribers = Subscribers()
        """Events set when an operation of the volume they were added under ends."""
        self._status: dict[UniqueVolumeName, VolumeOperationStatus] = {}
        self._nursery: trio.Nursery | None = None
        self._started = 0
        self._failed = 0
        self._served_running = 0
        self._served_queue: collections.deque[_Queued] = collections.deque()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the operations until cancelled (which cancels those in flight)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                task_status.started()
                await trio.sleep_forever()
            finally:  # cancelled (a stop): the nursery takes no new operation from here on
                self._nursery = None
                for _, status, *_ in self._served_queue:
                    status.pending = False
                self._served_queue.clear()

    def start(
        self,
        name: UniqueVolumeName,
        operation: str,
        run: Callable[[], Awaitable[None]],
        *,
        inputs: Hashable = None,
        subject: str = "",
        served: bool = False,
    ) -> None:
        """Start `run` for volume `name`, or raise AlreadyPending / InBackoff / ExecutorStopped.

        `subject` ends the failure's log line: the pod and where it came from. `served`: the
        operation is a served volume's, and may queue (module docstring); it is pending from now
        on all the same."""
        if self._nursery is None:  # a reconcile pass that ran on during a stop
            raise ExecutorStopped(f"not starting {operation} of {name}: the executor is stopped")
        status = self._status.setdefault(name, VolumeOperationStatus())
        if status.pending:
            raise AlreadyPending(f"an operation on {name} is in progress")
        now = trio.current_time()
        if (
            now < status.retry_at
            and status.failed_inputs == inputs
            and status.operation == operation
        ):
            raise InBackoff(f"no retries permitted for {name} until {status.retry_at - now:.1f}s")
        status.pending = True
        status.operation = operation
        status.subject = subject
        self._started += 1
        if not served:
            self._nursery.start_soon(self._run, name, status, run, inputs, False)
        elif self._served_running < SERVED_AT_ONCE:
            self._served_running += 1
            self._nursery.start_soon(self._run, name, status, run, inputs, True)
        elif operation == "refresh":  # running pods' update first, before new pods' set-up
            self._served_queue.appendleft((name, status, run, inputs))
        else:
            self._served_queue.append((name, status, run, inputs))

    def status(self, name: UniqueVolumeName) -> VolumeOperationStatus | None:
        return self._status.get(name)

    @property
    def finished(self) -> int:
        """How many operations have ended, successfully or not."""
        return self._finished

    async def wait_finished(self, since: int) -> None:
        """Return once more than `since` operations have ended (at once if they already have)."""
        while self._finished <= since:
            await self._finished_event.wait()

    def is_pending(self, name: UniqueVolumeName) -> bool:
        status = self._status.get(name)
        return status is not None and status.pending

    def forget(self, name: UniqueVolumeName) -> None:
        """Drop a volume's history once it is gone (no-op while an operation is pending)."""
        if not self.is_pending(name):
            self._status.pop(name, None)

    def succeeded(self, name: UniqueVolumeName, operation: str, seconds: float) -> None:
        """An operation made outside the executor succeeded (a CSI publish answered in gRPC's
        thread: `fusevol.csi.preparing`): counted as one of its own, and the volume's failures
        before it dropped, as a success drops them. No-op while one of its own is pending."""
        status = self._status.get(name)
        if status is not None and status.pending:
            return
        if status is not None:
            del self._status[name]
            if status.failures:
                log.info("operation succeeded after %d failures volume=%s", status.failures, name)
        self._on_finished(name, operation, seconds, True)

    def next_retry_at(self) -> float:
        """The earliest retry time still in the future, or +inf."""
        now = trio.current_time()
        times = [s.retry_at for s in self._status.values() if s.retry_at > now and not s.pending]
        return min(times, default=math.inf)

    def statistics(self) -> ExecutorStatistics:
        now = trio.current_time()
        return ExecutorStatistics(
            pending=sum(s.pending for s in self._status.values()),
            in_backoff=sum(s.retry_at > now for s in self._status.values()),
            started=self._started,
            failed=self._failed,
        )

    async def _run(
        self,
        name: UniqueVolumeName,
        status: VolumeOperationStatus,
        run: Callable[[], Awaitable[None]],
        inputs: Hashable,
        served: bool,
    ) -> None:
        started = trio.current_time()
        try:
            await run()
        except Exception as exc:
            self._failed += 1
            self._record_failure(name, status, exc, inputs)
            self._on_finished(name, status.operation, trio.current_time() - started, False)
        else:
            self._on_finished(name, status.operation, trio.current_time() - started, True)
            if status.failures:
                log.info("operation succeeded after %d failures volume=%s", status.failures, name)
            if self._status.get(name) is status:
                del self._status[name]
        finally:
            status.pending = False
            status.ended += 1
            self._finished += 1
            self._finished_event.set()
            self._finished_event = trio.Event()
            self.subscribers.notify((name,))
            if served:
                self._served_running -= 1
                stopping = trio.current_effective_deadline() == -math.inf  # cancelled
                if self._served_queue and self._nursery is not None and not stopping:
                    self._served_running += 1
                    self._nursery.start_soon(self._run, *self._served_queue.popleft(), True)

    def _record_failure(
        self,
        name: UniqueVolumeName,
        status: VolumeOperationStatus,
        exc: Exception,
        inputs: Hashable,
    ) -> None:
        if status.failed_inputs != inputs:
            status.failures = 0
        delay = min(self._initial_backoff_s * 2**status.failures, self._max_backoff_s)
        message = str(exc) or type(exc).__name__
        repeated = message == status.last_error
        status.failures += 1
        status.last_error = message
        status.retry_at = trio.current_time() + delay
        status.failed_inputs = inputs
        level = logging.DEBUG if repeated or is_expected(exc) else logging.ERROR
        # An unexpected error's traceback once, with its error line; its retries (every 2 min at
        # most, for as long as the volume exists) are one line each.
        unexpected = level == logging.ERROR and not isinstance(exc, FusevolError)
        log.log(
            level,
            "%s failed volume=%s%s retry_in=%gs error=%s",
            status.operation,
            name,
            f" {status.subject}" if status.subject else "",
            delay,
            message,
            exc_info=exc if unexpected else None,
        )
