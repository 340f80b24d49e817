"""The agent's lifecycle as a state machine (`fusevol.agent.lifecycle`), without FUSE."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from fusevol.agent.lifecycle import TRANSITIONS, IllegalTransition, Lifecycle, Phase


def _reachable(start: Phase) -> set[Phase]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in TRANSITIONS[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_table_names_every_phase_and_every_phase_is_reachable_and_ends() -> None:
    assert set(TRANSITIONS) == set(Phase)
    assert _reachable(Phase.STARTING) == set(Phase)
    for phase in Phase:
        assert Phase.STOPPED in _reachable(phase), phase  # no phase it cannot stop from
    assert TRANSITIONS[Phase.STOPPED] == frozenset()
    assert TRANSITIONS[Phase.SERVING] == {Phase.HANDING_OVER, Phase.TEARING_DOWN}


@pytest.mark.parametrize(
    "path",
    [
        [Phase.SERVING, Phase.TEARING_DOWN, Phase.STOPPED],
        [Phase.SERVING, Phase.HANDING_OVER, Phase.STOPPED],  # no launcher
        [Phase.SERVING, Phase.HANDING_OVER, Phase.LAME_DUCK, Phase.STOPPED],
        [Phase.SERVING, Phase.HANDING_OVER, Phase.LAME_DUCK, Phase.TRANSFERRING, Phase.STOPPED],
        [Phase.HANDING_OVER, Phase.STOPPED],  # SIGTERM before ready
        [Phase.TEARING_DOWN, Phase.STOPPED],  # a failure before ready
    ],
    ids=lambda path: "-".join(p.value for p in path),
)
def test_the_stops_the_agent_makes_are_allowed_and_logged(
    path: list[Phase], caplog: pytest.LogCaptureFixture
) -> None:
    lifecycle = Lifecycle()
    with caplog.at_level(logging.INFO, logger="fusevol.agent.lifecycle"):
        for phase in path:
            lifecycle.enter(phase, "test")
    assert lifecycle.phase is Phase.STOPPED
    assert lifecycle.stopping
    previous = [Phase.STARTING, *path[:-1]]
    assert [r.getMessage() for r in caplog.records] == [
        f"lifecycle {a.value} -> {b.value}: test" for a, b in zip(previous, path, strict=True)
    ]
    assert lifecycle.mount_handed_on is (Phase.LAME_DUCK in path)


@pytest.mark.parametrize(
    ("path", "illegal"),
    [
        ([], Phase.LAME_DUCK),  # a lame duck is a launched agent that handed over
        ([Phase.SERVING], Phase.STOPPED),  # a stop begins by handing over or tearing down
        ([Phase.SERVING, Phase.TEARING_DOWN], Phase.HANDING_OVER),  # one kind of stop only
        ([Phase.SERVING, Phase.HANDING_OVER], Phase.TEARING_DOWN),
        ([Phase.SERVING, Phase.HANDING_OVER], Phase.TRANSFERRING),  # only a lame duck transfers
        ([Phase.SERVING, Phase.TEARING_DOWN, Phase.STOPPED], Phase.SERVING),  # no way back
        ([Phase.SERVING], Phase.SERVING),
    ],
)
def test_a_transition_the_table_refuses_raises_and_changes_nothing(
    path: list[Phase], illegal: Phase
) -> None:
    lifecycle = Lifecycle()
    for phase in path:
        lifecycle.enter(phase, "test")
    before = lifecycle.phase
    with pytest.raises(IllegalTransition, match=f"{before.value} -> {illegal.value}"):
        lifecycle.enter(illegal, "test")
    assert lifecycle.phase is before


async def test_a_waiter_wakes_when_the_fuse_server_ends_not_before() -> None:
    lifecycle = Lifecycle()
    woke: list[str] = []

    async def wait_fuse() -> None:
        await lifecycle.wait_fuse_stopped()
        woke.append("fuse stopped")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_fuse)
        lifecycle.fuse_started()
        lifecycle.enter(Phase.SERVING, "test")
        await trio.testing.wait_all_tasks_blocked()
        assert woke == []
        assert lifecycle.fuse_up
        lifecycle.fuse_stopped()
    assert woke == ["fuse stopped"]
    assert not lifecycle.fuse_up
