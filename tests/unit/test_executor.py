"""The operation executor: single flight per volume, exponential backoff, status.

Time is trio's mock clock (`autojump_clock`), so every retry time is asserted exactly.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing

from fusevol.base.errors import (
    AlreadyPending,
    ExecutorStopped,
    InBackoff,
    VolumeSetupError,
    is_expected,
)
from fusevol.model import UniqueVolumeName
from fusevol.volumemanager.reconciler.executor import SERVED_AT_ONCE, Executor

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

NAME = UniqueVolumeName("kubernetes.io/configmap/uid-a-cfg")
OTHER = UniqueVolumeName("kubernetes.io/configmap/uid-b-cfg")
LOGGER = "fusevol.volumemanager.reconciler.executor"


@dataclass
class Operation:
    """An operation that records when it ran and fails with `error` (if set)."""

    error: Exception | None = field(default_factory=lambda: VolumeSetupError("cm not found"))
    times: list[float] = field(default_factory=list)

    async def __call__(self) -> None:
        self.times.append(trio.current_time())
        if self.error is not None:
            raise type(self.error)(*self.error.args)


@dataclass
class Blocking:
    """An operation that runs until released."""

    release: trio.Event = field(default_factory=trio.Event)

    async def __call__(self) -> None:
        await self.release.wait()


@pytest.fixture
def start_executor(nursery: trio.Nursery) -> Callable[..., Awaitable[Executor]]:
    async def start(initial_backoff_s: float = 0.5, max_backoff_s: float = 4.0) -> Executor:
        executor = Executor(initial_backoff_s=initial_backoff_s, max_backoff_s=max_backoff_s)
        await nursery.start(executor.run)
        return executor

    return start


@pytest.fixture
async def executor(start_executor: Callable[..., Awaitable[Executor]]) -> Executor:
    return await start_executor()


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    return caplog


def levels(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The executor's failure log levels so far; consumes them (ERROR is asserted, not leaked)."""
    found = [r.levelname for r in caplog.records if r.name == LOGGER and "failed" in r.message]
    caplog.clear()
    return found


async def run_once(
    executor: Executor,
    operation: Callable[[], Awaitable[None]],
    *,
    name: UniqueVolumeName = NAME,
    kind: str = "mount",
    inputs: object = "v1",
) -> None:
    executor.start(name, kind, operation, inputs=inputs)
    await trio.testing.wait_all_tasks_blocked()


# -- single flight ---------------------------------------------------------------------------------


@pytest.mark.parametrize("second", ["mount", "refresh", "unmount"])
async def test_second_operation_on_a_pending_volume_is_already_pending(
    autojump_clock: trio.testing.MockClock, executor: Executor, second: str
) -> None:
    blocking = Blocking()
    await run_once(executor, blocking)
    with pytest.raises(AlreadyPending, match=NAME):
        executor.start(NAME, second, Operation(), inputs="v2")
    assert executor.is_pending(NAME)
    assert executor.statistics().pending == 1
    assert executor.finished == 0

    blocking.release.set()
    await trio.testing.wait_all_tasks_blocked()
    assert not executor.is_pending(NAME)
    assert executor.finished == 1
    assert executor.statistics().started == 1


async def test_volumes_do_not_wait_for_each_other(
    autojump_clock: trio.testing.MockClock, executor: Executor
) -> None:
    await run_once(executor, Blocking())
    other = Operation(error=None)
    await run_once(executor, other, name=OTHER)
    assert other.times == [0.0]
    assert executor.is_pending(NAME)
    assert not executor.is_pending(OTHER)


@dataclass
class Counting:
    """Operations that run until released, counting how many run at once."""

    release: trio.Event = field(default_factory=trio.Event)
    running: int = 0
    most: int = 0
    done: int = 0

    async def __call__(self) -> None:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self.release.wait()
        finally:
            self.running -= 1
            self.done += 1


def names(n: int, tag: str = "q") -> list[UniqueVolumeName]:
    return [UniqueVolumeName(f"kubernetes.io/configmap/uid-{tag}{i}-cfg") for i in range(n)]


async def test_served_operations_run_at_most_served_at_once_and_the_rest_queue(
    executor: Executor,
) -> None:
    ops = Counting()
    for name in names(SERVED_AT_ONCE + 10):
        executor.start(name, "mount", ops, served=True)
    await trio.testing.wait_all_tasks_blocked()
    assert ops.running == SERVED_AT_ONCE
    assert all(map(executor.is_pending, names(SERVED_AT_ONCE + 10)))  # queued ones too
    assert executor.statistics().pending == SERVED_AT_ONCE + 10
    ops.release.set()  # each one that ends starts the next in the queue
    await trio.testing.wait_all_tasks_blocked()
    assert (ops.done, executor.finished, ops.most) == (
        SERVED_AT_ONCE + 10,
        SERVED_AT_ONCE + 10,
        SERVED_AT_ONCE,
    )
    assert executor.statistics().pending == 0


async def test_a_queued_refresh_runs_before_queued_set_ups(executor: Executor) -> None:
    started: list[UniqueVolumeName] = []
    releases: dict[UniqueVolumeName, trio.Event] = {}

    def operation(name: UniqueVolumeName) -> Callable[[], Awaitable[None]]:
        releases[name] = trio.Event()

        async def run() -> None:
            started.append(name)
            await releases[name].wait()

        return run

    set_ups = names(SERVED_AT_ONCE + 1)
    for name in set_ups:
        executor.start(name, "mount", operation(name), served=True)
    executor.start(NAME, "refresh", operation(NAME), served=True)
    await trio.testing.wait_all_tasks_blocked()
    assert set(started) == set(set_ups[:SERVED_AT_ONCE])
    releases[set_ups[0]].set()  # one slot frees: the refresh takes it, queued after the set-up
    await trio.testing.wait_all_tasks_blocked()
    assert started[SERVED_AT_ONCE:] == [NAME]
    releases[set_ups[1]].set()
    await trio.testing.wait_all_tasks_blocked()
    assert started[SERVED_AT_ONCE:] == [NAME, set_ups[SERVED_AT_ONCE]]
    for release in releases.values():
        release.set()


async def test_other_operations_never_wait_for_served_ones(executor: Executor) -> None:
    """A mount-backed volume's operation may hang (an NFS server gone): it never queues, and
    served ones never wait for it."""
    served, mounts = Counting(), Counting()
    for name in names(SERVED_AT_ONCE + 1):
        executor.start(name, "mount", served, served=True)
    for name in names(SERVED_AT_ONCE + 1, tag="nfs"):
        executor.start(name, "mount", mounts)
    await trio.testing.wait_all_tasks_blocked()
    assert (served.running, mounts.running) == (SERVED_AT_ONCE, SERVED_AT_ONCE + 1)


async def test_a_stop_drops_the_queue() -> None:
    executor = Executor(initial_backoff_s=0.5, max_backoff_s=4.0)
    ops = Counting()
    queued = names(SERVED_AT_ONCE + 1)
    async with trio.open_nursery() as nursery:
        await nursery.start(executor.run)
        for name in queued:
            executor.start(name, "mount", ops, served=True)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert (ops.done, ops.most) == (SERVED_AT_ONCE, SERVED_AT_ONCE)  # cancelled, never started
    assert not any(map(executor.is_pending, queued))


# -- backoff ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("initial_backoff_s", "max_backoff_s", "attempts"),
    [
        pytest.param(
            0.5,
            122.0,
            [0.0, 0.5, 1.5, 3.5, 7.5, 15.5, 31.5, 63.5, 127.5, 249.5, 371.5],
            id="kubelet-0.5s-doubling-to-2m2s",
        ),
        pytest.param(0.5, 3.0, [0.0, 0.5, 1.5, 3.5, 6.5, 9.5], id="capped-at-3s"),
        pytest.param(0.5, 0.25, [0.0, 0.25, 0.5, 0.75], id="cap-below-initial"),
    ],
)
async def test_backoff_doubles_up_to_the_cap(
    autojump_clock: trio.testing.MockClock,
    start_executor: Callable[..., Awaitable[Executor]],
    logs: pytest.LogCaptureFixture,
    initial_backoff_s: float,
    max_backoff_s: float,
    attempts: list[float],
) -> None:
    executor = await start_executor(initial_backoff_s, max_backoff_s)
    operation = Operation()
    for _ in attempts:
        status = executor.status(NAME)
        await trio.sleep_until(status.retry_at if status else 0.0)
        await run_once(executor, operation)

    assert operation.times == attempts
    status = executor.status(NAME)
    assert status is not None
    assert status.failures == len(attempts)
    assert status.retry_at == attempts[-1] + min(
        initial_backoff_s * 2 ** (len(attempts) - 1), max_backoff_s
    )
    # The first failure is an ERROR; the same error again is only DEBUG.
    assert levels(logs) == ["ERROR"] + ["DEBUG"] * (len(attempts) - 1)


@pytest.mark.parametrize(
    ("retry_time", "refused"),
    [
        pytest.param(0.0, True, id="at-once"),
        pytest.param(0.49, True, id="just-before-retry-at"),
        pytest.param(0.5, False, id="at-retry-at"),
        pytest.param(10.0, False, id="long-after"),
    ],
)
async def test_in_backoff_until_retry_at(
    autojump_clock: trio.testing.MockClock,
    executor: Executor,
    logs: pytest.LogCaptureFixture,
    retry_time: float,
    refused: bool,
) -> None:
    operation = Operation()
    await run_once(executor, operation)
    assert levels(logs) == ["ERROR"]
    await trio.sleep_until(retry_time)

    if refused:
        with pytest.raises(InBackoff, match=NAME):
            executor.start(NAME, "mount", operation, inputs="v1")
        assert executor.statistics().in_backoff == 1
    else:
        await run_once(executor, operation)
    expected = [0.0] if refused else [0.0, retry_time]
    assert operation.times == expected
    assert levels(logs) == ["DEBUG"] * (len(expected) - 1)  # the same error again


@pytest.mark.parametrize(
    ("kind", "inputs"),
    [
        pytest.param("mount", "v2", id="changed-inputs"),
        pytest.param("mount", None, id="inputs-gone"),
        pytest.param("unmount", "v1", id="another-operation"),
    ],
)
async def test_change_bypasses_backoff(
    autojump_clock: trio.testing.MockClock,
    executor: Executor,
    logs: pytest.LogCaptureFixture,
    kind: str,
    inputs: object,
) -> None:
    first, second = Operation(), Operation(error=None)
    await run_once(executor, first, inputs="v1")
    await trio.sleep(0.25)
    await run_once(executor, second, kind=kind, inputs=inputs)
    assert second.times == [0.25]
    assert levels(logs) == ["ERROR"]


async def test_failure_with_new_inputs_restarts_the_backoff(
    autojump_clock: trio.testing.MockClock, executor: Executor, logs: pytest.LogCaptureFixture
) -> None:
    operation = Operation()
    for _ in range(3):  # failures at 0, 0.5, 1.5: the next wait would be 2 s
        status = executor.status(NAME)
        await trio.sleep_until(status.retry_at if status else 0.0)
        await run_once(executor, operation, inputs="v1")

    await run_once(executor, operation, inputs="v2")

    status = executor.status(NAME)
    assert status is not None
    assert (status.failures, status.retry_at) == (1, 1.5 + 0.5)
    assert levels(logs) == ["ERROR", "DEBUG", "DEBUG", "DEBUG"]


async def test_success_resets_the_failures(
    autojump_clock: trio.testing.MockClock, executor: Executor, logs: pytest.LogCaptureFixture
) -> None:
    operation = Operation()
    await run_once(executor, operation)
    await trio.sleep_until(0.5)
    await run_once(executor, operation)
    await trio.sleep_until(1.5)
    operation.error = None
    await run_once(executor, operation)
    assert "operation succeeded after 2 failures" in logs.messages[-1]

    assert executor.status(NAME) is None  # nothing to show, no backoff: kept by no volume
    assert executor.next_retry_at() == math.inf

    operation.error = VolumeSetupError("again")
    await run_once(executor, operation)
    status = executor.status(NAME)
    assert status is not None
    assert (status.failures, status.retry_at) == (1, 1.5 + 0.5)
    assert levels(logs) == ["ERROR", "DEBUG", "ERROR"]


# -- status ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "last_error", "traceback"),
    [
        pytest.param(
            VolumeSetupError("cm ns/cm not found"), "cm ns/cm not found", False, id="ours"
        ),
        pytest.param(RuntimeError("bad"), "bad", True, id="unexpected-with-traceback"),
        pytest.param(RuntimeError(), "RuntimeError", True, id="no-message-names-the-type"),
    ],
)
async def test_status_after_a_failure(
    autojump_clock: trio.testing.MockClock,
    executor: Executor,
    logs: pytest.LogCaptureFixture,
    error: Exception,
    last_error: str,
    traceback: bool,
) -> None:
    await run_once(executor, Operation(error=error), kind="refresh")

    status = executor.status(NAME)
    assert status is not None
    assert (status.operation, status.pending, status.failures) == ("refresh", False, 1)
    assert (status.last_error, status.retry_at) == (last_error, 0.5)
    assert executor.statistics().failed == 1
    assert executor.finished == 1
    [record] = [r for r in logs.records if r.name == LOGGER]
    assert (record.levelname, record.exc_info is not None) == ("ERROR", traceback)
    assert f"volume={NAME}" in record.getMessage()
    logs.clear()


async def test_status_while_pending(
    autojump_clock: trio.testing.MockClock, executor: Executor
) -> None:
    assert executor.status(NAME) is None
    await run_once(executor, Blocking(), kind="unmount")
    status = executor.status(NAME)
    assert status is not None
    assert (status.operation, status.pending, status.failures) == ("unmount", True, 0)


async def test_finished_counts_success_and_failure(
    autojump_clock: trio.testing.MockClock,
    executor: Executor,
    logs: pytest.LogCaptureFixture,
) -> None:
    await run_once(executor, Operation(error=None))
    assert executor.finished == 1
    await run_once(executor, Operation(), name=OTHER)
    assert executor.finished == 2
    with trio.move_on_after(1) as waited:
        await executor.wait_finished(1)  # already past: returns at once
    assert not waited.cancelled_caught
    with trio.move_on_after(1) as waited:
        await executor.wait_finished(2)  # no operation ends any more
    assert waited.cancelled_caught
    assert levels(logs) == ["ERROR"]


async def test_next_retry_at(
    autojump_clock: trio.testing.MockClock, executor: Executor, logs: pytest.LogCaptureFixture
) -> None:
    assert executor.next_retry_at() == math.inf
    await run_once(executor, Operation())
    await trio.sleep_until(0.25)
    await run_once(executor, Operation(), name=OTHER)
    assert executor.next_retry_at() == 0.5
    await trio.sleep_until(0.5)
    assert executor.next_retry_at() == 0.75
    await trio.sleep_until(0.75)
    assert executor.next_retry_at() == math.inf
    assert levels(logs) == ["ERROR", "ERROR"]


async def test_next_retry_at_ignores_pending_volumes(
    autojump_clock: trio.testing.MockClock, executor: Executor, logs: pytest.LogCaptureFixture
) -> None:
    await run_once(executor, Operation(), inputs="v1")
    assert executor.next_retry_at() == 0.5
    await run_once(executor, Blocking(), inputs="v2")  # new inputs: runs despite the backoff
    assert executor.next_retry_at() == math.inf
    assert levels(logs) == ["ERROR"]


async def test_forget(autojump_clock: trio.testing.MockClock, executor: Executor) -> None:
    blocking = Blocking()
    await run_once(executor, blocking)
    executor.forget(NAME)
    assert executor.is_pending(NAME)
    blocking.release.set()
    await trio.testing.wait_all_tasks_blocked()
    executor.forget(NAME)
    assert executor.status(NAME) is None
    executor.forget(NAME)  # unknown: no-op
    assert executor.status(NAME) is None


async def test_a_stopped_executor_refuses_new_operations_as_expected() -> None:
    """A stop cancels the executor while a reconcile pass may still run (the agent stopped during
    its start-up): the pass's operations are refused with an expected error, not a crash."""
    executor = Executor(initial_backoff_s=0.5, max_backoff_s=4.0)
    with pytest.raises(ExecutorStopped):
        executor.start(NAME, "mount", Operation())  # not running yet
    async with trio.open_nursery() as nursery:
        await nursery.start(executor.run)
        nursery.cancel_scope.cancel()
    with pytest.raises(ExecutorStopped, match="stopped") as refused:
        executor.start(NAME, "mount", Operation())
    assert is_expected(refused.value)
