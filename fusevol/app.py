"""The composition root: builds every component, starts them in dependency order, stops cleanly.

Start-up order (each `nursery.start` returns once the component is ready):
    1. lock `<root>/fusevol/lock`, so two agents never share a root (a lame duck holds none), and
       look for a lame duck to release once our binds are stacked;
    2. detach the dead FUSE mounts a killed predecessor left, and rebuild the actual state from
       the pod volume directories on the node (reconstruct.py); load the PVs this node
       provisioned (source/provisioned.py; the Kubernetes source reads them from the API in 5);
    3. the FUSE mount, then the publisher that switches versions through it;
    4. the executor and the status reporter;
    5. the source (a manifest directory, or the Kubernetes API): returns after its complete
       initial read (the store is synced);
    6. the reconciler.
Two kinds of stop (`stop()`):
- SIGTERM hands over (systemd's stop and restart, a DaemonSet rollout): the reconciler and the
  operations in flight are cancelled, but every pod volume stays mounted, as kubelet leaves
  running pods their volumes. Launched by `fusevol run` (fusevol/launcher.py), the agent then
  serves on as a lame duck until the next agent has stacked its binds (fusevol/handover.py), so
  that no read fails; without a launcher its binds turn dead when it exits, and the next agent
  stacks fresh ones on them (reconstruct.py), which containers see through propagation (README,
  "Restarts").
- SIGINT (Ctrl-C) and cancellation tear down in reverse: every pod volume is unmounted, then the
  FUSE mount goes. The FUSE server keeps answering until the last bind mount of it is gone, so no
  unmount waits on a dead server. `fusevol teardown` (`tear_down`) does the same after a
  handing-over stop or a crash.
"""

from __future__ import annotations

import collections
import dataclasses
import fcntl
import logging
import os
import signal
import socket
import time
from typing import TYPE_CHECKING, Any

import trio

from fusevol import layout
from fusevol.cache.actual import ActualState, MountedVolume, MountState
from fusevol.cache.desired import DesiredState
from fusevol.cache.store import ObjectStore
from fusevol.errors import FusevolError
from fusevol.fuse import snapshot
from fusevol.fuse.ops import Operations
from fusevol.fuse.publish import Publisher
from fusevol.fuse.session import Connection, can_take_over, serve
from fusevol.fuse.tree import Tree
from fusevol.handover import Predecessor, find_predecessor, serve_as_lame_duck
from fusevol.launcher import Launcher
from fusevol.metrics import Metrics
from fusevol.mount.linux import LinuxMountBackend
from fusevol.populator import Populator
from fusevol.projection.downward import node_allocatable
from fusevol.provision.hostpath import PROVISIONER, HostPathProvisioner
from fusevol.reconciler.executor import Executor
from fusevol.reconciler.loop import Reconciler
from fusevol.reconciler.reconstruct import (
    detach_dead_fuse_mounts,
    reconstruct,
    remove_pod_dirs,
    unmount_all_below,
)
from fusevol.reconciler.volumes import Volumes
from fusevol.server import HealthServer
from fusevol.source.local import ManifestSource
from fusevol.source.provisioned import ManifestVolumeRecorder
from fusevol.status import StatusReporter

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable
    from pathlib import Path

    from fusevol.cache.desired import VolumeToServe
    from fusevol.model import UniqueVolumeName
    from fusevol.provision.hostpath import VolumeRecorder
    from fusevol.settings import Settings
    from fusevol.source.kube.client import KubeClient
    from fusevol.source.kube.source import KubeSource

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 60.0
"""A stop gives up on unmounting after this long (a hung mount helper) and exits anyway."""
RELEASE_WAIT_S = 30.0
"""How long a new agent waits for its reconstructed volumes before it releases a lame duck."""
HANDING_OVER = "handing-over"
LOCK_WAIT_S = 10.0
"""How long a new agent waits for a dying predecessor (killed, not yet gone) to release the lock."""


class AgentAlreadyRunning(FusevolError):
    """Another agent holds the lock on the same root."""


class Agent:
    """Every long-lived component, wired together. `run()` serves until cancelled."""

    def __init__(self, settings: Settings, *, launcher: Launcher | None = None) -> None:
        """`launcher`: the link to `fusevol run`'s launcher process, if this agent has one; only
        then does a handing-over stop keep serving as a lame duck (fusevol.handover)."""
        self.settings = settings
        root = settings.root
        self.backend = LinuxMountBackend(command_timeout_s=settings.mount.command_timeout_s)
        self.metrics = Metrics()
        self.store = ObjectStore()
        self.desired = DesiredState()
        self.actual = ActualState()
        self.tree, self._journal, self._take_over = _fuse_state(launcher)
        self.operations = Operations(
            self.tree,
            is_agent=lambda pid: self.publisher.is_publisher(pid),
            entry_timeout_s=settings.fuse.entry_timeout_s,
            attr_timeout_s=settings.fuse.attr_timeout_s,
        )
        self.publisher = Publisher(
            self.tree,
            mountpoint=layout.fuse_mountpoint(root),
            grace_s=settings.fuse.old_version_grace_s,
        )
        if self._take_over is not None:
            self.publisher.adopt()
        self.executor = Executor(
            initial_backoff_s=settings.reconcile.initial_backoff_s,
            max_backoff_s=settings.reconcile.max_backoff_s,
            on_done=lambda: self.reconciler.kick(),
            on_finished=self._observe_operation,
        )
        self.volumes = Volumes(
            root=root,
            store=self.store,
            publisher=self.publisher,
            backend=self.backend,
            allocatable=node_allocatable(settings.node_allocatable),
            observe_propagation=self.metrics.update_propagation.observe,
            git_timeout_s=settings.mount.git_timeout_s,
        )
        self.status = StatusReporter(
            root=root,
            node_name=settings.node_name,
            desired=self.desired,
            actual=self.actual,
            executor=self.executor,
            statistics=self.statistics,
            object_versions=self.volumes.object_versions,
        )
        self.kube_client: KubeClient | None = None
        self.recorder: VolumeRecorder
        if settings.kube is not None:
            # Imported here: the kubernetes client takes 0.4 s to import, for nothing without it.
            from fusevol.source.kube.client import KubeClient
            from fusevol.source.kube.provisioned import KubeVolumeRecorder

            self.kube_client = KubeClient(kubeconfig=settings.kube.kubeconfig)
            self.recorder = KubeVolumeRecorder(
                client=self.kube_client, node_name=settings.node_name, provisioner=PROVISIONER
            )
        else:
            self.recorder = ManifestVolumeRecorder(
                path=layout.provisioned_file(root), store=self.store
            )
        self.provisioner = HostPathProvisioner(
            root=root, node_name=settings.node_name, store=self.store, recorder=self.recorder
        )
        self.reconciler = Reconciler(
            store=self.store,
            populator=Populator(
                store=self.store, desired=self.desired, provisioner=self.provisioner
            ),
            desired=self.desired,
            actual=self.actual,
            executor=self.executor,
            volumes=self.volumes,
            resync_interval_s=settings.reconcile.resync_interval_s,
            on_pass=self.status.changed,
            on_volume_failed=self._volume_failed,
            provisioner=self.provisioner,
        )
        self.kube_source: KubeSource | None = None
        self.source: ManifestSource | KubeSource
        if settings.kube is not None and self.kube_client is not None:
            from fusevol.source.kube.provisioned import KubeVolumeRecorder
            from fusevol.source.kube.source import KubeSource

            assert isinstance(self.recorder, KubeVolumeRecorder)
            self.source = self.kube_source = KubeSource(
                client=self.kube_client,
                node_name=settings.node_name,
                store=self.store,
                settings=settings.kube,
                recorder=self.recorder,
            )
        elif settings.manifests is not None:
            self.source = ManifestSource(
                directory=settings.manifests, node_name=settings.node_name, store=self.store
            )
        else:
            raise FusevolError("no source: give --manifests DIR or --kubeconfig PATH")
        self.http = HealthServer(
            host=settings.http.host,
            port=settings.http.port,
            metrics=self.metrics,
            healthy=lambda: self._fuse_up,
            ready=lambda: self.store.synced and self.reconciler.passes > 0,
            status=self.status.snapshot,
        )
        self._fuse_up = False
        self.handover = False
        """Set by `stop()`: leave the pod volumes mounted for the next agent."""
        self._launcher = launcher
        self._active = trio.CancelScope()
        self._publisher_scope = trio.CancelScope()
        self._lame_duck = trio.CancelScope(shield=True)
        self._detached = False
        """Our FUSE mountpoint was detached for the next agent: never unmount it on exit."""
        self._fuse_scope = trio.CancelScope(shield=True)
        self._connection: Connection | None = None
        """Our FUSE connection, once the launcher holds it too (`_connected`)."""
        self._register_metrics()

    def _register_metrics(self) -> None:
        def volumes_by_state() -> Iterable[tuple[dict[str, str], float]]:
            for state, names in (
                ("desired_state_of_world", [v.name for v in self.desired.volumes_to_serve()]),
                ("actual_state_of_world", [v.name for v in self.actual.mounted_volumes()]),
            ):
                for plugin, count in collections.Counter(map(_plugin_of, names)).items():
                    yield {"plugin_name": plugin, "state": state}, count

        self.metrics.add_gauge(
            "volume_manager_total_volumes",
            "Volumes in the desired and actual state of world",
            ["plugin_name", "state"],
            volumes_by_state,
        )
        self.metrics.add_counter(
            "fusevol_fuse_requests",
            "FUSE requests answered, by operation",
            ["operation"],
            lambda: (({"operation": op}, n) for op, n in self.operations.requests.items()),
        )
        self.metrics.add_counter(
            "fusevol_fuse_read_bytes",
            "Bytes read through the FUSE mount",
            [],
            lambda: [({}, self.operations.read_bytes)],
        )
        self.metrics.add_gauge(
            "fusevol_objects",
            "Objects held in memory, by kind",
            ["kind"],
            lambda: (
                ({"kind": kind}, n) for kind, n in self.store.statistics().objects_by_kind.items()
            ),
        )
        self.metrics.add_gauge(
            "fusevol_fuse_inodes",
            "Inodes of the FUSE file system (reachable or still known to the kernel)",
            [],
            lambda: [({}, self.tree.statistics().nodes)],
        )

    def _volume_failed(self, volume: VolumeToServe, error: str) -> None:
        if self.kube_source is not None:
            self.kube_source.events.failed_mount(volume.pod, volume.spec_name, error)

    def _observe_operation(
        self, name: UniqueVolumeName, operation: str, seconds: float, ok: bool
    ) -> None:
        kubelet_name = _OPERATION_NAMES.get(operation, "volume_mount")
        self.metrics.operation_duration.labels(
            _plugin_of(name), kubelet_name, "success" if ok else "fail-unknown"
        ).observe(seconds)

    def statistics(self) -> dict[str, Any]:
        """Every component's counters, for the status snapshot."""
        return {
            "fuse_tree": dataclasses.asdict(self.tree.statistics()),
            "publisher": dataclasses.asdict(self.publisher.statistics()),
            "executor": dataclasses.asdict(self.executor.statistics()),
            "store": dataclasses.asdict(self.store.statistics()),
            "source": dataclasses.asdict(self.source.statistics()),
        }

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        root = self.settings.root
        lock = await _AgentLock.acquire(layout.agent_dir(root) / "lock", self.backend, root)  # (1)
        try:
            predecessor = await find_predecessor(layout.handover_socket(root))
            if self._take_over is None:  # else our predecessor's mount is alive: ours now
                await detach_dead_fuse_mounts(self.backend, root)  # (2)
            found = reconstruct(root)
            for volume in found:
                self.actual.mark_mounted(volume)
            if isinstance(self.recorder, ManifestVolumeRecorder):
                self.recorder.load()  # the PVs this node provisioned, before any source
            layout.pods_dir(root).mkdir(parents=True, exist_ok=True)
            if self._take_over is None:  # (its stat would wait for our own FUSE server)
                layout.fuse_mountpoint(root).mkdir(parents=True, exist_ok=True)
            # The FUSE server must outlive every bind mount of it and the publisher's last rmdir,
            # so it is shielded from outside cancellation and stopped here, last.
            fuse_scope = self._fuse_scope
            async with trio.open_nursery() as fuse_nursery:
                await fuse_nursery.start(self._serve_fuse, fuse_scope)  # (3)
                await fuse_nursery.start(self._run_publisher)
                try:
                    with self._active:
                        async with trio.open_nursery() as nursery:
                            await nursery.start(self.executor.run)  # (4)
                            await nursery.start(self.status.run)
                            if self.settings.http.port >= 0:
                                await nursery.start(self.http.run)
                            nursery.start_soon(_watchdog)
                            await nursery.start(self.source.run)  # (5)
                            await nursery.start(self.reconciler.run)  # (6)
                            if predecessor is not None:
                                nursery.start_soon(self._release, predecessor, found)
                            log.info("ready root=%s node=%s", root, self.settings.node_name)
                            _sd_notify(b"READY=1")
                            task_status.started()
                finally:
                    _sd_notify(b"STOPPING=1")
                    try:
                        if self.handover:
                            lock.mark_handing_over()
                            log.info("handing over: pod volumes stay mounted for the next agent")
                        else:
                            await self._tear_down(predecessor)
                        self._publisher_scope.cancel()
                        if self.handover and self._launcher is not None:
                            with self._lame_duck:
                                await self._serve_as_lame_duck(lock)
                    finally:  # whatever failed above: the FUSE server must stop, or we never exit
                        fuse_scope.cancel()
                        fuse_nursery.cancel_scope.cancel()
        finally:
            lock.release()
            if self._launcher is not None:
                self._launcher.close()

    async def _tear_down(self, predecessor: Predecessor | None) -> None:
        """SIGINT's stop: every pod volume unmounted, the pod directories removed."""
        root = self.settings.root
        with trio.CancelScope(shield=True), trio.move_on_after(STOP_TIMEOUT_S):
            await self.reconciler.unmount_all()
            await unmount_all_below(self.backend, layout.pods_dir(root))
            await trio.to_thread.run_sync(remove_pod_dirs, layout.pods_dir(root))
        if predecessor is not None:  # its binds went with ours
            with trio.CancelScope(shield=True):
                await predecessor.release()

    def stop(self, *, handover: bool) -> None:
        """Begin a stop: `handover` leaves the pod volumes mounted (and, if launched, keeps
        serving them as a lame duck until the next agent has stacked its binds)."""
        self.handover = handover
        self._active.cancel()

    def end_lame_duck(self) -> None:
        """Stop serving as a lame duck now (SIGINT): the binds turn dead, as after a crash."""
        self._lame_duck.cancel()

    async def _run_publisher(self, *, task_status: trio.TaskStatus[None]) -> None:
        with self._publisher_scope:
            await self.publisher.run(task_status=task_status)

    async def _serve_as_lame_duck(self, lock: _AgentLock) -> None:
        """fusevol.handover: keep answering FUSE for the pod binds until the next agent has
        stacked its own. Our mountpoint is detached lazily (no abort: the pod binds keep the
        connection), so the successor mounts afresh at the same place."""
        assert self._launcher is not None
        mountpoint = layout.fuse_mountpoint(self.settings.root)
        async with trio.open_nursery() as nursery:
            outcome: list[bool] = []

            async def listen(*, task_status: trio.TaskStatus[None]) -> None:
                path = layout.handover_socket(self.settings.root)
                outcome.append(
                    await serve_as_lame_duck(
                        path,
                        hand_over=self._hand_over if self._connection is not None else None,
                        task_status=task_status,
                    )
                )

            await nursery.start(listen)
            if self._connection is None:  # else the successor takes our mount over as it is
                await trio.run_process(["umount", "--lazy", str(mountpoint)], check=False)
                self._detached = True
            lock.release()
            self._launcher.detach()
            log.info(
                "lame duck: serving pod volumes until the next agent %s",
                "takes the connection over" if self._connection else "has stacked its binds",
            )
        log.info(
            "lame duck done: %s",
            "the next agent took over" if outcome == [True] else "no successor",
        )

    async def _hand_over(self) -> list[int]:
        """Stop answering FUSE (what we read but did not answer, the successor gets again) and
        return our connection's descriptors for the successor (fusevol.handover)."""
        assert self._connection is not None
        assert self._journal is not None
        self._detached = True  # the mount is the successor's now: never unmount it
        fuse_fd = os.dup(self._connection.fd)  # pyfuse3 closes its own as it stops
        self._fuse_scope.cancel()
        while self._fuse_up:  # noqa: ASYNC110 - a few ms: the FUSE tasks end at once
            await trio.sleep(0.001)
        log.info("handing the FUSE connection over to the next agent")
        return [fuse_fd, self._journal.fd]

    async def _release(self, predecessor: Predecessor, found: list[MountedVolume]) -> None:
        """Tell the lame duck we hold every volume we found on the node (set up again, or torn
        down), or that we gave up waiting: it may exit."""
        names = [volume.name for volume in found]

        def uncertain() -> int:
            return sum(
                1
                for name in names
                if (volume := self.actual.get(name)) is not None
                and volume.state is MountState.UNCERTAIN
            )

        with trio.move_on_after(RELEASE_WAIT_S):
            while uncertain():  # noqa: ASYNC110 - set-ups mark no event; a 10 ms poll is cheap
                await trio.sleep(0.01)
        if uncertain():
            log.warning("releasing the previous agent with %d volumes not set up", uncertain())
        await predecessor.release()
        log.info("previous agent released: our binds are stacked on its")

    async def _serve_fuse(
        self, scope: trio.CancelScope, *, task_status: trio.TaskStatus[None]
    ) -> None:
        mountpoint = layout.fuse_mountpoint(self.settings.root)
        with scope:
            try:
                self._fuse_up = True
                await serve(
                    self.operations,
                    mountpoint,
                    max_tasks=self.settings.fuse.max_tasks,
                    unmount=lambda: not self._detached,
                    take_over=self._take_over,
                    connected=self._connected,
                    task_status=task_status,
                )
            finally:
                self._fuse_up = False

    def _connected(self, connection: Connection) -> None:
        """The kernel's INIT is answered: have the launcher keep the connection and our tree's
        state, so that a successor takes them over if we die (fusevol.launcher)."""
        if self._launcher is None or self._journal is None:
            return
        self._journal.write_init(connection.init_request)
        self._launcher.hold(connection.fd, self._journal.fd)
        self._connection = connection
        log.info("FUSE connection held by the launcher: a crash of the agent fails no read")


def _fuse_state(
    launcher: Launcher | None,
) -> tuple[Tree, snapshot.Journal | None, Connection | None]:
    """The FUSE tree, the journal of its state kept for a successor (launched agents only), and
    the connection to take over if the launcher restarted us after a crash."""
    if launcher is None or not can_take_over():
        return Tree(), None, None
    if launcher.take_over is None:
        tree = Tree()
        return tree, snapshot.Journal.create(tree), None
    fuse_fd, state_fd = launcher.take_over
    restored = snapshot.restore(state_fd)
    if restored.init_request is None:
        raise FusevolError("the FUSE state handed over has no INIT request")
    stats = restored.tree.statistics()
    log.info("taking the FUSE connection over inodes=%d", stats.nodes)
    return restored.tree, restored.journal, Connection(fuse_fd, restored.init_request)


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
        log.info(
            "stopping on %s: %s",
            signal.Signals(signum).name,
            "hand over" if handover else "tear down",
        )
        agent.stop(handover=handover)


async def tear_down(root: Path, *, command_timeout_s: float) -> int:
    """`fusevol teardown`: what SIGINT's stop does last, for a root no agent runs on (after a
    handing-over stop, or a crash): unmount every pod volume (a lame duck's, live, or dead ones),
    remove the pod directories, detach a dead FUSE mount, and let a lame duck go. Refused while
    an agent runs. Returns the number of mounts removed."""
    backend = LinuxMountBackend(command_timeout_s=command_timeout_s)
    lock = await _AgentLock.acquire(layout.agent_dir(root) / "lock", backend, root)
    try:
        predecessor = await find_predecessor(layout.handover_socket(root))
        removed = await unmount_all_below(backend, layout.pods_dir(root))
        await trio.to_thread.run_sync(remove_pod_dirs, layout.pods_dir(root))
        removed += await detach_dead_fuse_mounts(backend, root)
        if predecessor is not None:  # its binds are gone: nothing left to serve
            await predecessor.release()
        return removed
    finally:
        lock.release()


class _AgentLock:
    """An exclusive lock on `<root>/fusevol/lock` (our pid written in it): exactly one agent
    reconciles a root at a time. A lame duck has released it (fusevol.handover).

    A predecessor that was killed may still hold it for a moment while it dies; one stuck on a
    request to its own FUSE mount would hold it forever, so its connection is aborted (which
    frees it) and the lock waited for, up to LOCK_WAIT_S, as it is for an agent that is handing
    over (`mark_handing_over`). A live agent is refused at once."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    @classmethod
    async def acquire(cls, path: Path, backend: LinuxMountBackend, root: Path) -> _AgentLock:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            deadline = time.monotonic() + LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    holder, handing_over = _read_holder(fd)
                    waiting = handing_over or _is_dying(holder)
                    if not waiting or time.monotonic() > deadline:
                        raise AgentAlreadyRunning(
                            f"another fusevol agent is using {path}"
                            + (f" (pid {holder})" if holder else "")
                        ) from None
                    log.info("waiting for the previous agent to let go pid=%s", holder)
                    if not handing_over:  # killed: free it if it is stuck on its own mount
                        await backend.unmount(layout.fuse_mountpoint(root), force=True)
                    await trio.sleep(0.05)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd)

    def mark_handing_over(self) -> None:
        """Say in the lock file that we are letting go: a successor started meanwhile waits for
        the lock instead of being refused."""
        if self._fd is not None:
            os.pwrite(self._fd, f"{os.getpid()} {HANDING_OVER}\n".encode(), 0)

    def release(self) -> None:
        """Release the lock (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _read_holder(fd: int) -> tuple[int | None, bool]:
    """(the lock holder's pid, whether it is handing over) from the lock file."""
    pid, _, state = os.pread(fd, 64, 0).decode(errors="replace").strip().partition(" ")
    return (int(pid) if pid.isdigit() else None), state == HANDING_OVER


def _is_dying(pid: int | None) -> bool:
    """True if process `pid` is gone, a zombie, or has SIGKILL pending (/proc/PID/status)."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":\t", 1) for line in f if ":\t" in line)
    except (FileNotFoundError, ProcessLookupError):
        return True
    if fields.get("State", "").startswith(("Z", "X")):
        return True
    sigkill = 1 << (signal.SIGKILL - 1)
    return any(int(fields.get(k, "0"), 16) & sigkill for k in ("SigPnd", "ShdPnd"))


_OPERATION_NAMES = {"unmount": "volume_unmount", "provision": "provision", "reclaim": "delete"}
"""fusevol's operations by the names kubelet and the PV controller give theirs in
`storage_operation_duration_seconds` (every other operation is a `volume_mount`)."""


def _plugin_of(name: str) -> str:
    """`kubernetes.io/configmap/<uid>-<name>` -> `kubernetes.io/configmap`."""
    return name.rsplit("/", 1)[0]


async def _watchdog() -> None:
    """Tell systemd we are alive at half its WatchdogSec, from the trio loop: a loop that froze
    stops the pings, and systemd restarts the agent. No-op outside such a unit."""
    usec = os.environ.get("WATCHDOG_USEC")
    if not usec or os.environ.get("WATCHDOG_PID", str(os.getpid())) != str(os.getpid()):
        return
    while True:
        _sd_notify(b"WATCHDOG=1")
        await trio.sleep(int(usec) / 2e6)


def _sd_notify(message: bytes) -> None:
    """Tell systemd (Type=notify) about our state; no-op outside systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.sendto(message, address)
