"""The composition root: builds every component in dependency order, starts them in order, stops
cleanly. Each concern lives in the module named for it: the phases of the agent's life
(fusevol.agent.lifecycle), the lock (fusevol.agent.lock), the hand-over (fusevol.agent.handover),
systemd's notify protocol (fusevol.agent.sdnotify), the metrics wiring
(fusevol.observe.component_metrics); this module only connects them.

Start-up order (each `nursery.start` returns once the component is ready):
    1. lock `<root>/fusevol/lock`, so two agents never share a root (a lame duck holds none), and
       look for a lame duck to release once our binds are stacked;
    2. detach the dead FUSE mounts a killed predecessor left, and rebuild the actual state from
       the pod volume directories on the node (reconstruct.py); load the PVs this node
       provisioned (provision/record.py; with the API source, kube/provisioned.py in 5);
    3. the FUSE mount, then the publisher that switches versions through it;
    4. the executor and the status reporter;
    5. the source (a manifest directory, or the Kubernetes API): returns after its complete
       initial read (the store is synced);
    6. the reconciler; then, if the connection can be taken over, the hand-over socket, where a
       successor started with `--replace` may ask for it (a rollout).
Two kinds of stop (`stop()`), each a path through the lifecycle's table:
- SIGTERM hands over (systemd's stop and restart, a deleted agent pod): the reconciler and the
  operations in flight are cancelled, but every pod volume stays mounted, as kubelet leaves
  running pods their volumes. Launched by `fusevol run` (fusevol/agent/launcher.py), the agent then
  serves on as a lame duck until the next agent has stacked its binds (fusevol/agent/handover.py),
  so that no read fails; without a launcher its binds turn dead when it exits, and the next agent
  stacks fresh ones on them (reconstruct.py), which containers see through propagation (README,
  "Restarts"). A successor's request while we serve (a rollout) is the same stop, but answered at
  once with our connection, and our launcher retires instead of exiting.
- SIGINT (Ctrl-C) and cancellation tear down in reverse: every pod volume is unmounted, then the
  FUSE mount goes. The FUSE server keeps answering until the last bind mount of it is gone, so no
  unmount waits on a dead server. `fusevol teardown` (fusevol/cli/teardown.py) does the same after a
  handing-over stop or a crash.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import signal
from typing import TYPE_CHECKING, Any

import trio

from fusevol.agent import sdnotify
from fusevol.agent.collector import collect_when_quiet
from fusevol.agent.handover import (
    RELEASE_WAIT_S,
    Predecessor,
    be_lame_duck,
    find_predecessor,
    give_connection,
    hear_successors,
    release_once_set_up,
)
from fusevol.agent.holder import offer
from fusevol.agent.launcher import FDNAME_FUSE, FDNAME_STATE, Launcher
from fusevol.agent.lifecycle import Lifecycle, Phase
from fusevol.agent.lock import AgentLock
from fusevol.agent.source_setup import build_source
from fusevol.fuse import follow_process, snapshot
from fusevol.fuse.naming import ConnectionKey
from fusevol.fuse.ops import Operations
from fusevol.fuse.publish import Publisher
from fusevol.fuse.session import Connection, serve
from fusevol.mount.linux import LinuxMountBackend
from fusevol.node import layout
from fusevol.observe import component_metrics
from fusevol.observe.auth import Authorizer
from fusevol.observe.frozen import FrozenVolumes
from fusevol.observe.http import HealthServer
from fusevol.observe.metrics import Metrics
from fusevol.observe.status import StatusReporter
from fusevol.projection.downward import node_allocatable
from fusevol.provision.hostpath import HostPathProvisioner
from fusevol.volumemanager.cache.actual import ActualState
from fusevol.volumemanager.cache.desired import DesiredState
from fusevol.volumemanager.cache.seen import FirstSeen
from fusevol.volumemanager.cache.store import ObjectStore
from fusevol.volumemanager.populator import ConfigSource, KubeletAnnotations, Populator
from fusevol.volumemanager.reconciler.executor import Executor
from fusevol.volumemanager.reconciler.loop import Reconciler
from fusevol.volumemanager.reconciler.reconstruct import (
    detach_dead_fuse_mounts,
    reconstruct,
    remove_pod_dirs,
    unmount_all_below,
)
from fusevol.volumemanager.reconciler.volumes import Volumes

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from fusevol.base.settings import Settings
    from fusevol.csi.server import CsiServer
    from fusevol.volumemanager.cache.actual import MountedVolume

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 60.0
"""A stop gives up on unmounting after this long (a hung mount helper) and exits anyway."""


class Agent:
    """Every long-lived component, wired together. `run()` serves until cancelled."""

    def __init__(self, settings: Settings, *, launcher: Launcher | None = None) -> None:
        """`launcher`: the link to `fusevol run`'s launcher process, if this agent has one; only
        then does a handing-over stop keep serving as a lame duck (fusevol.agent.handover)."""
        self.settings = settings
        root = settings.root
        self.backend = LinuxMountBackend(command_timeout_s=settings.mount.command_timeout_s)
        self.metrics = Metrics()
        self.store = ObjectStore()
        self.desired = DesiredState()
        self.actual = ActualState()
        self.tree, self._journal, self._take_over = snapshot.fuse_state(
            None if launcher is None else launcher.take_over, launched=launcher is not None
        )
        self.publisher = Publisher(
            self.tree,
            mountpoint=layout.fuse_mountpoint(root),
            grace_s=settings.fuse.old_version_grace_s,
        )
        if self._take_over is not None:
            self.publisher.adopt()
        self.operations = Operations(
            self.tree,
            is_agent=self.publisher.is_publisher,
            entry_timeout_s=settings.fuse.entry_timeout_s,
            attr_timeout_s=settings.fuse.attr_timeout_s,
        )
        self.executor = Executor(
            initial_backoff_s=settings.reconcile.initial_backoff_s,
            max_backoff_s=settings.reconcile.max_backoff_s,
            on_finished=component_metrics.operation_observer(self.metrics),
        )
        self.volumes = Volumes(
            root=root,
            store=self.store,
            publisher=self.publisher,
            backend=self.backend,
            allocatable=node_allocatable(settings.node_allocatable),
            observe_propagation=self.metrics.update_propagation.observe,
            git_timeout_s=settings.mount.git_timeout_s,
            subtree_names=self._subtree_name,
        )
        built = build_source(settings, self.store)
        self.source = built.source
        self._api_statistics = built.api
        self._manifest_recorder = built.manifest_recorder
        self.provisioner = HostPathProvisioner(
            root=root, node_name=settings.node_name, store=self.store, recorder=built.recorder
        )
        self.frozen = FrozenVolumes(
            root=root,
            kubelet_dir=settings.csi.kubelet_dir if settings.csi is not None else None,
            desired=self.desired,
            warn=self.source.volume_frozen,
            changed=lambda: self.status.changed(),
        )
        self.status = StatusReporter(
            root=root,
            node_name=settings.node_name,
            desired=self.desired,
            actual=self.actual,
            executor=self.executor,
            statistics=self.statistics,
            object_versions=self.volumes.object_versions,
            frozen=self.frozen.snapshot,
            at_rest=self._tidy,
        )
        self.reconciler = Reconciler(
            store=self.store,
            populator=Populator(
                store=self.store,
                desired=self.desired,
                provisioner=self.provisioner,
                annotations=KubeletAnnotations(
                    ConfigSource.API if settings.kube is not None else ConfigSource.FILE,
                    FirstSeen(path=layout.first_seen_file(root)),
                ),
                pod_volumes=settings.csi is None,  # CSI: what kubelet publishes, only
            ),
            desired=self.desired,
            actual=self.actual,
            executor=self.executor,
            volumes=self.volumes,
            resync_interval_s=settings.reconcile.resync_interval_s,
            on_pass=self._on_pass,
            on_volume_failed=self.source.volume_failed,
            provisioner=self.provisioner,
        )
        self.http = HealthServer(
            host=settings.http.host,
            port=settings.http.port,
            metrics=self.metrics,
            healthy=lambda: self.lifecycle.fuse_up,
            ready=self._reconciled,
            status=self.status.encoded,
            authorizer=Authorizer(node_name=settings.node_name, post=built.post)
            if settings.http.auth
            else None,
        )
        component_metrics.register(
            self.metrics,
            desired=self.desired,
            actual=self.actual,
            store=self.store,
            tree=self.tree,
            operations=self.operations,
            frozen=self.frozen.gauges,
            api=built.api,
        )
        # CSI node plugin (fusevol.csi): kubelet publishes volumes through the reconciler.
        self.csi: CsiServer | None = None
        if settings.csi is not None:
            from fusevol.csi.node import CsiNode
            from fusevol.csi.registration import registration_socket
            from fusevol.csi.server import CsiServer

            self.csi = CsiServer(
                endpoint=settings.csi.endpoint,
                registration=registration_socket(settings.csi.kubelet_dir)
                if settings.csi.register
                else None,
                handing_over=lambda: self.lifecycle.phase is Phase.HANDING_OVER,
                node=CsiNode(
                    state_path=layout.csi_file(root),
                    kubelet_dir=settings.csi.kubelet_dir,
                    node_name=settings.node_name,
                    store=self.store,
                    desired=self.desired,
                    actual=self.actual,
                    executor=self.executor,
                    volumes=self.volumes,
                    kick=self.reconciler.kick,
                    is_mount_point=self.backend.is_mount_point,
                    track=built.csi_track,
                    source_name=built.name,
                    request_tokens=settings.csi.token_requests,
                ),
                ready=lambda: self.lifecycle.fuse_up and self._reconciled(),
            )
        self.lifecycle = Lifecycle()
        """The agent's phase (fusevol.agent.lifecycle): every step of a stop is a transition."""
        self._launcher = launcher
        self._active = trio.CancelScope()
        """SERVING's scope: cancelled by `stop()`."""
        self._publisher_scope = trio.CancelScope()
        self._lame_duck = trio.CancelScope(shield=True)
        """LAME_DUCK's scope: shielded from the stop that began it, cancelled by SIGINT."""
        self._fuse_scope = trio.CancelScope(shield=True)
        """The FUSE server's: it outlives every other component, and stops last."""
        self._ready = False
        """The ready file was created (`_on_pass`)."""
        self._successor: trio.socket.SocketType | None = None
        """A successor that asked for our connection while we served (a rollout)."""
        self._connection: Connection | None = None
        """Our FUSE connection, once the launcher holds it too (`_connected`)."""
        self._holder_has_it = False
        """`fusevol hold` took duplicates of our connection when we offered them."""

    def statistics(self) -> dict[str, Any]:
        """Every component's counters, for the status snapshot."""
        return {
            "fuse_tree": dataclasses.asdict(self.tree.statistics()),
            "publisher": dataclasses.asdict(self.publisher.statistics()),
            "executor": dataclasses.asdict(self.executor.statistics()),
            "store": dataclasses.asdict(self.store.statistics()),
            "source": dataclasses.asdict(self.source.statistics()),
            "reconciler": dataclasses.asdict(self.reconciler.statistics()),
        }

    def _reconciled(self) -> bool:
        """Ready: the source has delivered everything once, and a reconciler pass acted on it."""
        return self.store.synced and self.reconciler.passes > 0

    def _on_pass(self) -> None:
        """After each reconciler pass: the status snapshot is due, and the agent may be ready."""
        self.status.changed()
        self._mark_ready()

    def _mark_ready(self) -> None:
        """Serving, with a reconciler pass done: the ready file says so (once)."""
        ready_file = self.settings.http.ready_file
        if (
            ready_file is not None
            and not self._ready
            and self.lifecycle.phase is Phase.SERVING
            and self._reconciled()
        ):
            self._ready = True
            ready_file.parent.mkdir(parents=True, exist_ok=True)
            ready_file.touch()

    def _not_ready(self) -> None:
        ready_file = self.settings.http.ready_file
        if ready_file is not None:
            ready_file.unlink(missing_ok=True)

    def _tidy(self) -> None:
        """At rest (the status reporter's quiet times, while we reconcile): compact the journal."""
        if self._journal is not None:
            self._journal.tidy()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        root = self.settings.root
        lock = await AgentLock.acquire(root, self.backend)  # (1)
        try:
            predecessor = await find_predecessor(layout.handover_socket(root))
            if self._take_over is None:  # else our predecessor's mount is alive: ours now
                await detach_dead_fuse_mounts(self.backend, root)  # (2)
            self.operations.key = ConnectionKey.for_connection(
                layout.fuse_key_file(root), fresh=self._take_over is None
            )
            found = reconstruct(root)
            for volume in found:
                self.actual.mark_mounted(volume)
            if self._manifest_recorder is not None:
                self._manifest_recorder.load()  # the PVs this node provisioned, before any source
            if self._take_over is None:  # (its stat would wait for our own FUSE server)
                layout.fuse_mountpoint(root).mkdir(parents=True, exist_ok=True)
            # The FUSE server must outlive every bind mount of it and the publisher's last rmdir,
            # so it is shielded from outside cancellation and stopped here, last.
            fuse_scope = self._fuse_scope
            async with trio.open_nursery() as fuse_nursery:
                await fuse_nursery.start(self._serve_fuse, fuse_scope)  # (3)
                self.backend.mount_points()  # the table learns our mount: pyfuse3 made it
                self.backend.start_helper()
                await fuse_nursery.start(self._run_publisher)
                try:
                    with self._active:
                        async with trio.open_nursery() as nursery:
                            await self._start(nursery, found, predecessor)
                            task_status.started()
                finally:
                    sdnotify.notify(sdnotify.STOPPING)
                    if not self.lifecycle.stopping:  # a failure, or a cancellation from outside
                        self.lifecycle.enter(Phase.TEARING_DOWN, "stopped without a signal")
                    self._not_ready()
                    try:
                        await self._stop(lock, predecessor)
                    finally:  # whatever failed above: the FUSE server must stop, or we never exit
                        fuse_scope.cancel()
                        fuse_nursery.cancel_scope.cancel()
        finally:
            lock.release()
            self.backend.close()
            if self._launcher is not None:
                self._launcher.close()

    async def _start(
        self,
        nursery: trio.Nursery,
        found: list[MountedVolume],
        predecessor: Predecessor | None,
    ) -> None:
        """Steps (4) to (6) in `nursery`, then SERVING: the agent is ready."""
        root = self.settings.root
        await nursery.start(self.executor.run)  # (4)
        await nursery.start(self.status.run)
        if self.settings.http.port >= 0:
            await nursery.start(self.http.run)
        nursery.start_soon(sdnotify.watchdog)
        api = self._api_statistics
        nursery.start_soon(
            functools.partial(
                collect_when_quiet, self.store, activity=(lambda: api().requests) if api else int
            )
        )
        await nursery.start(self.source.run)  # (5)
        await nursery.start(self.reconciler.run)  # (6)
        if self.csi is not None:  # CSI node plugin: after the reconciler
            await nursery.start(self.csi.run)
            found = [*found, *self.csi.node.restored]  # a lame duck's too
        if predecessor is not None:
            release = functools.partial(
                release_once_set_up,
                predecessor,
                actual=self.actual,
                found=[volume.name for volume in found],
            )
            nursery.start_soon(release)
        if self._launcher is not None and self._connection is not None:
            hear = functools.partial(
                hear_successors,
                layout.handover_socket(root),
                connection=self,
                on_request=self._successor_asks,
            )
            await nursery.start(hear)
            if not self._holder_has_it:  # a holder that started meanwhile asked nobody
                self._offer_to_holder()
        nursery.start_soon(self._find_frozen)  # binds of a connection we could not take over
        # A stop signal that came while the last `nursery.start` returned left no checkpoint to
        # deliver its cancellation of `_active`: this one does, before the agent says it serves.
        await trio.lowlevel.checkpoint()
        self.lifecycle.enter(Phase.SERVING, f"ready root={root}")
        self._mark_ready()
        log.info("ready root=%s node=%s", root, self.settings.node_name)
        sdnotify.notify(sdnotify.READY)

    async def _find_frozen(self) -> None:
        """Frozen volumes (fusevol.observe.frozen), searched once the volumes found on the node
        are set up again (a container's bind is frozen only if no fresh bind covers it)."""
        with trio.move_on_after(RELEASE_WAIT_S):
            await self.actual.wait_certain()
        await self.frozen.run()

    async def _stop(self, lock: AgentLock, predecessor: Predecessor | None) -> None:
        """HANDING_OVER or TEARING_DOWN, to the end: STOPPED, or LAME_DUCK first when launched."""
        if self.lifecycle.phase is Phase.TEARING_DOWN:
            await self._tear_down(predecessor)
            self._publisher_scope.cancel()
            self.lifecycle.enter(Phase.STOPPED, "pod volumes unmounted")
            return
        lock.mark_handing_over()
        log.info("handing over: pod volumes stay mounted for the next agent")
        self._publisher_scope.cancel()
        if self._launcher is None:
            await self._linger_csi(successor=False)
            self.lifecycle.enter(Phase.STOPPED, "no launcher: nothing answers for the pod binds")
            return
        if self._successor is not None:  # a rollout: the next agent is waiting for it
            self._let_go(lock, retire=True)
            await give_connection(self._successor, self)
            await self._linger_csi(successor=True)
            self.lifecycle.enter(Phase.STOPPED, "the next agent took the connection over")
            return
        outcome = False
        with self._lame_duck:
            outcome = await be_lame_duck(
                self.settings.root,
                let_go=lambda: self._let_go(lock),
                connection=self if self._connection else None,
            )
        await self._linger_csi(successor=outcome and not self._lame_duck.cancel_called)
        if self.lifecycle.phase is Phase.HANDING_OVER:
            why = "ended before it could let go"
        elif self._lame_duck.cancel_called:
            why = "SIGINT: no more waiting for a successor"
        else:
            why = "the next agent holds on" if outcome else "no successor came"
        self.lifecycle.enter(Phase.STOPPED, why)

    async def _linger_csi(self, *, successor: bool) -> None:
        """The CSI server outlives a handing-over stop until the `successor`'s replaces it,
        answering kubelet's Node calls through it meanwhile (fusevol.csi.server)."""
        if self.csi is not None:
            await self.csi.linger() if successor else await self.csi.linger(timeout_s=0)

    async def _tear_down(self, predecessor: Predecessor | None) -> None:
        """SIGINT's stop: every pod volume unmounted, the pod directories removed."""
        root = self.settings.root
        with trio.CancelScope(shield=True), trio.move_on_after(STOP_TIMEOUT_S):
            await self.reconciler.unmount_all()
            await unmount_all_below(self.backend, layout.pods_dir(root))
            await trio.to_thread.run_sync(remove_pod_dirs, layout.pods_dir(root))
            await trio.to_thread.run_sync(follow_process.stop, root)  # its views are gone
        if predecessor is not None:  # its binds went with ours
            with trio.CancelScope(shield=True):
                await predecessor.release()

    def _let_go(self, lock: AgentLock, *, retire: bool = False) -> None:
        """A lame duck's mountpoint is detached: release the lock and the launcher, which exits
        (or, `retire`, stays until it is stopped: a rollout's old generation)."""
        assert self._launcher is not None
        self.lifecycle.enter(Phase.LAME_DUCK, "lock released; answering FUSE for the pod binds")
        lock.release()
        self._launcher.detach(retire=retire)

    def _successor_asks(self, connection: trio.socket.SocketType) -> None:
        """A successor asked for our connection while we serve (a rollout): stop as on SIGTERM,
        and answer it once we are a lame duck (`_stop`)."""
        self._successor = connection
        self.stop(handover=True, why="the next agent asks for the FUSE connection")

    async def stop_reading(self) -> None:
        """Stop answering FUSE, for a successor that took our descriptors: what we read but did
        not answer, it gets again (fusevol.agent.handover.Transferable)."""
        self.lifecycle.enter(Phase.TRANSFERRING, "the next agent takes the FUSE connection over")
        self._fuse_scope.cancel()
        await self.lifecycle.wait_fuse_stopped()

    def stop(self, *, handover: bool, why: str) -> None:
        """Begin a stop: `handover` leaves the pod volumes mounted (and, if launched, keeps
        serving them as a lame duck until the next agent has stacked its binds)."""
        if self.lifecycle.stopping:  # a failure began one already
            log.info("stop on %s: already %s", why, self.lifecycle.phase.value)
            return
        self.lifecycle.enter(Phase.HANDING_OVER if handover else Phase.TEARING_DOWN, why)
        self._not_ready()
        self._active.cancel()

    def _subtree_name(self, readable: bytes) -> bytes:
        """A volume's subtree name, keyed with our connection's key (read before any volume is
        set up: `run`)."""
        key = self.operations.key
        return readable if key is None else key.subtree_name(readable)

    def end_lame_duck(self) -> None:
        """Stop serving as a lame duck now (SIGINT): the binds turn dead, as after a crash."""
        self._lame_duck.cancel()

    async def _run_publisher(self, *, task_status: trio.TaskStatus[None]) -> None:
        with self._publisher_scope:
            await self.publisher.run(task_status=task_status)

    async def _serve_fuse(
        self, scope: trio.CancelScope, *, task_status: trio.TaskStatus[None]
    ) -> None:
        mountpoint = layout.fuse_mountpoint(self.settings.root)
        with scope:
            try:
                self.lifecycle.fuse_started()
                await serve(
                    self.operations,
                    mountpoint,
                    max_tasks=self.settings.fuse.max_tasks,
                    unmount=lambda: not self.lifecycle.mount_handed_on,
                    take_over=self._take_over,
                    connected=self._connected,
                    task_status=task_status,
                )
            finally:
                self.lifecycle.fuse_stopped()

    def _connected(self, connection: Connection) -> None:
        """The kernel's INIT is answered: have the launcher keep the connection and our tree's
        state, so that a successor takes them over if we die (fusevol.agent.launcher)."""
        if self._launcher is None or self._journal is None:
            return
        self._journal.write_init(connection.init_request)
        self._launcher.hold(connection.fd, self._journal.fd)
        sdnotify.store_fds(FDNAME_FUSE, [connection.fd])  # under systemd: a kill -9 of the whole
        sdnotify.store_fds(FDNAME_STATE, [self._journal.fd])  # service keeps them too
        self._connection = connection
        log.info("FUSE connection held by the launcher: a crash of the agent fails no read")
        self._offer_to_holder()

    def descriptors(self) -> list[int]:
        """Our FUSE connection and state memfd, for whoever keeps them for a successor
        (fusevol.agent.handover.Transferable)."""
        assert self._connection is not None
        assert self._journal is not None
        return [self._connection.fd, self._journal.fd]

    def _offer_to_holder(self) -> None:
        """Give `fusevol hold`, if it runs on our root, duplicates of our connection: a deleted
        agent pod then costs readers a pause, not a dead volume (fusevol.agent.holder)."""
        self._holder_has_it = offer(self.settings.root, self.descriptors())
        if self._holder_has_it:
            log.info("FUSE connection held by fusevol hold: the agent's pod may go")


async def run_until_signalled(settings: Settings) -> None:
    """Run the agent until SIGTERM (then hand over) or SIGINT (then tear down); a SIGINT to a
    lame duck ends it at once."""
    agent = Agent(settings, launcher=Launcher.from_environment())
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_stop_on_signals, agent, signals)
            await agent.run()
            nursery.cancel_scope.cancel()


async def _stop_on_signals(agent: Agent, signals: AsyncIterator[int]) -> None:
    stopping = False
    async for signum in signals:
        if stopping:
            if signum == signal.SIGINT:
                log.info("SIGINT: no more waiting for a successor")
                agent.end_lame_duck()
            continue
        stopping = True
        handover = signum == signal.SIGTERM
        name = signal.Signals(signum).name
        log.info("stopping on %s: %s", name, "hand over" if handover else "tear down")
        agent.stop(handover=handover, why=name)
