"""Whatever one volume's input makes its set-up or refresh raise (a RecursionError, a MemoryError, a
ValueError: not only fusevol's own errors), that volume alone fails, with backoff and one error
line, and the reconciler goes on with every other volume. Over the real reconciler and executor
of tests/unit/test_reconciler.py, with its fake volumes."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing

from fusevol.model import ResourceVersion
from tests.unit.test_reconciler import (
    A_CFG,
    B_CFG,
    BACKOFF_TIMES,
    CM,
    POD_A,
    POD_B,
    Call,
    World,
    error_lines,
    wait_until,
)

if TYPE_CHECKING:
    from collections.abc import Hashable
    from pathlib import Path

    from fusevol.volumemanager.cache.desired import VolumeToServe

UNEXPECTED = [
    pytest.param(RecursionError("maximum recursion depth exceeded"), id="RecursionError"),
    pytest.param(MemoryError(), id="MemoryError"),
    pytest.param(ValueError("bad"), id="ValueError"),
]


@pytest.fixture
def world(nursery: trio.Nursery, tmp_path: Path) -> World:
    return World(tmp_path, nursery)


@pytest.mark.parametrize("error", UNEXPECTED)
async def test_an_unexpected_set_up_error_fails_that_volume_alone(
    autojump_clock: trio.testing.MockClock,
    world: World,
    caplog: pytest.LogCaptureFixture,
    error: Exception,
) -> None:
    world.volumes.failing.add(A_CFG)
    world.volumes.failure = lambda message: error
    world.add(CM, POD_A, POD_B)
    await world.start()
    await wait_until(lambda: B_CFG in world.actual and len(world.volumes.calls_of(A_CFG)) == 5)

    assert world.volumes.calls_of(A_CFG) == [Call("set_up", A_CFG, t) for t in BACKOFF_TIMES]
    assert A_CFG not in world.actual
    [line] = error_lines(caplog)  # the first, with its traceback; the retries are DEBUG
    assert f"mount failed volume={A_CFG}" in line
    status = world.executor.status(A_CFG)
    assert status is not None
    assert status.last_error == (str(error) or type(error).__name__)


@pytest.mark.parametrize("error", UNEXPECTED)
async def test_an_unexpected_refresh_error_keeps_the_volume_and_the_others_refresh(
    autojump_clock: trio.testing.MockClock,
    world: World,
    caplog: pytest.LogCaptureFixture,
    error: Exception,
) -> None:
    world.add(CM, POD_A, POD_B)
    await world.start()
    await wait_until(lambda: A_CFG in world.actual and B_CFG in world.actual)
    world.volumes.failing.add(A_CFG)
    world.volumes.failure = lambda message: error

    world.store.upsert(dataclasses.replace(CM, resource_version=ResourceVersion("2")))
    await wait_until(
        lambda: [c.operation for c in world.volumes.calls_of(B_CFG)][-1:] == ["refresh"]
    )
    await trio.sleep(10)

    assert A_CFG in world.actual  # still mounted, with its last good content
    assert [c.operation for c in world.volumes.calls_of(A_CFG)][1:3] == ["refresh", "refresh"]
    [line] = error_lines(caplog)
    assert f"refresh failed volume={A_CFG}" in line


async def test_inputs_that_cannot_be_computed_fail_that_volumes_operation(
    autojump_clock: trio.testing.MockClock, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """The pass asks each volume for its inputs before it starts an operation: an error there
    is that volume's operation's error (backoff, one line), never the pass's."""
    inputs = world.volumes.inputs

    def broken_for_a(volume: VolumeToServe) -> Hashable:
        if volume.name == A_CFG:
            raise RecursionError("maximum recursion depth exceeded")
        return inputs(volume)

    world.volumes.inputs = broken_for_a  # type: ignore[method-assign]
    world.add(CM, POD_A, POD_B)
    await world.start()
    await wait_until(lambda: B_CFG in world.actual)
    await trio.sleep(8)

    assert A_CFG not in world.actual
    assert world.volumes.calls_of(A_CFG) == []  # its operations raised before any set-up
    status = world.executor.status(A_CFG)
    assert status is not None
    assert status.failures == 5  # at 0, 0.5, 1.5, 3.5, 7.5: the backoff of any failure
    assert status.last_error == "maximum recursion depth exceeded"
    [line] = error_lines(caplog)
    assert f"mount failed volume={A_CFG}" in line
