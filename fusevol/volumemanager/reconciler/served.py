"""Set-up, refresh and tear-down of the volumes served from memory.

configMap, secret, downwardAPI and projected volumes; their payload rules are in
`fusevol.projection`, their fsGroup ownership in `fusevol.projection.ownership`.

A served volume is three things: a subtree on the agent's FUSE mount holding kubelet's
AtomicWriter layout, the pod volume directory, and a read-only, shared bind mount of the first on
the second. After a restart the new bind is stacked on the previous agent's (dead or handed-over)
one, so that containers whose copy of it receives propagation (rslave) switch to the new one; the
covered one goes when the volume is torn down. Containers always get these volume types read-only
(docs/kubelet.md fact 1), so the bind is too; only the agent writes, through its own mount.

Volumes that would hold the same files share one subtree (`sharing.subtree_name`): configMap,
secret and projected volumes of one namespace with the same spec, the same fsGroup and the same
nested mountpoints, as long as nothing in them depends on the pod (downward API, service account
tokens). An update then switches one `..data` for all of them, however many pods there are, and the
kernel's caches hold one copy; every other pod's bind sees the switch at the same instant, with
the same inotify events. The subtree goes with its last user.

Every operation renders the payload before it changes anything, so bad input (a missing object or
key, an invalid path) fails before anything on the node changes: a new volume leaves nothing
behind, and a served one keeps its last good content, as kubelet does. (A volume whose shared
subtree was published from its very inputs has nothing to render: it only binds.) A path that
kubelet could not write below this volume's own directory, the kernel refusing it as longer than
PATH_MAX, fails the volume with kubelet's ENAMETOOLONG (`payloads.check_lengths`), whether it
renders or binds a shared subtree (whose longest path is kept for that). How a payload is
rendered and checked is `payloads`'s; which volumes share a subtree, `sharing`'s.
"""

from __future__ import annotations

import collections
import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from fusevol.base.multimap import SetMultimap
from fusevol.fuse.publish import VolumeDir
from fusevol.model import (
    DownwardAPIProjection,
    DownwardAPIVolumeSource,
    ProjectedVolumeSource,
    referenced_objects,
)
from fusevol.node import layout
from fusevol.node.layout import Plugin
from fusevol.projection import ownership
from fusevol.volumemanager.reconciler import payloads
from fusevol.volumemanager.reconciler.sharing import (
    AUDITED,
    SHARED,
    nested_mountpoints,
    subtree_name,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Hashable, Iterable
    from pathlib import Path

    from fusevol.fuse.publish import Publisher
    from fusevol.model import ObjectKey, Payload, PodUID
    from fusevol.mount.backend import MountBackend
    from fusevol.projection.downward import NodeAllocatable
    from fusevol.volumemanager.cache.desired import VolumeToServe
    from fusevol.volumemanager.cache.store import ObjectStore
    from fusevol.volumemanager.reconciler.auditing import Auditing

ROOT_MODES = {
    # The wrapped emptyDir: a disk directory created 0777 for configMap, a tmpfs (mode 1777) for
    # the others (docs/kubelet.md fact 1).
    Plugin.CONFIG_MAP: 0o777,
    Plugin.SECRET: 0o1777,
    Plugin.DOWNWARD_API: 0o1777,
    Plugin.PROJECTED: 0o1777,
}


_FACTS_KEPT = 1024
"""`ServedVolumes._facts` beyond twice the volumes set up: past this, the facts of the volumes
not set up (never, or no longer) are dropped. Those of the volumes set up stay: recomputed, their
tuple, subtree name and object keys would be copies of those the indexes hold (about 250 bytes a
volume, on thousands of volumes; a node's start, thousands of volumes not set up yet, came past
the bound again and again)."""


@dataclass(frozen=True, slots=True)
class _Facts:
    user: tuple[PodUID, str]
    """The volume as a user of subtrees, (pod uid, volume name): the one tuple that keys it in
    every index, where each would make its own (56 bytes each, on thousands of volumes)."""
    volume: VolumeToServe
    """The object these are of (identity: a changed pod is a new object)."""
    subtree: bytes
    objects: tuple[ObjectKey, ...]
    downward: bool
    audited: bool


@dataclass(frozen=True, slots=True)
class Prepared:
    """A volume served but not bound yet (`ServedVolumes.prepare`)."""

    inputs: Hashable
    source: Path
    target: Path
    bind: Callable[[], str]
    """Makes the bind, in a thread that is not the trio thread; returns its device."""


_TARGET_MODE = 0o750
"""A volume directory the bind makes (kubelet's MkdirAll of a volume's directory)."""
_LONG_PATH = 1024
"""Bytes of a path far enough from PATH_MAX below any volume directory not to be kept."""

_NOTHING = object()


class ServedVolumes:
    def __init__(
        self,
        *,
        root: Path,
        store: ObjectStore,
        publisher: Publisher,
        backend: MountBackend,
        allocatable: NodeAllocatable,
        observe_propagation: Callable[[float], None] = lambda _: None,
        subtree_names: Callable[[bytes], bytes] = lambda readable: readable,
        auditing: Auditing | None = None,
    ) -> None:
        """`observe_propagation(seconds)`: after each refresh that published a new version, the
        time since the change of the newest object it depends on. `subtree_names`: a subtree's
        name on the mount from its readable one (`subtree_name`): the connection's keyed hash of
        it, which no container can guess (`fusevol.fuse.naming`). `auditing`: which volumes are
        audited, and their index (None: none is)."""
        self._auditing = auditing
        self._observe_propagation = observe_propagation
        self._subtree_names = subtree_names
        self._root = root
        self._store = store
        self._publisher = publisher
        self._backend = backend
        self._allocatable = allocatable
        self._users: SetMultimap[bytes, tuple[PodUID, str]] = SetMultimap()
        """Each subtree's users, (pod uid, volume directory name): it goes with the last one."""
        self._subtree_of: dict[tuple[PodUID, str], bytes] = {}
        self._covered: dict[tuple[PodUID, str], list[bytes]] = {}
        """Subtrees still bound below a volume's top bind, after its spec changed (`refresh`)."""
        self._published: dict[bytes, Hashable] = {}
        """Each shared subtree's inputs at its last publish: a user whose inputs are these is
        current already (`is_current`), however many pods share it."""
        self._longest: dict[bytes, str] = {}
        """Each shared subtree's longest path at its last publish, for the users that bind it
        without rendering (module docstring); only those of over `_LONG_PATH` bytes."""
        self._locks: collections.defaultdict[bytes, trio.Lock] = collections.defaultdict(trio.Lock)
        """One operation per subtree at a time: the executor serialises volumes, not subtrees.
        Held only while some task holds or awaits it (`_holding`): thousands of subtrees, seldom
        locked."""
        self._shared_by_object: SetMultimap[ObjectKey, bytes] = SetMultimap()
        """The shared subtrees built from each object (`to_refresh_first`)."""
        self._objects_of: dict[bytes, tuple[ObjectKey, ...]] = {}
        self._facts: dict[tuple[PodUID, str], _Facts] = {}
        """What a pass asks of every volume and only its spec decides (`_facts_of`): computed
        once per `VolumeToServe` object, not on every pass (the populator keeps the same object
        while the pod is the same)."""

    def path(self, volume: VolumeToServe) -> Path:
        """The pod volume directory, or a CSI volume's target path."""
        assert volume.plugin is not None
        if volume.target is not None:
            return volume.target
        return layout.volume_dir(self._root, volume.pod.uid, volume.plugin, volume.spec_name)

    def inputs(self, volume: VolumeToServe) -> Hashable:
        """What the volume's content depends on: its spec, the pod's fsGroup, the versions of its
        objects, and for the downward API the pod itself; and whether it is audited (its bind's
        source)."""
        facts = self._facts_of(volume)
        pod = volume.pod if facts.downward else None
        versions = []
        for key in facts.objects:
            obj = self._store.get(key)
            versions.append(None if obj is None else obj.resource_version)
        return (volume.source, volume.pod.fs_group, pod, facts.audited, *versions)

    def objects(self, volume: VolumeToServe) -> tuple[ObjectKey, ...]:
        """The objects `inputs` reads the versions of."""
        return self._facts_of(volume).objects

    def shared_subtree(self, volume: VolumeToServe) -> bytes | None:
        """The shared subtree the volume is bound to, if it is shared and still the right one."""
        name = self._subtree_of.get((volume.pod.uid, volume.spec_name))
        if name is None or not name.startswith(SHARED) or name != self._facts_of(volume).subtree:
            return None
        return name

    def to_refresh_first(self, changed: Iterable[ObjectKey]) -> list[VolumeToServe]:
        """For each shared subtree built from a `changed` object, one of its users (as the last
        pass saw it): refreshing it publishes the change to every pod of the subtree."""
        volumes = []
        for name in {n for key in changed for n in self._shared_by_object.get(key)}:
            for user in self._users.get(name):
                facts = self._facts.get(user)
                if facts is not None:
                    volumes.append(facts.volume)
                    break
        return volumes

    def _facts_of(self, volume: VolumeToServe) -> _Facts:
        user = (volume.pod.uid, volume.spec_name)
        facts = self._facts.get(user)
        if facts is None or facts.volume is not volume:
            if len(self._facts) > _FACTS_KEPT + 2 * len(self._subtree_of):
                self._facts = {u: f for u, f in self._facts.items() if u in self._subtree_of}
            audited = self._auditing is not None and self._auditing.audited(volume)
            subtree = self._subtree_names(subtree_name(volume, audited=audited))
            objects = _referenced_objects(volume)
            if facts is not None:  # what the indexes hold already, where it is the same
                user = facts.user
                subtree = facts.subtree if facts.subtree == subtree else subtree
                objects = facts.objects if facts.objects == objects else objects
            facts = self._facts[user] = _Facts(
                user, volume, subtree, objects, _uses_downward_api(volume), audited
            )
        return facts

    def is_current(self, volume: VolumeToServe, inputs: Hashable) -> bool:
        """True if the volume's shared subtree was published from `inputs` already (by another
        user's refresh): nothing of this pod volume is to do, only its inputs to record."""
        name = self.shared_subtree(volume)
        return name is not None and self._published.get(name, _NOTHING) == inputs

    async def set_up(self, volume: VolumeToServe) -> Hashable:
        """Serve the volume at its pod volume directory; returns the inputs it was built from."""
        inputs = self.inputs(volume)  # before rendering: a change while we work means a refresh
        target = self.path(volume)
        try:
            await self._serve(volume, self._facts_of(volume).subtree, inputs)
            await self._bind(volume, target, make_target=_TARGET_MODE)
        except BaseException:
            with contextlib.suppress(Exception):
                await self.tear_down(volume.pod.uid, volume.spec_name, target)
            raise
        return inputs

    async def prepare(self, volume: VolumeToServe) -> Prepared:
        """All of `set_up` but the bind, for a CSI volume kubelet is about to publish
        (`fusevol.csi.preparing`): its subtree served, with the volume among its users, and the
        bind to make later, in a thread (`Prepared`). `unprepare` undoes it; once the bind is
        made, `bound` records it and the volume is set up as `set_up` leaves it."""
        inputs = self.inputs(volume)
        try:
            await self._serve(volume, self._facts_of(volume).subtree, inputs)
            source = await self._bind_source(volume)
        except BaseException:
            with contextlib.suppress(Exception):
                await self.unprepare(volume.pod.uid, volume.spec_name)
            raise
        target = self.path(volume)
        bind = self._backend.bind_later(source, target, make_target=_TARGET_MODE)
        return Prepared(inputs, source, target, bind)

    def bound(self, prepared: Prepared, device: str) -> None:
        """The bind of `prepared` was made (and returned `device`)."""
        self._backend.bound(prepared.source, prepared.target, device)

    async def unprepare(self, uid: PodUID, spec_name: str) -> None:
        """Undo `prepare` of a volume whose bind was never made."""
        user = (uid, spec_name)
        self._facts.pop(user, None)
        if (name := self._subtree_of.get(user)) is not None:
            await self._release(user, name)

    async def refresh(self, volume: VolumeToServe) -> Hashable:
        """Publish the volume's current content; returns the inputs it was built from."""
        inputs = self.inputs(volume)
        payload = self.render(volume)
        self._check_lengths(volume, payload)
        user = (volume.pod.uid, volume.spec_name)
        name, bound = self._facts_of(volume).subtree, self._subtree_of.get(user)
        if bound is not None and bound != name:
            # The pod's volume spec changed (an edited manifest): its files are no longer those
            # of the subtree it shares. Served from the right one, bound on top of the old bind,
            # which goes with the volume (`tear_down` unmounts the whole stack, then releases
            # the subtrees below: a subtree is never removed while a bind of it remains).
            await self._serve(volume, name, inputs, lambda: payload)
            await self._bind(volume, self.path(volume))
            self._covered.setdefault(user, []).append(bound)
            return inputs
        async with self._holding(name):
            published = await self._publish(name, volume, payload, inputs)
        if published:
            keys = [*_referenced_objects(volume), volume.pod.key]
            changes = [t for t in map(self._store.changed_at, keys) if t is not None]
            if changes:
                self._observe_propagation(time.monotonic() - max(changes))
        return inputs

    async def tear_down(self, uid: PodUID, spec_name: str, target: Path) -> None:
        # Paths near mounts may reach a FUSE server, our own included: never on the trio thread.
        await self._backend.unmount(target, remove_target=True)
        user = (uid, spec_name)
        self._facts.pop(user, None)
        for covered in self._covered.pop(user, []):
            await self._release(user, covered)
        bound = self._subtree_of.get(user)
        if bound is not None:
            await self._release(user, bound)
            return
        # Not set up by this agent (found on the node after a restart): its own subtree, audited
        # or not, if it has one.
        for audited in (False, True):
            readable = layout.fuse_name(uid, spec_name) + (AUDITED if audited else b"")
            await self._release(user, self._subtree_names(readable))

    async def _serve(
        self,
        volume: VolumeToServe,
        name: bytes,
        inputs: Hashable,
        render: Callable[[], Payload] | None = None,
    ) -> None:
        """Make subtree `name` (created if needed) hold the volume's payload (`render()`, by
        default `self.render(volume)`), with `volume` among its users."""
        user = self._facts_of(volume).user
        async with self._holding(name):
            # A shared subtree published from these very inputs (by another pod's volume, moments
            # ago when many pods start at once) holds what this volume would: nothing to render
            # or publish. Rendering only here, with the lock held, also keeps thousands of
            # volumes waiting for one subtree from each holding a payload meanwhile.
            if self._published.get(name, _NOTHING) != inputs:
                payload = self.render(volume) if render is None else render()
                self._check_lengths(volume, payload)
                await self._publish(name, volume, payload, inputs)
            elif name in self._longest:
                self._check_lengths(volume, (self._longest[name],))
            self._users.add(name, user)
            self._subtree_of[user] = name
            if name.startswith(SHARED) and name not in self._objects_of:
                self._objects_of[name] = objects = self._facts_of(volume).objects
                for key in objects:
                    self._shared_by_object.add(key, name)

    async def _bind(
        self, volume: VolumeToServe, target: Path, *, make_target: int | None = None
    ) -> None:
        # Stacked on a predecessor's bind, so that containers holding an rslave copy of it see the
        # new one (README, "Restarts"); a no-op if ours is already there.
        source = await self._bind_source(volume)
        await self._backend.bind(
            source, target, read_only=True, stack=True, make_target=make_target
        )

    async def _bind_source(self, volume: VolumeToServe) -> Path:
        """The path the volume's bind is of: its subtree, or the audit file system's view of it."""
        name = self._subtree_of[(volume.pod.uid, volume.spec_name)]
        if self._auditing is not None and self._facts_of(volume).audited:
            return await self._auditing.source(name)
        return self._publisher.path(name)

    async def _release(self, user: tuple[PodUID, str], name: bytes) -> None:
        """`user` no longer uses subtree `name`: remove it if it was the last one."""
        if self._subtree_of.get(user) == name:
            del self._subtree_of[user]
        self._users.discard(name, user)
        if name in self._users:
            return
        async with self._holding(name):
            if name not in self._users:  # nobody came meanwhile
                self._published.pop(name, None)
                self._longest.pop(name, None)
                for key in self._objects_of.pop(name, ()):
                    self._shared_by_object.discard(key, name)
                await self._publisher.remove_volume(name)
                if self._auditing is not None:
                    await self._auditing.removed(name)

    def _check_lengths(self, volume: VolumeToServe, payload: Iterable[str]) -> None:
        """kubelet's ENAMETOOLONG for a path of `payload` below this volume's own directory."""
        payloads.check_lengths(volume, self.path(volume), payload)

    @contextlib.asynccontextmanager
    async def _holding(self, name: bytes) -> AsyncIterator[None]:
        """Subtree `name`'s lock, made when first asked and dropped when released to nobody
        (a waiting task is handed it: it stays). Nothing awaits between taking it from
        `_locks` and acquiring it, so two locks of one name never exist."""
        lock = self._locks[name]
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and self._locks.get(name) is lock:
                del self._locks[name]

    async def _publish(
        self, name: bytes, volume: VolumeToServe, payload: Payload, inputs: Hashable
    ) -> bool:
        """Publish `payload` in subtree `name`, made (as a new pod volume directory: its plugin's
        mode, fsGroup, nested mountpoints) if it does not exist yet."""
        assert volume.plugin is not None
        fs_group = volume.pod.fs_group
        self._published.pop(name, None)  # unknown until this publish has succeeded
        auditing = self._auditing if self._facts_of(volume).audited else None
        if auditing is not None:
            await auditing.prepare(name, volume, self._store)
            if not self._publisher.routed(name):  # its first publish: the server is asked for
                self._publisher.route(name, await auditing.source(name))
        published = await self._publisher.publish(
            name,
            ownership.apply_fs_group(payload, fs_group),
            gid=fs_group,
            dir_mode=ownership.dir_mode(0o755, fs_group),
            new=VolumeDir(
                mode=ownership.dir_mode(ROOT_MODES[volume.plugin], fs_group),
                gid=fs_group or 0,
                nested=nested_mountpoints(volume),
                nested_mode=ownership.dir_mode(0o755, fs_group),
            ),
            warm_later=volume.target is not None,  # a CSI volume: answered once it is bound
        )
        if auditing is not None:
            await auditing.published(name, self._publisher.current_version(name))
        if name.startswith(SHARED):
            self._published[name] = inputs
            if 4 * max(map(len, payload), default=0) > _LONG_PATH:  # 4: UTF-8's longest
                self._longest[name] = max(payload, key=lambda path: len(path.encode()))
            else:
                self._longest.pop(name, None)
        return published

    def render(self, volume: VolumeToServe) -> Payload:
        """The volume's payload, or VolumeSetupError / InvalidPayload naming what is wrong."""
        return payloads.render(volume, store=self._store, allocatable=self._allocatable)

    def object_versions(self, volume: VolumeToServe) -> dict[str, str | None]:
        """`"configmap ns/name"` -> its resourceVersion (None: missing), for `fusevol status`."""
        versions: dict[str, str | None] = {}
        for key in self._facts_of(volume).objects:
            obj = self._store.get(key)
            versions[str(key)] = None if obj is None else obj.resource_version
        return versions


def _referenced_objects(volume: VolumeToServe) -> tuple[ObjectKey, ...]:
    return referenced_objects(volume.pod, volume.source)


def _uses_downward_api(volume: VolumeToServe) -> bool:
    match volume.source:
        case DownwardAPIVolumeSource():
            return True
        case ProjectedVolumeSource(sources=sources):
            return any(isinstance(p, DownwardAPIProjection) for p in sources)
        case _:
            return False
