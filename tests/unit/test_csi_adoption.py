"""When the trio thread adopts the volumes published in gRPC's threads (`fusevol.csi.server`):
once no Node call is in flight, so that kubelet's calls for a pod's other volumes never wait
for an adoption's GIL, and within `ADOPT_WITHIN_S` while calls keep coming."""

from __future__ import annotations

import threading
import time
from typing import Any

import trio
import trio.testing

from fusevol.csi import server as csi_server
from fusevol.csi.server import CsiServer


class Node:
    """What the server asks of `CsiNode` here: a publish to adopt, made `since`."""

    def __init__(self) -> None:
        self.since: float | None = None
        self.adoptions = 0

    def unadopted_since(self) -> float | None:
        return self.since

    def adopt_published(self) -> None:
        self.adoptions += 1
        self.since = None


def counted_calls(node: Node) -> tuple[Any, Any, Any, threading.Event]:
    """A server's counted Node handlers: one that holds its call until the event is set, one
    that publishes (leaves a volume to adopt), and one that does nothing."""
    server = CsiServer(endpoint="unix:///run/x.sock", node=node, ready=lambda: True)  # type: ignore[arg-type]
    server._token = trio.lowlevel.current_trio_token()
    release = threading.Event()

    def held(request: object, context: object) -> None:
        release.wait(10)

    def publish(request: object, context: object) -> None:
        node.since = time.monotonic()

    def nothing(request: object, context: object) -> None:
        pass

    counted = server._counted
    return counted(held), counted(publish), counted(nothing), release  # type: ignore[arg-type]


async def test_a_prepared_publish_is_adopted_once_no_call_is_in_flight() -> None:
    node = Node()
    held, publish, _, release = counted_calls(node)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, held, None, None)
        await trio.sleep(0.01)  # the held call is in flight
        await trio.to_thread.run_sync(publish, None, None)
        await trio.sleep(0.01)
        assert node.adoptions == 0  # another volume's call is still in flight
        release.set()
    await trio.testing.wait_all_tasks_blocked()
    assert node.adoptions == 1
    await trio.to_thread.run_sync(publish, None, None)  # alone: adopted as it ends
    await trio.testing.wait_all_tasks_blocked()
    assert node.adoptions == 2


async def test_calls_that_keep_coming_delay_an_adoption_by_adopt_within_s_at_most() -> None:
    node = Node()
    held, publish, nothing, release = counted_calls(node)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, held, None, None)
        await trio.sleep(0.01)
        await trio.to_thread.run_sync(publish, None, None)
        await trio.to_thread.run_sync(nothing, None, None)
        await trio.testing.wait_all_tasks_blocked()
        assert node.adoptions == 0
        assert node.since is not None
        node.since -= csi_server.ADOPT_WITHIN_S  # the publish has waited that long
        await trio.to_thread.run_sync(nothing, None, None)  # ends while `held` is in flight
        await trio.testing.wait_all_tasks_blocked()
        assert node.adoptions == 1
        release.set()
