"""The composition root: the agent's components, built in dependency order, started in order,
stopped cleanly. Each concern lives in the module named for it: the components and their wiring
(fusevol.agent.components), when the agent is ready (fusevol.agent.readiness), the phases of the
agent's life (fusevol.agent.lifecycle), the lock (fusevol.agent.lock), the hand-over
(fusevol.agent.handover), systemd's notify protocol (fusevol.agent.sdnotify), the metrics wiring
(fusevol.observe.component_metrics); this module only starts and stops them.

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

import functools
import logging
import signal
from typing import TYPE_CHECKING

import trio

from fusevol.agent import sdnotify
from fusevol.agent.collector import collect_when_quiet
from fusevol.agent.components import Components
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
from fusevol.fuse.naming import ConnectionKey
from fusevol.fuse.servers import AUDIT, SERVERS
from fusevol.fuse.session import Connection, serve
from fusevol.node import layout
from fusevol.volumemanager.reconciler.reconstruct import (
    detach_dead_fuse_mounts,
    reconstruct,
    remove_pod_dirs,
    unmount_all_below,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from fusevol.base.settings import Settings
    from fusevol.volumemanager.cache.actual import MountedVolume

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 60.0
"""A stop gives up on unmounting after this long (a hung mount helper) and exits anyway."""


class Agent:
    """The agent: its components (fusevol.agent.components) started in order and stopped one of
    the two ways (module docstring). `run()` serves until cancelled."""

    def __init__(self, settings: Settings, *, launcher: Launcher | None = None) -> None:
        """`launcher`: the link to `fusevol run`'s launcher process, if this agent has one; only
        then does a handing-over stop keep serving as a lame duck (fusevol.agent.handover)."""
        self.settings = settings
        self.lifecycle = Lifecycle()
        """The agent's phase (fusevol.agent.lifecycle): every step of a stop is a transition."""
        self.components = Components(settings, launcher=launcher, lifecycle=self.lifecycle)
        self._launcher = launcher
        self._active = trio.CancelScope()
        """SERVING's scope: cancelled by `stop()`."""
        self._publisher_scope = trio.CancelScope()
        self._lame_duck = trio.CancelScope(shield=True)
        """LAME_DUCK's scope: shielded from the stop that began it, cancelled by SIGINT."""
        self._fuse_scope = trio.CancelScope(shield=True)
        """The FUSE server's: it outlives every other component, and stops last."""
        self._successor: trio.socket.SocketType | None = None
        """A successor that asked for our connection while we served (a rollout)."""
        self._connection: Connection | None = None
        """Our FUSE connection, once the launcher holds it too (`_connected`)."""
        self._holder_has_it = False
        """`fusevol hold` took duplicates of our connection when we offered them."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        root = self.settings.root
        components = self.components
        lock = await AgentLock.acquire(root, components.backend)  # (1)
        try:
            predecessor = await find_predecessor(layout.handover_socket(root))
            if components.take_over is None:  # else our predecessor's mount is alive: ours now
                await detach_dead_fuse_mounts(components.backend, root)  # (2)
            components.operations.key = ConnectionKey.for_connection(
                layout.fuse_key_file(root), fresh=components.take_over is None
            )
            found = reconstruct(root)
            for volume in found:
                components.actual.mark_mounted(volume)
            if components.manifest_recorder is not None:  # before any source:
                components.manifest_recorder.load()  # the PVs this node provisioned
            if components.take_over is None:  # (its stat would wait for our own FUSE server)
                layout.fuse_mountpoint(root).mkdir(parents=True, exist_ok=True)
            # The FUSE server must outlive every bind mount of it and the publisher's last rmdir,
            # so it is shielded from outside cancellation and stopped here, last.
            fuse_scope = self._fuse_scope
            async with trio.open_nursery() as fuse_nursery:
                await fuse_nursery.start(self._serve_fuse, fuse_scope)  # (3)
                components.backend.mount_points()  # the table learns our mount: pyfuse3 made it
                components.backend.start_helper()
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
                    components.readiness.not_ready()
                    try:
                        await self._stop(lock, predecessor)
                    finally:  # whatever failed above: the FUSE server must stop, or we never exit
                        fuse_scope.cancel()
                        fuse_nursery.cancel_scope.cancel()
        finally:
            lock.release()
            components.backend.close()
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
        components = self.components
        await nursery.start(components.executor.run)  # (4)
        await nursery.start(components.status.run)
        if self.settings.http.port >= 0:
            await nursery.start(components.http.run)
        nursery.start_soon(sdnotify.watchdog)
        nursery.start_soon(components.audit.run)
        api = components.api_statistics
        nursery.start_soon(
            functools.partial(
                collect_when_quiet,
                components.store,
                activity=(lambda: api().requests) if api else int,
            )
        )
        await nursery.start(components.source.run)  # (5)
        await nursery.start(components.reconciler.run)  # (6)
        if components.csi is not None:  # CSI node plugin: after the reconciler
            await nursery.start(components.csi.run)
            found = [*found, *components.csi.node.restored]  # a lame duck's too
        if predecessor is not None:
            release = functools.partial(
                release_once_set_up,
                predecessor,
                actual=components.actual,
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
        components.readiness.mark_ready()
        log.info("ready root=%s node=%s", root, self.settings.node_name)
        sdnotify.notify(sdnotify.READY)

    async def _find_frozen(self) -> None:
        """Frozen volumes (fusevol.observe.frozen), searched once the volumes found on the node
        are set up again (a container's bind is frozen only if no fresh bind covers it)."""
        with trio.move_on_after(RELEASE_WAIT_S):
            await self.components.actual.wait_certain()
        await self.components.frozen.run()

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
        if self.components.csi is not None:
            await self.components.csi.linger() if successor else await self.components.csi.linger(
                timeout_s=0
            )

    async def _tear_down(self, predecessor: Predecessor | None) -> None:
        """SIGINT's stop: every pod volume unmounted, the pod directories removed."""
        root = self.settings.root
        with trio.CancelScope(shield=True), trio.move_on_after(STOP_TIMEOUT_S):
            await self.components.reconciler.unmount_all()
            await unmount_all_below(self.components.backend, layout.pods_dir(root))
            await trio.to_thread.run_sync(remove_pod_dirs, layout.pods_dir(root))
            for server in SERVERS:  # their binds are gone
                if server is AUDIT and self.settings.audit.server != "agent":
                    continue  # another supervisor's (the chart's audit DaemonSet): it stays
                await trio.to_thread.run_sync(server.stop, root)
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
        self.components.readiness.not_ready()
        self._active.cancel()

    def end_lame_duck(self) -> None:
        """Stop serving as a lame duck now (SIGINT): the binds turn dead, as after a crash."""
        self._lame_duck.cancel()

    async def _run_publisher(self, *, task_status: trio.TaskStatus[None]) -> None:
        with self._publisher_scope:
            await self.components.publisher.run(task_status=task_status)

    async def _serve_fuse(
        self, scope: trio.CancelScope, *, task_status: trio.TaskStatus[None]
    ) -> None:
        mountpoint = layout.fuse_mountpoint(self.settings.root)
        with scope:
            try:
                self.lifecycle.fuse_started()
                await serve(
                    self.components.operations,
                    mountpoint,
                    max_tasks=self.settings.fuse.max_tasks,
                    unmount=lambda: not self.lifecycle.mount_handed_on,
                    take_over=self.components.take_over,
                    connected=self._connected,
                    task_status=task_status,
                )
            finally:
                self.lifecycle.fuse_stopped()

    def _connected(self, connection: Connection) -> None:
        """The kernel's INIT is answered: have the launcher keep the connection and our tree's
        state, so that a successor takes them over if we die (fusevol.agent.launcher)."""
        if self._launcher is None or self.components.journal is None:
            return
        self.components.journal.write_init(connection.init_request)
        self._launcher.hold(connection.fd, self.components.journal.fd)
        sdnotify.store_fds(FDNAME_FUSE, [connection.fd])  # under systemd: a kill -9 of the whole
        sdnotify.store_fds(FDNAME_STATE, [self.components.journal.fd])  # service keeps them too
        self._connection = connection
        log.info("FUSE connection held by the launcher: a crash of the agent fails no read")
        self._offer_to_holder()

    def descriptors(self) -> list[int]:
        """Our FUSE connection and state memfd, for whoever keeps them for a successor
        (fusevol.agent.handover.Transferable)."""
        assert self._connection is not None
        assert self.components.journal is not None
        return [self._connection.fd, self.components.journal.fd]

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
