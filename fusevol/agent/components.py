"""The agent's components, built in dependency order and wired together: the half of the
composition root that constructs (fusevol.agent.app starts and stops what it builds).

Each component is handed, when it is built, the components it depends on, all built before it.
Where one must reach a component built after it (the frozen volumes have the status snapshot
written again, the reconciler's passes tell readiness, the HTTP and CSI servers ask the agent's
lifecycle, the metrics read the CSI node's failing volumes), it gets a callable that looks the
other up when it is called. Excludes: starting anything (no task, no socket; fusevol.agent.app),
and when the agent is ready (fusevol.agent.readiness).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from fusevol.agent.lifecycle import Phase
from fusevol.agent.readiness import Readiness
from fusevol.agent.source_setup import build_source
from fusevol.fuse import session, snapshot
from fusevol.fuse.ops import Operations
from fusevol.fuse.pins import Pins
from fusevol.fuse.publish import Publisher
from fusevol.model.audit import AuditLevel
from fusevol.mount.linux import LinuxMountBackend
from fusevol.node import layout
from fusevol.observe import component_metrics
from fusevol.observe.audit import AuditFollower
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
from fusevol.volumemanager.reconciler.auditing import Auditing
from fusevol.volumemanager.reconciler.executor import Executor
from fusevol.volumemanager.reconciler.loop import Reconciler
from fusevol.volumemanager.reconciler.volumes import Volumes

if TYPE_CHECKING:
    from fusevol.agent.launcher import Launcher
    from fusevol.agent.lifecycle import Lifecycle
    from fusevol.base.settings import Settings
    from fusevol.csi.server import CsiServer


class Components:
    """Every long-lived component of the agent, wired together (module docstring)."""

    def __init__(
        self, settings: Settings, *, launcher: Launcher | None, lifecycle: Lifecycle
    ) -> None:
        """`launcher`: the link to `fusevol run`'s launcher process, if the agent has one (the
        connection it hands over after a crash); `lifecycle`: the agent's phase."""
        root = settings.root
        self.backend = LinuxMountBackend(command_timeout_s=settings.mount.command_timeout_s)
        self.metrics = Metrics()
        self.store = ObjectStore()
        self.desired = DesiredState()
        self.actual = ActualState()
        self.tree, self.journal, self.take_over = snapshot.fuse_state(
            None if launcher is None else launcher.take_over, launched=launcher is not None
        )
        self.publisher = Publisher(
            self.tree,
            mountpoint=layout.fuse_mountpoint(root),
            grace_s=settings.fuse.old_version_grace_s,
            store_pages=session.store_pages,
            pins=Pins(settings.fuse.pinned_names),
        )
        if self.take_over is not None:
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
            auditing=Auditing(
                root=root,
                node_name=settings.node_name,
                default=AuditLevel.parse(settings.audit.default, where="--audit"),
                server=settings.audit.server,
                runtime_state=settings.audit.runtime_state,
                exists=lambda subtree: self.tree.child(self.tree.root, subtree) is not None,
            ),
        )
        built = build_source(settings, self.store)
        self.source = built.source
        self.api_statistics = built.api
        self.manifest_recorder = built.manifest_recorder
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
        self.audit = AuditFollower(
            root, stdout=settings.audit.stdout, changed=lambda: self.status.changed()
        )
        self.metrics.add_counter(
            "fusevol_audit_reads_total",
            "Opens of audited files, by the pod whose volume it is, the object and the key",
            ["namespace", "pod", "kind", "object", "key"],
            self.audit.counts,
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
            audited=self.audit.volumes,
            at_rest=self._tidy,
        )
        self.populator = Populator(
            store=self.store,
            desired=self.desired,
            provisioner=self.provisioner,
            annotations=KubeletAnnotations(
                ConfigSource.API if settings.kube is not None else ConfigSource.FILE,
                FirstSeen(path=layout.first_seen_file(root)),
            ),
            pod_volumes=settings.csi is None,  # CSI: what kubelet publishes, only
        )
        self.reconciler = Reconciler(
            store=self.store,
            populator=self.populator,
            desired=self.desired,
            actual=self.actual,
            executor=self.executor,
            volumes=self.volumes,
            resync_interval_s=settings.reconcile.resync_interval_s,
            on_pass=self._on_pass,
            on_volume_failed=self.source.volume_failed,
            provisioner=self.provisioner,
        )
        self.readiness = Readiness(
            store=self.store,
            reconciler=self.reconciler,
            lifecycle=lifecycle,
            ready_file=settings.http.ready_file,
        )
        self.http = HealthServer(
            host=settings.http.host,
            port=settings.http.port,
            metrics=self.metrics,
            healthy=lambda: lifecycle.fuse_up,
            ready=self.readiness.reconciled,
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
            executor=self.executor,
            ready=self.readiness.reconciled,
            frozen=self.frozen.gauges,
            failing=lambda: self.csi.node.failing() if self.csi is not None else [],
            api=built.api,
            pinned=lambda: self.publisher.statistics().pinned,
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
                handing_over=lambda: lifecycle.phase is Phase.HANDING_OVER,
                node=CsiNode(
                    records=layout.csi_records(root),
                    kubelet_dir=settings.csi.kubelet_dir,
                    node_name=settings.node_name,
                    store=self.store,
                    desired=self.desired,
                    actual=self.actual,
                    executor=self.executor,
                    volumes=self.volumes,
                    kick=self.reconciler.kick,
                    set_up_now=self.reconciler.set_up_now,
                    is_mount_point=self.backend.is_mount_point,
                    resolve=self.populator.resolve_csi,
                    adopt=self.reconciler.adopt,
                    prepare=not settings.csi.read_as_pod,
                    track=built.csi_track,
                    source_name=built.name,
                    request_tokens=settings.csi.token_requests,
                ),
                ready=lambda: lifecycle.fuse_up and self.readiness.reconciled(),
            )

    def statistics(self) -> dict[str, Any]:
        """Every component's counters, for the status snapshot."""
        statistics = {
            "fuse_tree": dataclasses.asdict(self.tree.statistics()),
            "publisher": dataclasses.asdict(self.publisher.statistics()),
            "executor": dataclasses.asdict(self.executor.statistics()),
            "store": dataclasses.asdict(self.store.statistics()),
            "source": dataclasses.asdict(self.source.statistics()),
            "reconciler": dataclasses.asdict(self.reconciler.statistics()),
        }
        if self.csi is not None:
            statistics["csi"] = dataclasses.asdict(self.csi.node.statistics())
        return statistics

    def _on_pass(self) -> None:
        """After each reconciler pass: the status snapshot is due, and the agent may be ready."""
        self.status.changed()
        self.readiness.mark_ready()

    def _tidy(self) -> None:
        """At rest (the status reporter's quiet times, while we reconcile): compact the journal."""
        if self.journal is not None:
            self.journal.tidy()

    def _subtree_name(self, readable: bytes) -> bytes:
        """A volume's subtree name, keyed with our connection's key (read before any volume is
        set up: `fusevol.agent.app.Agent.run`)."""
        key = self.operations.key
        return readable if key is None else key.subtree_name(readable)
