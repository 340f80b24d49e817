"""What the agent's `/metrics` shows of its components (`fusevol.observe.component_metrics`): the
series the chart's alerts read (helm/fusevol/files/alerts.yaml) hold what their names say."""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any

import trio
from prometheus_client.parser import text_string_to_metric_families

from fusevol.base.errors import VolumeSetupError
from fusevol.decode.manifest import parse_manifest
from fusevol.kube.transport import UNANSWERED, ClientStatistics
from fusevol.model import ConfigMap, Pod, ResourceVersion, Secret
from fusevol.node.layout import Plugin, unique_volume_name
from fusevol.observe import component_metrics
from fusevol.observe.metrics import Metrics
from fusevol.volumemanager.cache.actual import ActualState
from fusevol.volumemanager.cache.desired import DesiredState, VolumeToServe
from fusevol.volumemanager.cache.store import ObjectStore
from fusevol.volumemanager.reconciler.executor import Executor

if TYPE_CHECKING:
    import pytest

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

POD = """\
kind: Pod
metadata: {name: web, namespace: team, uid: 00000000-0000-4000-8000-000000000001}
spec:
  containers: [{name: c}]
  volumes: [{name: config, configMap: {name: app}}]
"""


def samples(metrics: Metrics) -> Samples:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for sample in family.samples
    }


def registered(
    store: ObjectStore,
    desired: DesiredState,
    executor: Executor,
    *,
    ready: bool = True,
    api: ClientStatistics | None = None,
) -> Metrics:
    """The agent's metrics over these components (the FUSE tree and handlers stand-ins)."""
    metrics = Metrics()
    tree: Any = types.SimpleNamespace(statistics=lambda: types.SimpleNamespace(nodes=1))
    operations: Any = types.SimpleNamespace(requests={}, read_bytes=0)
    component_metrics.register(
        metrics,
        desired=desired,
        actual=ActualState(),
        store=store,
        tree=tree,
        operations=operations,
        executor=executor,
        ready=lambda: ready,
        api=None if api is None else lambda: api,
    )
    return metrics


def test_the_data_bytes_held_follow_the_objects() -> None:
    """`fusevol_object_data_bytes`: keys and values of ConfigMaps and Secrets, as they come, change
    and go (the least the agent's memory must hold for them)."""
    store = ObjectStore()
    version = ResourceVersion("1")
    store.upsert(ConfigMap("team", "app", version, {"a": b"xyz"}, {"bin": b"\0\0"}))
    store.upsert(Secret("team", "creds", version, {"é": b"12345"}))
    [pod] = parse_manifest(POD.encode(), origin="pod.yaml")
    assert isinstance(pod, Pod)
    store.upsert(pod)
    assert store.statistics().data_bytes == (1 + 3) + (3 + 2) + (2 + 5)
    store.upsert(ConfigMap("team", "app", ResourceVersion("2"), {"a": b"x"}))
    assert store.statistics().data_bytes == (1 + 1) + (2 + 5)
    store.delete(Secret("team", "creds", version).key)
    store.delete(pod.key)
    assert store.statistics().data_bytes == 2
    metrics = registered(store, DesiredState(), Executor(initial_backoff_s=1, max_backoff_s=2))
    assert samples(metrics)[("fusevol_object_data_bytes", ())] == 2


async def test_a_failing_volume_is_named_until_an_operation_succeeds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`fusevol_volume_failures`: the pod, its volume and the operation, with the failures in a
    row; gone once the volume's next operation succeeds."""
    [pod] = parse_manifest(POD.encode(), origin="pod.yaml")
    assert isinstance(pod, Pod)
    name = unique_volume_name(Plugin.CONFIG_MAP, pod.uid, "config")
    desired = DesiredState()
    desired.set_pod(
        pod, (VolumeToServe(name, Plugin.CONFIG_MAP, pod, pod.volumes[0], spec_name="config"),)
    )
    executor = Executor(initial_backoff_s=0.0, max_backoff_s=0.0)
    metrics = registered(ObjectStore(), desired, executor)
    labels = (("namespace", "team"), ("operation", "mount"), ("pod", "web"), ("volume", "config"))

    async def missing() -> None:
        raise VolumeSetupError('configmap "app" not found')

    async def found() -> None:
        pass

    async with trio.open_nursery() as nursery:
        await nursery.start(executor.run)
        assert not [key for key in samples(metrics) if key[0] == "fusevol_volume_failures"]
        for failures in (1, 2):
            done = executor.finished
            executor.start(name, "mount", missing)
            await executor.wait_finished(done)
            assert samples(metrics)[("fusevol_volume_failures", labels)] == failures
        done = executor.finished
        executor.start(name, "mount", found)
        await executor.wait_finished(done)
        assert not [key for key in samples(metrics) if key[0] == "fusevol_volume_failures"]
        nursery.cancel_scope.cancel()
    assert caplog.text.count("mount failed volume=") == 1  # then a repeated error: debug
    caplog.clear()


def test_readiness_and_the_api_servers_answers_by_code() -> None:
    """`fusevol_ready` is what /readyz answers; `rest_client_requests_total` counts the API
    server's answers by method and code, client-go's name and labels (`<error>`: no answer)."""
    api = ClientStatistics(
        connections=1,
        connections_made=2,
        streams=3,
        host="10.0.0.1:6443",
        responses=(("GET", "200", 7), ("GET", "403", 2), ("POST", UNANSWERED, 1)),
    )
    store, desired = ObjectStore(), DesiredState()
    executor = Executor(initial_backoff_s=1, max_backoff_s=2)
    shown = samples(registered(store, desired, executor, ready=False, api=api))
    assert shown[("fusevol_ready", ())] == 0
    host = ("host", "10.0.0.1:6443")
    assert shown[("rest_client_requests_total", (("code", "403"), host, ("method", "GET")))] == 2
    assert shown[("rest_client_requests_total", (("code", "200"), host, ("method", "GET")))] == 7
    unanswered = (("code", "<error>"), host, ("method", "POST"))
    assert shown[("rest_client_requests_total", unanswered)] == 1
    assert shown[("fusevol_api_connections", ())] == 1
    assert shown[("process_resident_memory_bytes", ())] > 0  # the process, as kubelet's
    assert samples(registered(store, desired, executor, ready=True))[("fusevol_ready", ())] == 1
