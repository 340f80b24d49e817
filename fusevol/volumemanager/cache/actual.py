"""ActualState: the volumes that are set up on this node, as kubelet's actual state of world.

The reconciler marks a volume mounted only after its set-up succeeded, and unmounted only after
its tear-down did, so this is never ahead of the node. Each entry remembers the inputs it was built
from (object versions, the pod's volume spec) so the reconciler can tell when to refresh it.
Named verbs, snapshots out, trio thread only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fusevol.volumemanager.cache.changes import Changes, Subscribers

if TYPE_CHECKING:
    from collections.abc import Hashable, Iterable

    from fusevol.model import PodUID, UniqueVolumeName
    from fusevol.node.layout import Plugin


class MountState(enum.Enum):
    MOUNTED = "mounted"
    UNCERTAIN = "uncertain"
    """Found on the node after a restart, not yet confirmed by a set-up."""


@dataclass(frozen=True, slots=True)
class MountedVolume:
    name: UniqueVolumeName
    plugin: Plugin
    pod_uid: PodUID
    spec_name: str
    """The volume directory's name (the pod volume's, or its PersistentVolume's)."""
    path: str
    """The pod volume directory (for hostPath: the host path). A string: a `Path` keeps its parts
    besides, three times the memory, for each of a node's thousands of volumes."""
    inputs: Hashable
    """What the content was built from; a refresh is due when the desired inputs differ."""
    state: MountState = MountState.MOUNTED
    updated_at: float | None = None
    """Wall-clock time (`time.time()`) of the last set-up or refresh; None if reconstructed."""


class ActualState:
    """Every change bumps `generation` and wakes `wait_changed()`, as the object store's do: a
    caller waiting for a volume to be set up (the hand-over, a CSI publish) waits on it."""

    def __init__(self) -> None:
        self._volumes: dict[UniqueVolumeName, MountedVolume] = {}
        self._by_pod: dict[PodUID, int] = {}
        """How many of `_volumes` each pod has: a pod's tear-down asks after each of its volumes
        whether any is left, which a scan of every volume made quadratic in the node's pods (a
        count, not the set of their names: 216 bytes a pod, on thousands of pods)."""
        self._changes = Changes()

    def mark_mounted(self, volume: MountedVolume) -> None:
        self._forget(volume.name)
        self._volumes[volume.name] = volume
        self._by_pod[volume.pod_uid] = self._by_pod.get(volume.pod_uid, 0) + 1
        self._changes.bump(volume.name)

    def mark_unmounted(self, name: UniqueVolumeName) -> None:
        """No-op if the volume is not mounted."""
        if self._forget(name):
            self._changes.bump(name)

    def _forget(self, name: UniqueVolumeName) -> bool:
        volume = self._volumes.pop(name, None)
        if volume is None:
            return False
        left = self._by_pod.pop(volume.pod_uid) - 1
        if left:
            self._by_pod[volume.pod_uid] = left
        return True

    @property
    def generation(self) -> int:
        """How many changes so far."""
        return self._changes.value

    async def wait_changed(self, since: int) -> None:
        """Return as soon as `generation` differs from `since`."""
        await self._changes.wait_changed(since)

    @property
    def subscribers(self) -> Subscribers:
        """Events set when the volume they were added under changes."""
        return self._changes.subscribers

    def uncertain(self, names: Iterable[UniqueVolumeName] | None = None) -> int:
        """How many of `names` (of every volume, if None) are UNCERTAIN: found on the node, not
        set up again yet."""
        volumes = self._volumes.values() if names is None else map(self._volumes.get, names)
        return sum(1 for v in volumes if v is not None and v.state is MountState.UNCERTAIN)

    async def wait_certain(self, names: Iterable[UniqueVolumeName] | None = None) -> None:
        """Return once none of `names` (no volume, if None) is UNCERTAIN."""
        names = None if names is None else list(names)
        while self.uncertain(names):
            await self.wait_changed(self.generation)

    def get(self, name: UniqueVolumeName) -> MountedVolume | None:
        return self._volumes.get(name)

    def mounted_volumes(self) -> tuple[MountedVolume, ...]:
        return tuple(self._volumes.values())

    def pod_has_volumes(self, uid: PodUID) -> bool:
        return uid in self._by_pod

    def __contains__(self, name: object) -> bool:
        return name in self._volumes
