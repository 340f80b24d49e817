"""The reconciler: drive the node's actual state towards the desired state, forever.

It wakes on every change of the object store, when an operation ends (`Executor.wait_finished`),
when a backoff expires, and at least every `resync_interval_s`. Each pass runs the populator, then
`reconcile()`, which reads as kubelet's three steps (1) to (3), in this order so that a volume
moving between pods is released first, between the two steps of the provisioner (0) and (4)
(`HostPathProvisioner` only):

    (0) provision         claims a pod here waits for, of a class this node provisions
    (1) unmount_orphans   volumes set up on the node that no pod wants any more
    (2) serve_and_mount   volumes a pod wants that are not set up yet
    (3) refresh           set-up volumes whose inputs (objects, pod spec) changed; of the
                          volumes sharing one subtree, one publishes and the others only
                          record the new inputs, without an operation (an edit of an object
                          that 2000 pods use is one publish, not 2000 operations)
    (4) reclaim           provisioned volumes whose claim is gone: released, and deleted (policy
                          Delete) once no pod of this node uses them

Steps (1) and (4) wait until every source has delivered its complete initial state
(`has_added_pods`). Whatever one volume's input does, it fails that volume alone: an operation's
error is the executor's (backoff, one error line), and so is an error met while the pass asks the
volume for its inputs: the volume's operation starts anyway and raises it (`operations`).
Each step only *starts* operations in the executor (one per volume, with backoff) and returns, so a
pass takes microseconds per volume however slow a mount is. What a pass asks of each volume is
computed once per volume spec (`ServedVolumes`), and passes for ending operations are spaced by
their own cost (`_follow_executor`), so setting up N volumes costs O(N), not O(N²). A pass that
only follows edits of objects and ends of operations asks only the volumes built from those
objects for their inputs, and takes step (3) alone when those objects are what volumes serve and
those operations left their volumes set up (`scope`): an edit costs the node's few volumes it
concerns, not all of them; any other change, a retry and the resync are full passes. An edit that
comes during a pass has its shared subtree refreshed at the pass's next step
(`_start_refresh_first`).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from fusevol.model import PersistentVolumeClaimVolumeSource, UniqueVolumeName
from fusevol.node.layout import Plugin
from fusevol.provision.hostpath import PROVISIONER
from fusevol.volumemanager.cache.actual import MountState
from fusevol.volumemanager.reconciler.operations import FailedInputs, OperationStarter
from fusevol.volumemanager.reconciler.scope import PassScope

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from fusevol.model import ObjectKey
    from fusevol.provision.hostpath import HostPathProvisioner
    from fusevol.volumemanager.cache.actual import ActualState, MountedVolume
    from fusevol.volumemanager.cache.desired import DesiredState, VolumeToServe
    from fusevol.volumemanager.cache.store import ObjectStore
    from fusevol.volumemanager.populator import Populator
    from fusevol.volumemanager.reconciler.executor import Executor
    from fusevol.volumemanager.reconciler.operations import VolumeOperations

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReconcilerStatistics:
    passes: int
    store_generation: int
    """The object store's generation the last complete pass started from: once it is the
    store's own and no operation is pending, everything the store holds has been acted on."""


class Reconciler:
    def __init__(
        self,
        *,
        store: ObjectStore,
        populator: Populator,
        desired: DesiredState,
        actual: ActualState,
        executor: Executor,
        volumes: VolumeOperations,
        resync_interval_s: float,
        on_pass: Callable[[], None] = lambda: None,
        on_volume_failed: Callable[[VolumeToServe, str], None] = lambda *_: None,
        provisioner: HostPathProvisioner | None = None,
    ) -> None:
        """`on_volume_failed(volume, error)` after each failed set-up or refresh (the API
        source records kubelet's FailedMount event)."""
        self._provisioner = provisioner
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
        self._reconciled = -1
        """The store's generation at the start of the last complete pass."""
        self._pass_s = 0.0
        """How long the last pass took (`_follow_executor` spaces its passes by it)."""
        self._refreshing: set[bytes] = set()
        """The shared subtrees that refreshes work on, as step (3) of the pass knows them."""
        self._operations = OperationStarter(
            actual=actual, executor=executor, volumes=volumes, on_volume_failed=on_volume_failed
        )
        self._scope = PassScope(
            desired=desired,
            actual=actual,
            objects=volumes.objects,
            resync_interval_s=resync_interval_s,
        )

    def kick(self) -> None:
        """Ask for a pass over every volume as soon as possible."""
        self._scope.want_full()
        self._wakeup.set()

    def set_up_now(self, name: UniqueVolumeName) -> None:
        """Step (2) for one CSI volume, at once (a publish, which kubelet waits for): resolved
        by the populator, indexed for the passes that follow, and its set-up started, without a
        pass over every volume. Each publish of a burst (kubelet's 80 at once) asked for a full
        pass, the populator's over every pod and steps (0) to (4) over every volume: over a
        quarter of the trio thread's time in such a burst (py-spy). A volume with an operation
        pending, or set up with other inputs (a republish), is left to a full pass, as `kick`
        asks."""
        volume = self._populator.resolve_csi_now(name)
        if volume is None or self._executor.is_pending(name):
            self.kick()
            return
        self._scope.index(volume)
        mounted = self._actual.get(name)
        if mounted is None or mounted.state is MountState.UNCERTAIN:
            self._operations.start_mount(volume, self._operations.inputs(volume))
        elif mounted.inputs != self._operations.inputs(volume):
            self.kick()

    def adopt(self, mounted: MountedVolume, seconds: float) -> None:
        """A CSI volume in the desired state that was set up without an operation, in `seconds`
        (a publish answered in gRPC's thread: `fusevol.csi.preparing`): set up as `mounted`
        says, counted as a mount (`Executor.succeeded`), resolved and indexed as `set_up_now`
        does; a volume whose inputs changed since is refreshed, as `kick` asks."""
        self._executor.succeeded(mounted.name, "mount", seconds)
        self._actual.mark_mounted(mounted)
        volume = self._populator.resolve_csi_now(mounted.name)
        if volume is None or self._executor.is_pending(mounted.name):
            self.kick()
            return
        self._scope.index(volume)
        if mounted.inputs != self._operations.inputs(volume):
            self.kick()

    @property
    def passes(self) -> int:
        return self._passes

    def statistics(self) -> ReconcilerStatistics:
        return ReconcilerStatistics(passes=self._passes, store_generation=self._reconciled)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._follow_store)
            # Counted now: an operation the first pass starts may end before the task runs.
            nursery.start_soon(self._follow_executor, self._executor.finished)
            task_status.started()
            generation = self._store.generation
            while True:
                self._wakeup = trio.Event()
                changed = self._store.changed_since(generation)
                changes, generation = self._store.generation - generation, self._store.generation
                ended = self._operations.take_ended()
                if changed:
                    await self._refresh_first(changed)
                first = generation  # the changes up to here had their refresh first
                started = trio.current_time()
                content_only = self._scope.content_only(changed, ended)
                if not content_only:
                    self._populator.populate()
                candidates = self._scope.candidates(changed, changes, ended)
                if candidates is None:  # a full pass after all (a retry fell due, ...)
                    if content_only:
                        self._populator.populate()
                        content_only = False
                    self._scope.index_references()
                spent = trio.current_time() - started
                steps = self._reconcile_steps(candidates, all_steps=not content_only)
                for _ in steps:  # FUSE requests answered in between
                    spent += trio.current_time() - started
                    await trio.lowlevel.checkpoint()
                    started = trio.current_time()
                    if self._store.generation != first:  # an edit during the pass
                        changed = self._store.changed_since(first)
                        self._start_refresh_first(changed, self._refreshing)
                        first = self._store.generation
                self._pass_s = spent + trio.current_time() - started
                self._passes += 1
                self._reconciled = generation
                self._on_pass()
                retry_at = self._scope.passed(
                    full=candidates is None, next_retry_at=self._executor.next_retry_at()
                )
                deadline = min(trio.current_time() + self._resync_interval_s, retry_at)
                with trio.move_on_at(deadline) as waiting:
                    await self._wakeup.wait()
                if waiting.cancelled_caught:  # the resync, or a retry that is due
                    self._scope.want_full()

    def reconcile(self) -> None:
        for _ in self._reconcile_steps(None):
            pass

    def _reconcile_steps(
        self, candidates: list[VolumeToServe] | None, *, all_steps: bool = True
    ) -> Iterator[None]:
        """`reconcile()` in steps of `_STEP` volumes (the loop lets other tasks run between
        them: a pass over thousands of volumes takes milliseconds). Step (3) looks at the
        `candidates` only, if there are (`PassScope.candidates`); without `all_steps`, only step
        (3) is taken (`PassScope.content_only`)."""
        if all_steps:
            self.provision()  # (0)
            if self._populator.has_added_pods:
                self.unmount_orphans()  # (1)
            yield from self._serve_and_mount_steps()  # (2)
        yield from self._refresh_steps(candidates)  # (3)
        if all_steps and self._populator.has_added_pods:
            self.reclaim()  # (4)

    def provision(self) -> None:
        if self._provisioner is None:
            return
        for request in self._populator.claims_to_provision():
            claim = request.claim
            # `<provisioner>/<namespace>.<claim>`: one slash, as `agent_metrics.plugin_of` expects;
            # namespaces have no dots, so the name is unique.
            name = UniqueVolumeName(f"{PROVISIONER}/{claim.namespace}.{claim.name}")
            run = functools.partial(self._provisioner.provision, request)
            self._operations.start(name, "provision", run, inputs=request)

    def reclaim(self) -> None:
        if self._provisioner is None:
            return
        in_use = {v.spec_name for v in self._desired.volumes_to_serve() if v.plugin is Plugin.LOCAL}
        in_use |= {m.spec_name for m in self._actual.mounted_volumes() if m.plugin is Plugin.LOCAL}
        claims = {
            (pod.namespace, volume.source.claim_name)
            for pod in self._desired.pods()
            for volume in pod.volumes
            if isinstance(volume.source, PersistentVolumeClaimVolumeSource)
        }
        for pv in self._provisioner.to_reclaim(in_use=in_use, claims_in_use=claims):
            run = functools.partial(self._provisioner.reclaim, pv)
            name = UniqueVolumeName(f"{PROVISIONER}/{pv.name}")
            self._operations.start(name, "reclaim", run, inputs=pv)

    def unmount_orphans(self) -> None:
        for mounted in self._actual.mounted_volumes():
            if mounted.name not in self._desired:
                self._operations.start_unmount(mounted)

    def _serve_and_mount_steps(self) -> Iterator[None]:
        for i, volume in enumerate(self._desired.volumes_to_serve(), 1):
            if i % _STEP == 0:
                yield
            if self._executor.is_pending(volume.name):
                continue  # its inputs are not even computed: a pass during a storm of set-ups
            mounted = self._actual.get(volume.name)
            if mounted is None or mounted.state is MountState.UNCERTAIN:
                self._operations.start_mount(volume, self._operations.inputs(volume))

    async def _refresh_first(self, changed: tuple[ObjectKey, ...]) -> None:
        """Step (3) ahead of the pass for the shared subtrees built from `changed` objects, one
        volume each, waiting (a little) for those refreshes: a pass costs time in proportion to
        the node's volumes, which an edit of an object that 2000 pods use must not wait for."""
        started = self._start_refresh_first(changed, set())
        with trio.move_on_after(_FIRST_WAIT_S):
            while any(map(self._executor.is_pending, started)):
                await self._executor.wait_finished(self._executor.finished)

    def _start_refresh_first(
        self, changed: tuple[ObjectKey, ...], refreshing: set[bytes]
    ) -> list[UniqueVolumeName]:
        """Start the refreshes of `_refresh_first`, without waiting; the volumes whose refresh
        started. Also between two steps of a pass, for an edit that came during it, with the
        pass's `refreshing` (so that the other users of a subtree wait for this refresh); the
        next pass, which the edit asked for, looks at every volume built from the object."""
        started = []
        for volume in self._volumes.to_refresh_first(changed):
            if self._desired.get(volume.name) is volume and self._refresh_volume(
                volume, refreshing
            ):
                started.append(volume.name)
        return started

    def _refresh_steps(self, candidates: list[VolumeToServe] | None) -> Iterator[None]:
        """Step (3), for every volume or the `candidates`. A volume of a shared subtree waits
        while another of its users refreshes it (one per subtree per pass); once that one has
        published, the next pass finds the others current and records their new inputs."""
        volumes = self._desired.volumes_to_serve() if candidates is None else candidates
        self._refreshing = refreshing = {  # shared subtrees an operation is working on
            shared
            for volume in volumes
            if self._executor.is_pending(volume.name)
            and (shared := self._volumes.shared_subtree(volume)) is not None
        }
        for i, volume in enumerate(volumes, 1):
            if i % _STEP == 0:
                yield
            self._refresh_volume(volume, refreshing)

    def _refresh_volume(self, volume: VolumeToServe, refreshing: set[bytes]) -> bool:
        """Step (3) for one volume; True if it started a refresh. `refreshing`: the shared
        subtrees that a refresh works on (one added if this one starts)."""
        mounted = self._actual.get(volume.name)
        if (
            mounted is None
            or mounted.state is MountState.UNCERTAIN
            or self._executor.is_pending(volume.name)
        ):
            return False
        inputs = self._operations.inputs(volume)
        if inputs == mounted.inputs:
            return False
        failed = isinstance(inputs, FailedInputs)
        if not failed and self._volumes.is_current(volume, inputs):
            self._actual.mark_mounted(self._volumes.refreshed(mounted, inputs))
            return False
        shared = None if failed else self._volumes.shared_subtree(volume)
        if shared is not None and shared in refreshing:
            return False
        if not self._operations.start_refresh(volume, mounted, inputs):
            return False
        if shared is not None:
            refreshing.add(shared)
        return True

    async def unmount_all(self) -> None:
        """Tear down every volume, for a clean stop. The executor must be stopped already."""
        for mounted in self._actual.mounted_volumes():
            try:
                await self._operations.unmount(mounted)
            except Exception as exc:  # one volume's failure must not keep the others mounted
                log.error("unmount failed volume=%s error=%s", mounted.name, exc)

    async def _follow_store(self) -> None:
        generation = self._store.generation
        while True:
            await self._store.wait_changed(generation)
            generation = self._store.generation
            self._wakeup.set()  # a pass that may look only at what changed (`scope`)

    async def _follow_executor(self, finished: int) -> None:
        """A pass after operations end: their volumes may need the next step. A pass costs time
        in proportion to the volumes of the node, so passes for ending operations are spaced by
        `_SPACING` times the last pass's length (set-up of N volumes is N operations that end,
        and would be N passes of N volumes each); changes of the store are not delayed."""
        while True:
            await self._executor.wait_finished(finished)
            await trio.sleep(_SPACING * self._pass_s)
            finished = self._executor.finished
            self._wakeup.set()


_STEP = 50
"""Volumes a pass handles between two checkpoints."""
_FIRST_WAIT_S = 0.05
"""How long the pass waits for the refreshes `_refresh_first` started (they go on after)."""
_SPACING = 4.0
"""Passes for ending operations leave the trio thread to other work 4/5 of the time or more."""
