"""The operations a reconciler pass starts: a volume's set-up, refresh and tear-down.

The pass (`loop`) decides which volume needs which operation; `OperationStarter` makes the
operation and starts it in the executor (one per volume at a time, with backoff), so that a pass
only *starts* operations and returns. An operation marks the actual state only once it has
succeeded, reports a failed set-up or refresh (`on_volume_failed`), and is noted when it ends,
whatever the outcome, for the next pass (`take_ended`). Whatever one volume's input does, it
fails that volume alone: an error met while the pass asks the volume for its inputs (`inputs`)
becomes `FailedInputs`, and the volume's operation starts anyway and raises it (the executor's
backoff, one error line).

`VolumeOperations` is what the reconciler asks of the volumes
(`fusevol.volumemanager.reconciler.volumes`).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from fusevol.base.errors import FusevolError, is_expected

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Hashable, Iterable

    from fusevol.model import ObjectKey, Pod, PodUID, UniqueVolumeName
    from fusevol.node.layout import Plugin
    from fusevol.volumemanager.cache.actual import ActualState, MountedVolume
    from fusevol.volumemanager.cache.desired import VolumeToServe
    from fusevol.volumemanager.reconciler.executor import Executor

log = logging.getLogger(__name__)


class VolumeOperations(Protocol):
    """What the reconciler asks of the volumes (`fusevol.volumemanager.reconciler.volumes`)."""

    def inputs(self, volume: VolumeToServe) -> Hashable: ...
    def shared_subtree(self, volume: VolumeToServe) -> bytes | None: ...
    def to_refresh_first(self, changed: Iterable[ObjectKey]) -> list[VolumeToServe]: ...
    def objects(self, volume: VolumeToServe) -> tuple[ObjectKey, ...]: ...
    def is_current(self, volume: VolumeToServe, inputs: Hashable) -> bool: ...
    def refreshed(self, mounted: MountedVolume, inputs: Hashable) -> MountedVolume: ...
    async def set_up(self, volume: VolumeToServe) -> MountedVolume: ...
    async def refresh(self, volume: VolumeToServe, mounted: MountedVolume) -> MountedVolume: ...
    async def tear_down(self, mounted: MountedVolume) -> None: ...
    async def remove_pod_dir(self, uid: PodUID) -> None: ...


@dataclass(frozen=True, slots=True)
class FailedInputs:
    """A volume's inputs that could not be computed: equal for the same error, so that its
    retries wait out the backoff as any failed operation's do."""

    message: str
    error: Exception = field(compare=False)
    """Raised by the volume's operation: a new one each pass (`OperationStarter.inputs`)."""


class OperationStarter:
    def __init__(
        self,
        *,
        actual: ActualState,
        executor: Executor,
        volumes: VolumeOperations,
        on_volume_failed: Callable[[VolumeToServe, str], None] = lambda *_: None,
    ) -> None:
        """`on_volume_failed(volume, error)` after each failed set-up or refresh."""
        self._actual = actual
        self._executor = executor
        self._volumes = volumes
        self._on_volume_failed = on_volume_failed
        self._ended: set[UniqueVolumeName] = set()
        """Volumes whose operation ended since the last `take_ended`."""

    def take_ended(self) -> set[UniqueVolumeName]:
        """The volumes whose operation ended since the last call (at the start of a pass)."""
        ended, self._ended = self._ended, set()
        return ended

    def inputs(self, volume: VolumeToServe) -> Hashable:
        """The volume's inputs, or the `FailedInputs` met computing them (module docstring)."""
        try:
            return self._volumes.inputs(volume)
        except Exception as exc:
            return FailedInputs(f"{type(exc).__name__}: {exc}", exc)

    def start_mount(self, volume: VolumeToServe, inputs: Hashable) -> bool:
        return self.start(
            volume.name,
            "mount",
            functools.partial(self._mount, volume, inputs),
            inputs=inputs,
            subject=_subject(volume.pod),
            served=_served(volume.plugin),
        )

    def start_refresh(
        self, volume: VolumeToServe, mounted: MountedVolume, inputs: Hashable
    ) -> bool:
        refresh = functools.partial(self._refresh, volume, mounted, inputs)
        return self.start(
            volume.name,
            "refresh",
            refresh,
            inputs=inputs,
            subject=_subject(volume.pod),
            served=_served(volume.plugin),
        )

    def start_unmount(self, mounted: MountedVolume) -> bool:
        unmount = functools.partial(self.unmount, mounted)
        return self.start(mounted.name, "unmount", unmount, served=_served(mounted.plugin))

    def start(
        self,
        name: UniqueVolumeName,
        operation: str,
        run: Callable[[], Awaitable[None]],
        *,
        inputs: Hashable = None,
        subject: str = "",
        served: bool = False,
    ) -> bool:
        """Start the operation; False if the executor refused (pending, or in backoff)."""

        async def run_and_note_its_end() -> None:
            try:
                await run()
            finally:
                self._ended.add(name)

        try:
            self._executor.start(
                name, operation, run_and_note_its_end, inputs=inputs, subject=subject, served=served
            )
        except FusevolError as exc:
            if not is_expected(exc):
                raise
            log.debug("%s not started volume=%s: %s", operation, name, exc)
            return False
        return True

    async def unmount(self, mounted: MountedVolume) -> None:
        await self._volumes.tear_down(mounted)
        self._actual.mark_unmounted(mounted.name)
        if not self._actual.pod_has_volumes(mounted.pod_uid):
            await self._volumes.remove_pod_dir(mounted.pod_uid)
        log.info("volume torn down volume=%s", mounted.name)

    async def _mount(self, volume: VolumeToServe, inputs: Hashable = None) -> None:
        try:
            if isinstance(inputs, FailedInputs):
                raise inputs.error
            self._actual.mark_mounted(await self._volumes.set_up(volume))
        except Exception as exc:
            self._on_volume_failed(volume, str(exc) or type(exc).__name__)
            raise
        log.info(
            "volume set up volume=%s pod=%s/%s", volume.name, volume.pod.namespace, volume.pod.name
        )

    async def _refresh(
        self, volume: VolumeToServe, mounted: MountedVolume, inputs: Hashable = None
    ) -> None:
        try:
            if isinstance(inputs, FailedInputs):
                raise inputs.error
            self._actual.mark_mounted(await self._volumes.refresh(volume, mounted))
        except Exception as exc:
            self._on_volume_failed(volume, str(exc) or type(exc).__name__)
            raise
        log.info(
            "volume updated volume=%s pod=%s/%s", volume.name, volume.pod.namespace, volume.pod.name
        )


def _subject(pod: Pod) -> str:
    """`pod=ns/name file=...`: whom a failed operation concerns, for its error line."""
    origin = f" file={pod.origin}" if pod.origin else ""
    return f"pod={pod.namespace}/{pod.name}{origin}"


def _served(plugin: Plugin | None) -> bool:
    """True for a volume served from memory, whose operations the executor may queue."""
    return plugin is not None and plugin.served_from_memory
