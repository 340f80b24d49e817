"""`fusevol.mount.batch.Batches`: calls asked meanwhile share one hop, each gets its own outcome."""

from __future__ import annotations

from typing import TYPE_CHECKING

import outcome
import pytest
import trio
import trio.testing

from fusevol.mount.batch import Batches, in_thread

if TYPE_CHECKING:
    from collections.abc import Sequence


def test_calls_asked_together_share_a_hop_and_get_their_own_results() -> None:
    async def main() -> None:
        batches = Batches(in_thread)
        results: dict[int, object] = {}

        async def ask(i: int) -> None:
            results[i] = await batches.call(lambda: i * i)

        async with trio.open_nursery() as nursery:
            for i in range(50):
                nursery.start_soon(ask, i)
        assert results == {i: i * i for i in range(50)}
        assert batches.batches <= 2  # not one hop per call

    trio.run(main)


def test_each_call_gets_its_own_exception_and_a_failed_runner_fails_its_batch() -> None:
    async def main() -> None:
        def fail() -> object:
            raise FileNotFoundError(2, "gone")

        batches = Batches(in_thread)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(batches.call, lambda: 1)
            with pytest.raises(FileNotFoundError):
                await batches.call(fail)

        async def broken(requests: Sequence[object]) -> list[outcome.Outcome[object]]:
            raise OSError(5, "helper died")

        with pytest.raises(OSError, match="helper died"):
            await Batches[object](broken).call("anything")

    trio.run(main)


def test_a_cancelled_call_is_dropped_if_queued_and_answered_if_started() -> None:
    async def main() -> None:
        release = trio.Event()
        ran: list[list[str]] = []

        async def slow(requests: Sequence[str]) -> list[outcome.Outcome[object]]:
            ran.append(list(requests))
            await release.wait()
            return [outcome.Value(r) for r in requests]

        batches: Batches[str] = Batches(slow)
        got: list[object] = []
        scopes = {name: trio.CancelScope() for name in "abcd"}

        async def ask(request: str) -> None:
            with scopes[request]:
                got.append(await batches.call(request))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "a")
            nursery.start_soon(ask, "b")  # the same round: the same batch, which "a" leads
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(ask, "c")
            nursery.start_soon(ask, "d")
            await trio.testing.wait_all_tasks_blocked()  # "c" and "d" wait for the next batch
            scopes["b"].cancel()  # started: it still gets its answer
            scopes["c"].cancel()  # queued: dropped
            release.set()
        assert [sorted(batch) for batch in ran] == [["a", "b"], ["d"]]  # trio picks who is first
        assert sorted(got) == ["a", "b", "d"]  # type: ignore[type-var]

    trio.run(main)
