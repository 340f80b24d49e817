"""A handing-over stop and the Node calls it finds: each is interrupted, and answered by the
successor (`fusevol.csi.server`), whether it was in the agent's trio loop when the stop began or
reached it just after.

A call's gRPC handler looks for a stop before it enters the loop; the stop, as it begins, cancels
the calls in the loop. A call between the two was served by an agent whose reconciler had
stopped: a publish waited for a volume that would never be set up, and the lingering server
waited for it (30 s of a rollout, and kubelet's call failed at the end).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import pytest
import trio

from fusevol.csi.server import CsiServer, _Interrupted

if TYPE_CHECKING:
    from pathlib import Path

    from fusevol.csi.node import CsiNode


def server(tmp_path: Path) -> CsiServer:
    return CsiServer(
        endpoint=f"unix://{tmp_path}/csi.sock",
        node=cast("CsiNode", None),  # the calls below never reach it
        ready=lambda: True,
        handing_over=lambda: True,
    )


async def test_a_call_in_the_loop_when_the_stop_begins_is_interrupted(tmp_path: Path) -> None:
    csi = server(tmp_path)
    started = trio.Event()

    async def publish() -> None:
        started.set()
        await trio.sleep_forever()  # a reconciler that stopped

    async def stop_when_started() -> None:
        await started.wait()
        csi._forward_from_now()  # a handing-over stop begins (`CsiServer.run`)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_when_started)
            with pytest.raises(_Interrupted):
                await csi._interruptible(publish)
    assert not csi._in_flight


async def test_a_call_that_reaches_the_loop_after_the_stop_began_is_interrupted_unserved(
    tmp_path: Path,
) -> None:
    csi = server(tmp_path)
    served: list[str] = []

    async def publish() -> None:
        served.append("publish")
        await trio.sleep_forever()

    csi._forward_from_now()  # the stop began after the handler looked, before the call got here
    with trio.fail_after(5), pytest.raises(_Interrupted):
        await csi._interruptible(publish)
    assert served == []
    assert not csi._in_flight
