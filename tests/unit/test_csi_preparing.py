"""The preparer's ordering with the publish path (`fusevol.csi.preparing`), with volumes whose
preparation waits until the test lets it end: a publish that comes while its volume is being
prepared waits for that, then releases it, and the volume is prepared no more until the publish
path is done with it. (The set-up and a preparation take the same place among a subtree's users:
the one's release would take it from the other, and a bound subtree would go.)"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import trio
import trio.testing

from fusevol.csi.attributes import volume_handle
from fusevol.csi.preparing import Preparer
from fusevol.model import (
    ConfigMap,
    CSIVolumeSource,
    Pod,
    PodUID,
    ResourceVersion,
    Volume,
    VolumeName,
)
from fusevol.volumemanager.cache.desired import CsiVolume, VolumeToServe
from fusevol.volumemanager.cache.store import ObjectStore

if TYPE_CHECKING:
    from pathlib import Path

UID = PodUID("dddddddd-0000-4000-8000-000000000001")


class Volumes:
    """What the preparer asks of the volumes, recorded; `prepare` waits for `go`."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.go = trio.Event()

    async def prepare(self, volume: VolumeToServe) -> object:
        self.calls.append("prepare")
        await self.go.wait()
        self.calls.append("prepared")
        return object()

    async def unprepare(self, volume: VolumeToServe) -> None:
        self.calls.append("unprepare")


def resolve(csi: CsiVolume) -> VolumeToServe:
    return VolumeToServe(csi.name, None, csi.pod, csi.volume, target=csi.target)


async def test_a_publish_waits_for_a_preparation_under_way_then_nothing_is_prepared(
    tmp_path: Path,
) -> None:
    store = ObjectStore()
    store.upsert(ConfigMap("default", "app", ResourceVersion("1"), data={"a": b"1"}))
    source = CSIVolumeSource("fusevol.io", (("configMap", "app"),))
    web = Pod(
        UID, "default", "web", ResourceVersion("1"), volumes=(Volume(VolumeName("config"), source),)
    )
    store.upsert(web)
    volumes = Volumes()
    published: set[str] = set()
    preparer = Preparer(
        store=store,
        volumes=volumes,  # type: ignore[arg-type]
        kubelet_dir=tmp_path,
        track=_track_nothing,
        resolve=resolve,
        published=published.__contains__,
    )
    volume_id = volume_handle(UID, "config")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(preparer.run)
        await trio.testing.wait_all_tasks_blocked()
        assert volumes.calls == ["prepare"]  # under way, waiting for `go`
        released = trio.Event()

        async def publish() -> None:
            await preparer.release(volume_id)
            released.set()

        nursery.start_soon(publish)
        await trio.testing.wait_all_tasks_blocked()
        assert not released.is_set()  # waits for the preparation
        volumes.go.set()
        await released.wait()
        assert volumes.calls == ["prepare", "prepared", "unprepare"]
        assert len(preparer.preparations) == 0
        # While the publish path sets it up, a change of its pod prepares nothing.
        store.upsert(dataclasses.replace(web, labels={"changed": "yes"}))
        await trio.testing.wait_all_tasks_blocked()
        assert volumes.calls == ["prepare", "prepared", "unprepare"]
        # A publish that failed: the volume may be prepared again, at its pod's next change.
        preparer.publish_ended(volume_id)
        store.upsert(dataclasses.replace(web, labels={"changed": "again"}))
        await trio.testing.wait_all_tasks_blocked()
        assert volumes.calls[3:] == ["prepare", "prepared"]
        assert len(preparer.preparations) == 1
        nursery.cancel_scope.cancel()


async def _track_nothing(*args: Any, **kwargs: Any) -> str:
    return ""
