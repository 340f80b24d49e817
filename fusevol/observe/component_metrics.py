"""What the agent's components tell Prometheus: the gauges and counters read on every scrape,
and the operation durations the executor reports. `fusevol.observe.metrics` holds the registry and
the metric types; this module only connects the components to them."""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from fusevol.fuse.ops import Operations
    from fusevol.fuse.tree import Tree
    from fusevol.kube.transport import ClientStatistics
    from fusevol.model import UniqueVolumeName
    from fusevol.observe.metrics import Metrics
    from fusevol.volumemanager.cache.actual import ActualState
    from fusevol.volumemanager.cache.desired import DesiredState
    from fusevol.volumemanager.cache.store import ObjectStore
    from fusevol.volumemanager.reconciler.executor import Executor

_OPERATION_NAMES = {"unmount": "volume_unmount", "provision": "provision", "reclaim": "delete"}
"""fusevol's operations by the names kubelet and the PV controller give theirs in
`storage_operation_duration_seconds` (every other operation is a `volume_mount`)."""


def register(
    metrics: Metrics,
    *,
    desired: DesiredState,
    actual: ActualState,
    store: ObjectStore,
    tree: Tree,
    operations: Operations,
    executor: Executor,
    ready: Callable[[], bool] = lambda: False,
    frozen: Callable[[], Iterable[tuple[dict[str, str], float]]] = list,
    failing: Callable[[], Iterable[tuple[dict[str, str], float]]] = list,
    api: Callable[[], ClientStatistics] | None = None,
    pinned: Callable[[], int] = lambda: 0,
) -> None:
    """Add the gauges and counters that are read from the components on every scrape;
    `ready()`: what `/readyz` answers; `frozen()`: `fusevol_frozen_volumes`
    (`fusevol.observe.frozen`); `failing()`: the failing volumes no state of the volume manager
    holds (the CSI node's failed first publishes, `fusevol.csi.node`); `api()`: the API client's
    connections, streams and answers (with the API source); `pinned()`: the names whose kernel
    entries are kept (`fusevol.fuse.pins`)."""

    def volumes_by_state() -> Iterable[tuple[dict[str, str], float]]:
        for state, names in (
            ("desired_state_of_world", [v.name for v in desired.volumes_to_serve()]),
            ("actual_state_of_world", [v.name for v in actual.mounted_volumes()]),
        ):
            for plugin, count in collections.Counter(map(plugin_of, names)).items():
                yield {"plugin_name": plugin, "state": state}, count

    metrics.add_gauge(
        "volume_manager_total_volumes",
        "Volumes in the desired and actual state of world",
        ["plugin_name", "state"],
        volumes_by_state,
    )
    metrics.add_gauge(
        "fusevol_ready",
        "1 once the agent is ready (/readyz answers 200): its source was read completely and a"
        " reconciler pass acted on it",
        [],
        lambda: [({}, float(ready()))],
    )
    metrics.add_gauge(
        "fusevol_volume_failures",
        "Pod volumes whose last operation failed, by pod: how many times in a row (kept until"
        " one succeeds); operation mount (set-up) or refresh (update)",
        ["namespace", "pod", "volume", "operation"],
        lambda: [*failing_volumes(desired, executor), *failing()],
    )
    metrics.add_gauge(
        "fusevol_frozen_volumes",
        "Pod volumes bound to a FUSE connection no agent serves, by pod: the containers reading"
        " them (1 where the agent cannot see them)",
        ["namespace", "pod", "volume"],
        frozen,
    )
    metrics.add_counter(
        "fusevol_fuse_requests",
        "FUSE requests answered, by operation",
        ["operation"],
        lambda: (({"operation": op}, n) for op, n in operations.requests.items()),
    )
    metrics.add_counter(
        "fusevol_fuse_read_bytes",
        "Bytes read through the FUSE mount",
        [],
        lambda: [({}, operations.read_bytes)],
    )
    metrics.add_gauge(
        "fusevol_objects",
        "Objects held in memory, by kind",
        ["kind"],
        lambda: (({"kind": kind}, n) for kind, n in store.statistics().objects_by_kind.items()),
    )
    metrics.add_gauge(
        "fusevol_object_data_bytes",
        "Bytes of the ConfigMaps' and Secrets' keys and values held: the least the agent's"
        " memory must hold for its objects",
        [],
        lambda: [({}, store.statistics().data_bytes)],
    )
    metrics.add_gauge(
        "fusevol_fuse_inodes",
        "Inodes of the FUSE file system (reachable or still known to the kernel)",
        [],
        lambda: [({}, tree.statistics().nodes)],
    )
    metrics.add_gauge(
        "fusevol_fuse_pinned_names",
        "Served names whose kernel entries are kept, so that a read after the kernel dropped"
        " its caches costs one request",
        [],
        lambda: [({}, pinned())],
    )
    if api is not None:
        metrics.add_gauge(
            "fusevol_api_connections",
            "HTTP/2 connections to the API server open now",
            [],
            lambda: [({}, api().connections)],
        )
        metrics.add_counter(
            "fusevol_api_connections_made",
            "HTTP/2 connections to the API server made (or tried) since the start",
            [],
            lambda: [({}, api().connections_made)],
        )
        metrics.add_gauge(
            "fusevol_api_streams",
            "Requests and watches open now on the connections to the API server",
            [],
            lambda: [({}, api().streams)],
        )

        def responses() -> Iterable[tuple[dict[str, str], float]]:
            stats = api()
            for method, code, n in stats.responses:
                yield {"code": code, "host": stats.host, "method": method}, n

        metrics.add_counter(
            "rest_client_requests",
            "Requests to the API server, by method and status code (<error>: no answer), as"
            " client-go counts them",
            ["code", "host", "method"],
            responses,
        )


def failing_volumes(
    desired: DesiredState, executor: Executor
) -> list[tuple[dict[str, str], float]]:
    """`fusevol_volume_failures`: each wanted pod volume whose last operation failed, with the
    failures in a row (the executor keeps them until an operation succeeds)."""
    out = []
    for volume in desired.volumes_to_serve():
        status = executor.status(volume.name)
        if status is None or not status.failures:
            continue
        labels = {
            "namespace": volume.pod.namespace,
            "pod": volume.pod.name,
            "volume": volume.spec_name or volume.volume.name,
            "operation": status.operation,
        }
        out.append((labels, float(status.failures)))
    return out


def operation_observer(
    metrics: Metrics,
) -> Callable[[UniqueVolumeName, str, float, bool], None]:
    """The executor's `on_finished`: kubelet's `storage_operation_duration_seconds`."""

    def observe(name: UniqueVolumeName, operation: str, seconds: float, ok: bool) -> None:
        kubelet_name = _OPERATION_NAMES.get(operation, "volume_mount")
        metrics.operation_duration.labels(
            plugin_of(name), kubelet_name, "success" if ok else "fail-unknown"
        ).observe(seconds)

    return observe


def plugin_of(name: str) -> str:
    """`kubernetes.io/configmap/<uid>-<name>` -> `kubernetes.io/configmap`."""
    return name.rsplit("/", 1)[0]
