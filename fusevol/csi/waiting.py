"""Waiter: how a publish or an unpublish waits for the reconciler to have done what it asked.

A publish (step 5 of `node`) waits until the volume is set up with its current inputs, or until
an operation of it failed with those inputs while it waited (or failed before and waits for its
retry): that error is FAILED_PRECONDITION. An unpublish waits until the volume is gone from the
actual state, or its unmount failed. Either gives up after its timeout with DEADLINE_EXCEEDED
("still trying": the reconciler goes on). Between two looks it sleeps until an operation of its
volume ends, or the actual or desired state of its volume changes (`Subscribers`: what happens to
the other volumes of a burst never wakes it).

Excludes: what is asked of the reconciler (`node`), the reconciler itself
(`fusevol.volumemanager.reconciler`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from fusevol.csi.attributes import Code, CsiError
from fusevol.volumemanager.cache.actual import MountState

if TYPE_CHECKING:
    from fusevol.model import UniqueVolumeName
    from fusevol.volumemanager.cache.actual import ActualState
    from fusevol.volumemanager.cache.desired import DesiredState
    from fusevol.volumemanager.reconciler.executor import Executor
    from fusevol.volumemanager.reconciler.volumes import Volumes


class Waiter:
    def __init__(
        self,
        *,
        desired: DesiredState,
        actual: ActualState,
        executor: Executor,
        volumes: Volumes,
        timeout_s: float,
    ) -> None:
        self._desired = desired
        self._actual = actual
        self._executor = executor
        self._volumes = volumes
        self._timeout_s = timeout_s

    async def wait_served(self, name: UniqueVolumeName) -> None:
        """Until the reconciler has set the volume up with its current inputs; its error if
        an operation of it failed with them while we waited (or failed before and waits for its
        retry)."""
        status = self._executor.status(name)
        failures, ended = (status.failures, status.ended) if status is not None else (0, 0)
        with trio.move_on_after(self._timeout_s):
            while True:
                volume = self._desired.get(name)
                if volume is not None and not self._executor.is_pending(name):
                    inputs = self._volumes.inputs(volume)
                    mounted = self._actual.get(name)
                    if (
                        mounted is not None
                        and mounted.state is MountState.MOUNTED
                        and mounted.inputs == inputs
                    ):
                        return
                    status = self._executor.status(name)
                    if (
                        status is not None
                        and status.last_error
                        and status.failed_inputs == inputs
                        and (
                            status.ended != ended
                            or status.failures != failures
                            or trio.current_time() < status.retry_at
                        )
                    ):
                        raise CsiError(Code.FAILED_PRECONDITION, status.last_error)
                await self._changed(name)
        raise CsiError(
            Code.DEADLINE_EXCEEDED, f"volume not set up within {self._timeout_s:g}s, still trying"
        )

    async def wait_torn_down(self, name: UniqueVolumeName) -> None:
        """Until the volume is gone from the actual state; its error if its unmount failed."""
        with trio.move_on_after(self._timeout_s):
            while True:
                pending = self._executor.is_pending(name)
                if not pending and self._actual.get(name) is None:
                    return
                status = self._executor.status(name)
                if (
                    not pending
                    and status is not None
                    and status.operation == "unmount"
                    and status.last_error
                ):
                    raise CsiError(Code.FAILED_PRECONDITION, status.last_error)
                await self._changed(name)
        raise CsiError(
            Code.DEADLINE_EXCEEDED,
            f"volume not torn down within {self._timeout_s:g}s, still trying",
        )

    async def _changed(self, name: UniqueVolumeName) -> None:
        """Until an operation of volume `name` ends, its actual state changes (a volume of a
        shared subtree is marked refreshed without an operation of its own) or its desired state
        does (the populator resolved it, with nothing to do for it). Called right after a look,
        with no checkpoint in between: no change is missed."""
        changed = trio.Event()
        sources = (self._executor.subscribers, self._actual.subscribers, self._desired.subscribers)
        for subscribers in sources:
            subscribers.add(name, changed)
        try:
            await changed.wait()
        finally:
            for subscribers in sources:
                subscribers.discard(name, changed)
