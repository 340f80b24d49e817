"""Which volumes a reconciler pass looks at: every one, or only those an edit concerns.

A pass asks each volume it looks at for its inputs, about 10 us each, and the populator and steps
(0), (1), (2) and (4) of the pass (`loop`) walk every volume or pod of the node: at 6000 volumes,
an edit that concerns one or two of them would cost tens of milliseconds of the trio thread. A
pass that only follows edits of objects and ends of operations asks only the volumes built from
those objects for their inputs (`PassScope.candidates`), and takes step (3) alone when those
objects are what volumes serve and those operations left their volumes set up
(`PassScope.content_only`): an edit costs the node's few volumes it concerns, not all of them. Any
other change, `want_full()` (a CSI unpublish, the resync), a retry that is due and at least every
`resync_interval_s` make a full pass, which indexes what each volume is built from for the passes
that follow (`PassScope.index_references`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import trio

from fusevol.base.multimap import SetMultimap
from fusevol.model import Kind
from fusevol.volumemanager.cache.actual import MountState

if TYPE_CHECKING:
    from collections.abc import Callable

    from fusevol.model import ObjectKey, UniqueVolumeName
    from fusevol.volumemanager.cache.actual import ActualState
    from fusevol.volumemanager.cache.desired import DesiredState, VolumeToServe


class PassScope:
    def __init__(
        self,
        *,
        desired: DesiredState,
        actual: ActualState,
        objects: Callable[[VolumeToServe], tuple[ObjectKey, ...]],
        resync_interval_s: float,
    ) -> None:
        """`objects(volume)`: the objects the volume is built from (`VolumeOperations.objects`)."""
        self._desired = desired
        self._actual = actual
        self._objects = objects
        self._resync_interval_s = resync_interval_s
        self._full_wanted = True
        """The next pass looks at every volume (`candidates`)."""
        self._last_full = -math.inf
        self._retry_at = math.inf
        """The earliest retry the executor scheduled, as the passes since the last full one saw
        it: when it has come, the next pass is a full one."""
        self._referencing: SetMultimap[ObjectKey, UniqueVolumeName] = SetMultimap()
        """Each object -> the volumes built from it, as of the last full pass (nearly always one:
        held bare, not in a list of one)."""
        self._references_of: dict[UniqueVolumeName, tuple[ObjectKey, ...]] = {}
        """Each desired volume of the last full pass -> the objects it is built from."""

    def index(self, volume: VolumeToServe) -> None:
        """What one volume is built from: each at a full pass, and a CSI volume set up ahead of
        any pass (`Reconciler.set_up_now`), so that the passes that follow its operation's end
        need not be full ones for it."""
        try:
            keys = self._objects(volume)
        except Exception:  # its operation says why (`OperationStarter.inputs`)
            return  # followed by full passes (`candidates`)
        for key in self._references_of.get(volume.name, ()):
            self._referencing.discard(key, volume.name)
        self._references_of[volume.name] = keys
        for key in keys:
            self._referencing.add(key, volume.name)

    def want_full(self) -> None:
        """Make the next pass a full one."""
        self._full_wanted = True

    def passed(self, *, full: bool, next_retry_at: float) -> float:
        """After a pass (a `full` one or not), with the executor's `next_retry_at()`: the earliest
        retry to wake for. A full pass started every retry that was due; a partial one did not,
        and the executor names only retries still ahead: keep the one that fell due meanwhile."""
        self._retry_at = next_retry_at if full else min(self._retry_at, next_retry_at)
        return self._retry_at

    def content_only(self, changed: tuple[ObjectKey, ...], ended: set[UniqueVolumeName]) -> bool:
        """Whether the pass follows nothing but edits of what volumes serve (ConfigMaps,
        Secrets, tokens) and operations that ended with their volume set up and wanted. Then
        the populator and steps (0), (1), (2) and (4) have nothing new to do: what they read
        (pods, claims, PersistentVolumes, which volumes are wanted and which are set up) is as
        the last pass that took them left it, and a retry that falls due makes a full pass
        (`candidates`). Each of them walks every volume or pod of the node: at 6000 volumes,
        some 6 ms of the trio thread for each of the two passes that follow an edit."""
        if any(key.kind not in _CONTENT_KINDS for key in changed):
            return False
        for name in ended:
            mounted = self._actual.get(name)
            if mounted is None or mounted.state is not MountState.MOUNTED:
                return False
            if name not in self._desired:
                return False
        return True

    def candidates(
        self, changed: tuple[ObjectKey, ...], changes: int, ended: set[UniqueVolumeName]
    ) -> list[VolumeToServe] | None:
        """The volumes whose inputs may differ from their last operation's, if the pass can
        know them; None: a full pass. Step (3) asks every volume for its inputs, which costs
        about 10 us each: an edit on a node of 6000 volumes would cost 60 ms of the trio thread
        for one or two volumes. A pass that only follows edits of objects (ConfigMaps,
        Secrets, tokens) and ends of operations looks at the volumes built from those objects,
        and at the volumes whose operation ended with the others built from the same objects
        (the users of a shared subtree record its new inputs); anything else is a full pass: a
        change of a pod, claim or volume or a deletion of an object, an object no volume was
        built from at the last full pass, an ended operation of a volume that pass did not
        know, `want_full()` (`Reconciler.kick`: a CSI unpublish), a retry that is due, and at
        least every `resync_interval_s`."""
        now = trio.current_time()
        if (
            self._full_wanted
            or changes != len(changed)  # a deletion, a sync, or an object changed twice
            or now - self._last_full >= self._resync_interval_s
            or now >= self._retry_at  # due, edits or not
        ):
            return None
        names = dict.fromkeys(ended)
        for key in changed:
            if key not in self._referencing:
                return None
            names.update(dict.fromkeys(self._referencing.get(key)))
        for name in ended:
            if (keys := self._references_of.get(name)) is None:
                return None
            for key in keys:
                names.update(dict.fromkeys(self._referencing.get(key)))
        if 4 * len(names) > len(self._references_of):
            return None
        return [volume for name in names if (volume := self._desired.get(name)) is not None]

    def index_references(self) -> None:
        """At a full pass: what each desired volume is built from, for the passes that follow
        (`candidates`)."""
        self._full_wanted, self._last_full = False, trio.current_time()
        self._referencing, self._references_of = SetMultimap(), {}
        for volume in self._desired.volumes_to_serve():
            self.index(volume)


_CONTENT_KINDS = frozenset({Kind.CONFIG_MAP, Kind.SECRET, Kind.SERVICE_ACCOUNT_TOKEN})
"""What volumes serve, and the populator, the provisioner and the desired state never read."""
