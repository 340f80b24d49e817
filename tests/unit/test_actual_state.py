"""`fusevol.volumemanager.cache.actual.ActualState`: which pods still have volumes set up, as
volumes come and go (a pod's tear-down asks after each of its volumes)."""

from __future__ import annotations

import trio
import trio.testing

from fusevol.model import PodUID, UniqueVolumeName
from fusevol.node.layout import Plugin
from fusevol.volumemanager.cache.actual import ActualState, MountedVolume


def volume(name: str, pod: str) -> MountedVolume:
    return MountedVolume(
        name=UniqueVolumeName(name),
        plugin=Plugin.CONFIG_MAP,
        pod_uid=PodUID(pod),
        spec_name=name,
        path=f"/pods/{pod}/{name}",
        inputs=(),
    )


def test_a_pod_has_volumes_until_its_last_is_unmounted() -> None:
    actual = ActualState()
    actual.mark_mounted(volume("a/config", "a"))
    actual.mark_mounted(volume("a/creds", "a"))
    actual.mark_mounted(volume("b/config", "b"))
    actual.mark_mounted(volume("a/config", "a"))  # a refresh: the same volume again

    actual.mark_unmounted(UniqueVolumeName("a/config"))
    assert actual.pod_has_volumes(PodUID("a"))
    actual.mark_unmounted(UniqueVolumeName("a/creds"))
    actual.mark_unmounted(UniqueVolumeName("a/creds"))  # no-op: not mounted
    assert not actual.pod_has_volumes(PodUID("a"))
    assert actual.pod_has_volumes(PodUID("b"))
    assert [v.name for v in actual.mounted_volumes()] == ["b/config"]


def test_a_volume_marked_again_for_another_pod_leaves_the_first() -> None:
    actual = ActualState()
    actual.mark_mounted(volume("shared", "a"))
    actual.mark_mounted(volume("shared", "b"))
    assert not actual.pod_has_volumes(PodUID("a"))
    assert actual.pod_has_volumes(PodUID("b"))
    actual.mark_unmounted(UniqueVolumeName("shared"))
    assert not actual.pod_has_volumes(PodUID("b"))


async def test_every_change_wakes_a_waiter_and_a_no_op_does_not() -> None:
    actual = ActualState()
    woke: list[int] = []

    async def waiter() -> None:
        while True:
            await actual.wait_changed(actual.generation)
            woke.append(actual.generation)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        actual.mark_mounted(volume("a/config", "a"))
        await trio.testing.wait_all_tasks_blocked()
        actual.mark_unmounted(UniqueVolumeName("b/none"))  # not mounted: no change
        await trio.testing.wait_all_tasks_blocked()
        actual.mark_mounted(volume("a/config", "a"))  # a refresh is a change
        await trio.testing.wait_all_tasks_blocked()
        actual.mark_unmounted(UniqueVolumeName("a/config"))
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert woke == [1, 2, 3]
    await actual.wait_changed(0)  # changed since: at once
