"""The reconciler: drive the node's actual state towards the desired state, forever.

It wakes on every change of the object store, when an operation ends, when a backoff expires, and
at least every `resync_interval_s`. Each pass runs the populator, then `reconcile()`, which reads
as kubelet's three steps, in this order so that a volume moving between pods is released first:

    (1) unmount_orphans   volumes set up on the node that no pod wants any more
    (2) serve_and_mount   volumes a pod wants that are not set up yet
    (3) refresh           set-up volumes whose inputs (objects, pod spec) changed

Step (1) waits until every source has delivered its complete initial state (`has_added_pods`).
Each step only *starts* operations in the executor (one per volume, with backoff) and returns, so a
pass takes microseconds however slow a mount is.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

import trio

from fusevol.cache.actual import MountState
from fusevol.errors import FusevolError, is_expected

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Hashable

    from fusevol.cache.actual import ActualState, MountedVolume
    from fusevol.cache.desired import DesiredState, VolumeToServe
    from fusevol.cache.store import ObjectStore
    from fusevol.model import UniqueVolumeName
    from fusevol.populator import Populator
    from fusevol.reconciler.executor import Executor
    from fusevol.reconciler.volumes import Volumes

log = logging.getLogger(__name__)


class Reconciler:
    def __init__(
        self,
        *,
        store: ObjectStore,
        populator: Populator,
        desired: DesiredState,
        actual: ActualState,
        executor: Executor,
        volumes: Volumes,
        resync_interval_s: float,
        on_pass: Callable[[], None] = lambda: None,
        on_volume_failed: Callable[[VolumeToServe, str], None] = lambda *_: None,
    ) -> None:
        """`on_volume_failed(volume, error)` after each failed set-up or refresh (the API
        source records kubelet's FailedMount event)."""
        self._on_volume_failed = on_volume_failed
        self._store = store
        self._populator = populator
        self._desired = desired
        self._actual = actual
        self._executor = executor
        self._volumes = volumes
        self._resync_interval_s = resync_interval_s
        self._on_pass = on_pass
        self._wakeup = trio.Event()
        self._passes = 0

    def kick(self) -> None:
        """Ask for a pass as soon as possible."""
        self._wakeup.set()

    @property
    def passes(self) -> int:
        return self._passes

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._follow_store)
            task_status.started()
            while True:
                self._wakeup = trio.Event()
                self._populator.populate()
                self.reconcile()
                self._passes += 1
                self._on_pass()
                deadline = min(
                    trio.current_time() + self._resync_interval_s, self._executor.next_retry_at()
                )
                with trio.move_on_at(deadline):
                    await self._wakeup.wait()

    def reconcile(self) -> None:
        if self._populator.has_added_pods:
            self.unmount_orphans()  # (1)
        self.serve_and_mount()  # (2)
        self.refresh()  # (3)

    def unmount_orphans(self) -> None:
        for mounted in self._actual.mounted_volumes():
            if mounted.name not in self._desired:
                self._start(mounted.name, "unmount", functools.partial(self._unmount, mounted))

    def serve_and_mount(self) -> None:
        for volume in self._desired.volumes_to_serve():
            mounted = self._actual.get(volume.name)
            if mounted is None or mounted.state is MountState.UNCERTAIN:
                self._start(
                    volume.name,
                    "mount",
                    functools.partial(self._mount, volume),
                    inputs=self._volumes.inputs(volume),
                )

    def refresh(self) -> None:
        for volume in self._desired.volumes_to_serve():
            mounted = self._actual.get(volume.name)
            if mounted is None or mounted.state is MountState.UNCERTAIN:
                continue
            inputs = self._volumes.inputs(volume)
            if inputs != mounted.inputs:
                refresh = functools.partial(self._refresh, volume, mounted)
                self._start(volume.name, "refresh", refresh, inputs=inputs)

    async def unmount_all(self) -> None:
        """Tear down every volume, for a clean stop. The executor must be stopped already."""
        for mounted in self._actual.mounted_volumes():
            try:
                await self._unmount(mounted)
            except FusevolError as exc:
                log.error("unmount failed volume=%s error=%s", mounted.name, exc)

    # -- operations --------------------------------------------------------------------------------

    async def _mount(self, volume: VolumeToServe) -> None:
        try:
            self._actual.mark_mounted(await self._volumes.set_up(volume))
        except Exception as exc:
            self._on_volume_failed(volume, str(exc) or type(exc).__name__)
            raise
        log.info(
            "volume set up volume=%s pod=%s/%s", volume.name, volume.pod.namespace, volume.pod.name
        )

    async def _refresh(self, volume: VolumeToServe, mounted: MountedVolume) -> None:
        try:
            self._actual.mark_mounted(await self._volumes.refresh(volume, mounted))
        except Exception as exc:
            self._on_volume_failed(volume, str(exc) or type(exc).__name__)
            raise
        log.info(
            "volume updated volume=%s pod=%s/%s", volume.name, volume.pod.namespace, volume.pod.name
        )

    async def _unmount(self, mounted: MountedVolume) -> None:
        await self._volumes.tear_down(mounted)
        self._actual.mark_unmounted(mounted.name)
        if not self._actual.pod_has_volumes(mounted.pod_uid):
            await self._volumes.remove_pod_dir(mounted.pod_uid)
        log.info("volume torn down volume=%s", mounted.name)

    def _start(
        self,
        name: UniqueVolumeName,
        operation: str,
        run: Callable[[], Awaitable[None]],
        *,
        inputs: Hashable = None,
    ) -> None:
        try:
            self._executor.start(name, operation, run, inputs=inputs)
        except FusevolError as exc:
            if not is_expected(exc):
                raise
            log.debug("%s not started volume=%s: %s", operation, name, exc)

    async def _follow_store(self) -> None:
        generation = self._store.generation
        while True:
            await self._store.wait_changed(generation)
            generation = self._store.generation
            self.kick()
