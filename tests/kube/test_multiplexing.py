"""The agent's API traffic over few HTTP/2 connections: watches are streams, not connections.

kubelet watches each ConfigMap and Secret its pods use one by one, as streams of one HTTP/2
connection (client-go). The loopback API server speaks HTTP/2 as kube-apiserver does and counts
the TCP connections it accepts and the streams each carries, so these tests fail on an agent
that opens a connection per watch, on one that ignores the server's limit of concurrent streams
(the server's HTTP/2 layer treats that as the protocol error it is), and on a restart of the API
server that brings the watches back on more than one new connection, all at the same instant, or
only as their own backoffs, grown while it was away, run out.
The agent's threads are counted in the agent process (a thread per watch is the old design).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from fusevol.kube.client import KubeClient
from fusevol.kube.errors import ApiError
from fusevol.model import ConfigMap, Kind, ObjectKey
from fusevol.source.kube import objects
from fusevol.source.kube.objects import WatchedObjects
from fusevol.volumemanager.cache.store import ObjectStore
from tests.agent import wait_for
from tests.helpers.apiserver import ApiServer, running_apiserver
from tests.kube.conftest import configmap, configmap_volume, pod

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.agent import AgentProcess

PODS = 250
"""Each with a ConfigMap and a Secret of its own: 500 watched objects."""
OTHER_WATCHES = 3
"""The node's pods, the PVs it provisioned, the claims selected for it."""
MAX_THREADS = 64


def secret(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"kind": "Secret", "metadata": {"name": name}, "stringData": data}


def uid(i: int) -> str:
    return f"cccccccc-0000-4000-8000-{i:012d}"


def populate(api: ApiServer, pods: int) -> None:
    for i in range(pods):
        api.create(configmap(f"cm-{i}", {"a": f"{i}"}))
        api.create(secret(f"s-{i}", {"k": f"{i}"}))
        volumes = [
            configmap_volume("config", f"cm-{i}"),
            {"name": "creds", "secret": {"secretName": f"s-{i}"}},
        ]
        api.create(pod(f"p-{i}", uid(i), volumes=volumes))


def threads(agent: AgentProcess) -> int:
    with open(f"/proc/{agent.pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


def all_mounted(agent: AgentProcess, pods: int) -> bool:
    states = [v["state"] for p in agent.snapshot()["pods"] for v in p["volumes"]]
    return len(states) == 2 * pods and set(states) == {"mounted"}


@pytest.fixture
def many_watches_api(request: pytest.FixtureRequest) -> Iterator[ApiServer]:
    with running_apiserver(max_streams=request.param) as server:
        populate(server, PODS)
        yield server


@pytest.mark.parametrize(
    "many_watches_api",
    [
        pytest.param(1000, id="1000-streams"),  # --http2-max-streams-per-connection=1000
        pytest.param(250, id="250-streams"),  # kube-apiserver's default
    ],
    indirect=True,
)
def test_500_watched_objects_are_streams_of_as_few_connections_as_the_server_allows(
    many_watches_api: ApiServer, tmp_path: Path, kube_agent_on: Any
) -> None:
    api = many_watches_api
    with kube_agent_on(api) as agent:
        watches = 2 * PODS + OTHER_WATCHES
        wait_for(lambda: len(api.open_watches()) == watches, timeout_s=120)
        wait_for(lambda: all_mounted(agent, PODS), timeout_s=120)
        # An edit still arrives on its stream among 500 others.
        api.update(configmap("cm-7", {"a": "edited"}))
        key = agent.volume(uid(7), "configmap", "config") / "a"
        wait_for(lambda: key.read_text() == "edited", timeout_s=10)
        connections = api.connections()
        stats = agent.live_statistics()["source"]["api"]
        agent_threads = threads(agent)
        metrics = {
            sample.name: sample.value
            for family in text_string_to_metric_families(agent.http_get("/metrics")[1])
            for sample in family.samples
            if sample.name.startswith("fusevol_api_")
        }
    print(
        f"max_streams={api.max_streams}: {watches} watches over {connections} connection(s), "
        f"at most {api.max_streams_seen} streams on one; agent threads {agent_threads}"
    )
    assert api.protocol_errors == []  # the server's stream limit was respected
    if api.max_streams >= watches + 64:  # room for every watch and the requests in flight
        assert connections <= 2
        assert api.max_streams_seen >= watches  # all of them on one connection
    else:  # ceil(streams / limit), the requests in flight (at most 64) included
        assert connections <= math.ceil((watches + 64) / api.max_streams)
        assert api.max_streams_seen == api.max_streams
    assert stats["connections_made"] == connections
    assert agent_threads <= MAX_THREADS
    assert metrics["fusevol_api_connections"] == connections
    assert metrics["fusevol_api_connections_made_total"] == connections
    assert watches <= metrics["fusevol_api_streams"] <= watches + 64


AWAY_S = 4.0
"""How long the restarted API server is away: the reflectors' own backoff grows to 3.2-6.4 s."""


def test_an_api_server_restart_brings_every_watch_back_over_one_connection_jittered(
    tmp_path: Path, kube_agent_on: Any
) -> None:
    pods = 50
    with running_apiserver() as api:
        populate(api, pods)
        with kube_agent_on(api) as agent:
            agent.expect_log("API server unreachable", "http2 connection lost")
            watches = 2 * pods + OTHER_WATCHES
            wait_for(lambda: len(api.open_watches()) == watches, timeout_s=60)
            wait_for(lambda: all_mounted(agent, pods), timeout_s=60)
            before, requests = api.connections(), len(api.requests)
            fetched = agent.live_statistics()["source"]["objects"]["fetches"]
            api.stop()
            api.update(configmap("cm-3", {"a": "changed while away"}))
            time.sleep(AWAY_S)
            started = time.monotonic()
            api.start()  # its watch cache starts now: every resume gets 410 Gone, then relists
            wait_for(lambda: len(api.open_watches()) == watches, timeout_s=30)
            resumed_s = time.monotonic() - started
            key = agent.volume(uid(3), "configmap", "config") / "a"
            wait_for(lambda: key.read_text() == "changed while away", timeout_s=10)
            after = api.requests[requests:]
            fetched = agent.live_statistics()["source"]["objects"]["fetches"] - fetched
            # The status file is written once the reconciler's passes pause: the one written last
            # may still show cm-3's volume "refreshing", the publish seen above being its last step.
            wait_for(lambda: all_mounted(agent, pods), timeout_s=10)
        new_connections = api.connections() - before
    lists = [r for r in after if r.method == "GET" and not r.watch]
    metadata_lists = [r for r in lists if r.metadata]
    object_lists = [r for r in lists if "metadata.name=" in r.query.get("fieldSelector", "")]
    rewatches = [r for r in after if r.watch]
    first_watches: dict[tuple[str, str | None], float] = {}
    for r in rewatches:
        first_watches.setdefault((r.path, r.query.get("fieldSelector")), r.at)
    spread_s = max(first_watches.values()) - min(first_watches.values())
    refused = len(rewatches) - watches  # each watch once from the relist's version, and 410s
    print(
        f"restart: {watches} watches resumed {resumed_s:.1f}s after the server's return, over "
        f"{new_connections} connection(s), {len(lists)} lists ({len(metadata_lists)} of "
        f"metadata, {len(object_lists)} of one object), {refused} watches answered 410, "
        f"first re-watches spread over {spread_s:.2f}s"
    )
    print(sorted(r.query["fieldSelector"] for r in object_lists))
    assert new_connections == 1
    # Within the 2 s of the client's dials, the half second of jitter and the half second the
    # relists of a namespace gather in, not after backoffs grown while the server was away
    # (3.2-6.4 s by then); the relists and watches of 103 objects on top.
    assert resumed_s < 4.5
    # The relists of the ConfigMaps and Secrets asked their namespace's names and versions
    # together, and only the object that changed while the server was away was read again.
    assert 2 <= len(metadata_lists) <= 4
    assert "metadata.name=cm-3" in {r.query["fieldSelector"] for r in object_lists}
    assert len(object_lists) <= watches // 10
    # The agent's count of its objects' lists (what bench/kube_scale.py reports) is the server's.
    assert fetched == len(object_lists) + len(metadata_lists)
    # The first 410s say where the new watch cache starts: the watches resumed after them are
    # not asked from before it.
    assert refused <= watches // 2
    assert spread_s >= 0.2  # jittered, not one instant


def test_watches_queued_behind_a_410_naming_the_horizon_are_not_sent(tmp_path: Path) -> None:
    """The client's requests in flight are bounded (64): after a restart most resumes wait in
    its queue while the first 410s come back. Those the horizon now says are too old get the
    server's answer from the client, without a request; a watch from the horizon on is sent."""
    with running_apiserver() as api:
        api.create(configmap("cm-0", {"a": "0"}))
        client = KubeClient(kubeconfig=api.write_kubeconfig(tmp_path / "kubeconfig"))
        client.horizon[Kind.CONFIG_MAP] = 101

        async def watch_from(version: str) -> str:
            try:
                stream = await client.open_watch(
                    Kind.CONFIG_MAP,
                    namespace="default",
                    field_selector="metadata.name=cm-0",
                    resource_version=version,
                    timeout_s=300,
                )
            except ApiError as exc:
                return f"{exc.code} {exc}"
            stream.close()
            return "watching"

        assert trio.run(watch_from, "100") == "410 Expired: too old resource version: 100 (101)"
        assert [r for r in api.requests if r.watch] == []
        assert trio.run(watch_from, "101") == "watching"
        assert [r.query["resourceVersion"] for r in api.requests if r.watch] == ["101"]


def test_an_idle_watch_holds_no_task_until_its_server_sends_something(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thousands of watched objects are idle for hours: each is a stream and a few objects, not
    a trio task waiting (its frames, task and cancel status were half of a watch's memory), and
    they start a few at a time, not as thousands of tasks queued on the client at once. An event
    runs a watch again; a watch no longer wanted closes its stream, parked or not."""
    watched, at_once = 60, 4
    monkeypatch.setattr(objects, "STARTS_AT_ONCE", at_once)
    keys = [ObjectKey(Kind.CONFIG_MAP, "default", f"cm-{i}") for i in range(watched)]
    with running_apiserver() as api:
        for key in keys:
            api.create(configmap(key.name, {"a": "0"}))
        client = KubeClient(kubeconfig=api.write_kubeconfig(tmp_path / "kubeconfig"))
        store = ObjectStore()

        def value(key: ObjectKey) -> bytes | None:
            obj = store.get(key, ConfigMap)
            return None if obj is None else obj.data["a"]

        async def until(condition: Callable[[], bool]) -> None:
            with trio.fail_after(10):
                while not condition():
                    await trio.sleep(0.01)

        most_tasks = 0

        async def count_tasks(nursery: trio.Nursery) -> None:
            nonlocal most_tasks
            while True:
                most_tasks = max(most_tasks, len(nursery.child_tasks))
                await trio.sleep(0)

        async def main() -> None:
            async with trio.open_nursery() as outer, trio.open_nursery() as nursery:
                tracker = WatchedObjects(
                    client=client,
                    store=store,
                    nursery=nursery,
                    origin="test",
                    on_claim=lambda: None,
                )
                tracker.set_wanted(set(keys))
                outer.start_soon(count_tasks, nursery)
                await tracker.ensure(set(keys), timeout_s=10)
                await until(lambda: len(api.open_watches("configmaps")) == watched)
                await until(lambda: not nursery.child_tasks)
                assert 0 < most_tasks <= 2 * at_once  # a starter, and the watch it starts

                await trio.to_thread.run_sync(api.update, configmap("cm-7", {"a": "1"}))
                await until(lambda: value(keys[7]) == b"1")
                await until(lambda: not nursery.child_tasks)
                assert [value(key) for key in keys].count(b"0") == watched - 1

                tracker.set_wanted(set(keys[: watched // 2]))
                await until(lambda: len(api.open_watches("configmaps")) == watched // 2)
                assert value(keys[-1]) is None
                outer.cancel_scope.cancel()

        trio.run(main)
