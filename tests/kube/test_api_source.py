"""The Kubernetes API source end to end: the real agent, the real client, a loopback API server.

Each test checks what a pod sees in its volume directory, and what the agent did on the wire
(the server records requests and open watches), through faults a cluster produces: a watch cut in
the middle of an event, history compacted (410), the API server restarting, objects deleted or
immutable, tokens expiring.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import time
from typing import TYPE_CHECKING, Any

import pytest

from tests.agent import mounts_below, wait_for
from tests.helpers.apiserver import ApiError
from tests.kube.conftest import UID, Obj, configmap, configmap_volume, pod

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.helpers.apiserver import ApiServer

OTHER_UID = "cccccccc-0000-4000-8000-000000000002"


def read(path: Any) -> str | None:
    try:
        return str(path.read_text())
    except FileNotFoundError:
        return None


def test_pods_of_this_node_are_served_and_follow_their_configmap(
    api: ApiServer, kube_agent: Callable[..., Any]
) -> None:
    api.create(configmap("app", {"a": "1"}))
    api.create(pod(volumes=[configmap_volume("config", "app")]))
    api.create(
        pod("elsewhere", OTHER_UID, node="other-node", volumes=[configmap_volume("c", "app")])
    )
    with kube_agent() as agent:
        key = agent.wait_mounted(agent.volume(UID, "configmap", "config")) / "a"
        assert key.read_text() == "1"
        assert not (agent.root / "pods" / OTHER_UID).exists()
        # One watch for the node's pods, one per referenced object, each by name, one for the
        # PVs this node provisioned (by label: fusevol.io/node=test-node), one for the claims
        # (those the scheduler selects this node for: an annotation, which no selector reaches).
        # A watch opens after its list: the volume can be mounted from the pods' list before
        # the pods' watch is open.
        expected = [
            ("configmaps", "default", "metadata.name=app"),
            ("persistentvolumeclaims", None, ""),
            ("persistentvolumes", None, ""),
            ("pods", None, "spec.nodeName=test-node"),
        ]
        wait_for(lambda: sorted(api.open_watches()) == expected, timeout_s=5)
        for value in ("v0", "v1", "v2"):
            api.update(configmap("app", {"a": value}))
            wait_for(functools.partial(lambda v: read(key) == v, value), timeout_s=5)
        # The last pod referencing it goes: its volume is torn down and its watch closed.
        api.delete("Pod", "default", "web")
        wait_for(lambda: not (agent.root / "pods" / UID).exists(), timeout_s=5)
        wait_for(lambda: api.open_watches("configmaps") == [], timeout_s=5)
        assert api.count("GET", "configmaps", watch=False) == 1  # its one list


def test_a_status_update_changes_nothing_and_a_label_reaches_the_downward_api(
    api: ApiServer, kube_agent: Callable[..., Any]
) -> None:
    """kubelet updates a starting pod's status four or five times: nothing a volume shows, so
    the agent's store never changes for them (no conversion, no reconciler pass); a label
    edit, the next update, reaches the pod's downwardAPI file."""
    api.create(configmap("app", {"a": "1"}))
    labels = {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}
    volumes = [
        configmap_volume("config", "app"),
        {"name": "info", "downwardAPI": {"items": [labels]}},
    ]
    written = pod(volumes=volumes)
    written["metadata"]["labels"] = {"app": "web"}
    web = api.create(written)
    with kube_agent() as agent:
        info = agent.wait_mounted(agent.volume(UID, "downward-api", "info")) / "labels"
        assert read(info) == 'app="web"'
        agent.wait_reconciled()
        before = agent.live_statistics()["store"]["generation"]
        for phase in ("Pending", "Running", "Running"):
            web["status"] = {"phase": phase, "podIP": "10.0.0.7", "conditions": [{"type": phase}]}
            web = api.update(web)
        web["metadata"]["labels"]["tier"] = "front"
        api.update(web)
        wait_for(lambda: read(info) == 'app="web"\ntier="front"', timeout_s=5)
        assert agent.live_statistics()["store"]["generation"] == before + 1


def test_a_finished_pods_volumes_are_torn_down_while_the_api_server_keeps_it(
    api: ApiServer, kube_agent: Callable[..., Any]
) -> None:
    """kubelet unmounts the volumes of a pod that has finished (Succeeded or Failed: its
    containers have stopped, and none starts again) while the API server keeps the pod, as it
    keeps a Job's until someone deletes it. A pod sharing the object serves on, and follows its
    edits; the finished pod's objects are watched no more once no served pod needs them."""
    api.create(configmap("app", {"a": "1"}))
    api.create(configmap("report", {"r": "1"}))
    job = api.create(
        pod(
            "job",
            OTHER_UID,
            restartPolicy="Never",
            volumes=[configmap_volume("config", "app"), configmap_volume("report", "report")],
        )
    )
    api.create(pod(volumes=[configmap_volume("config", "app")]))
    with kube_agent() as agent:
        done = agent.wait_mounted(agent.volume(OTHER_UID, "configmap", "config"))
        agent.wait_mounted(agent.volume(OTHER_UID, "configmap", "report"))
        served = agent.wait_mounted(agent.volume(UID, "configmap", "config"))
        job["status"] = {"phase": "Running", "podIP": "10.0.0.8"}
        job = api.update(job)
        agent.wait_reconciled()
        assert read(done / "a") == "1"  # running: served as before
        job["status"] = {"phase": "Succeeded", "podIP": "10.0.0.8"}
        api.update(job)
        wait_for(lambda: not agent.volume(OTHER_UID, "configmap", "config").exists())
        wait_for(lambda: not agent.volume(OTHER_UID, "configmap", "report").exists())
        assert api.get("Pod", "default", "job") is not None
        assert "pod finished pod=default/job" in agent.log_text()
        assert str(served) in mounts_below(agent.root)
        wait_for(lambda: [w[2] for w in api.open_watches("configmaps")] == ["metadata.name=app"])
        api.update(configmap("app", {"a": "2"}))
        wait_for(lambda: read(served / "a") == "2", timeout_s=5)


def test_a_watch_cut_mid_event_resumes_without_relisting(
    api: ApiServer, kube_agent: Callable[..., Any]
) -> None:
    api.create(configmap("app", {"a": "1"}))
    api.create(pod(volumes=[configmap_volume("config", "app")]))
    with kube_agent() as agent:
        agent.expect_log("watch failed ")
        key = agent.wait_mounted(agent.volume(UID, "configmap", "config")) / "a"
        lists = api.count("GET", "configmaps", watch=False)
        assert api.cut_watches() == 4  # pods, the configmap, provisioned PVs, selected claims
        api.update(configmap("app", {"a": "2"}))  # its event is the one cut in half
        wait_for(lambda: read(key) == "2", timeout_s=10)
        assert api.count("GET", "configmaps", watch=True) >= 2  # watched again...
        assert api.count("GET", "configmaps", watch=False) == lists  # ...from where it stopped
        assert "watch failed" in agent.log_text()


def test_410_gone_relists_and_converges(api: ApiServer, kube_agent: Callable[..., Any]) -> None:
    api.create(configmap("app", {"a": "1", "b": "1"}))
    api.create(pod(volumes=[configmap_volume("config", "app")]))
    with kube_agent() as agent:
        agent.expect_log("watch failed ")
        volume = agent.wait_mounted(agent.volume(UID, "configmap", "config"))
        lists = api.count("GET", "configmaps", watch=False)
        api.cut_watches()  # the watches die now; the agent comes back after its backoff...
        api.update(configmap("app", {"a": "2"}))
        api.compact()  # ...to find the update's event gone from history
        wait_for(lambda: read(volume / "a") == "2" and read(volume / "b") is None, timeout_s=10)
        assert api.count("GET", "configmaps", watch=False) == lists + 1
        first, *_, relist = [
            r for r in api.requests if r.path.endswith("/configmaps") and not r.watch
        ]
        # The first list: whatever the watch cache holds, as client-go's first list asks.
        assert first.query.get("resourceVersion") == "0"
        assert "resourceVersionMatch" not in first.query
        # No older than the expired watch's version: the watch cache can serve it, not etcd.
        assert relist.query.get("resourceVersionMatch") == "NotOlderThan"
        assert int(relist.query["resourceVersion"]) > 100
        assert (
            "the API server's watch cache starts later: watches of configmaps" in agent.log_text()
        )


def test_bookmarks_move_the_resume_point(api: ApiServer, kube_agent: Callable[..., Any]) -> None:
    api.bookmark_interval_s = 0.2
    api.create(configmap("app", {"a": "1"}))
    api.create(pod(volumes=[configmap_volume("config", "app")]))
    with kube_agent() as agent:
        agent.expect_log("watch failed ")
        key = agent.wait_mounted(agent.volume(UID, "configmap", "config")) / "a"
        for i in range(3):  # the cluster moves on; nothing this agent watches changes
            api.create(configmap(f"unrelated-{i}", {}))
        time.sleep(1.0)  # bookmarks carry the new resourceVersion to every watch
        api.compact()  # a watch resuming from its list's version would now get 410
        lists = api.count("GET", "configmaps", watch=False)
        api.cut_watches()
        api.update(configmap("app", {"a": "2"}))
        wait_for(lambda: read(key) == "2", timeout_s=10)
        assert api.count("GET", "configmaps", watch=False) == lists  # resumed: no relist
        assert "watch expired" not in agent.log_text()


def test_an_api_server_restart_keeps_volumes_served_and_converges(
    api: ApiServer, kube_agent: Callable[..., Any]
) -> None:
    api.create(configmap("app", {"a": "1"}))
    api.create(pod(volumes=[configmap_volume("config", "app")]))
    api.create(pod("second", OTHER_UID, volumes=[configmap_volume("config", "app")]))
    with kube_agent() as agent:
        agent.expect_log("http2 connection lost ", "API server unreachable")
        key = agent.wait_mounted(agent.volume(UID, "configmap", "config")) / "a"
        agent.wait_mounted(agent.volume(OTHER_UID, "configmap", "config"))
        # The bind shows in the mount table before its operation ends and the status says so.
        agent.wait_state(UID, "config", "mounted")
        agent.wait_state(OTHER_UID, "config", "mounted")
        api.stop()
        # While it is away: the cluster changes, the node keeps serving what it had.
        api.update(configmap("app", {"a": "2"}))
        api.delete("Pod", "default", "second")
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert key.read_text() == "1"
            assert agent.volume_status(UID, "config")["state"] == "mounted"
            time.sleep(0.1)
        assert (agent.root / "pods" / OTHER_UID).exists()
        api.start()
        wait_for(lambda: read(key) == "2", timeout_s=40)
        wait_for(lambda: not (agent.root / "pods" / OTHER_UID).exists(), timeout_s=10)
        assert (
            "the API server's watch cache starts later: watches of configmaps" in agent.log_text()
        )


def test_deleted_objects_optional_empties_required_keeps_and_reports(
    api: ApiServer, kube_agent: Callable[..., Any]
) -> None:
    api.create(configmap("opt", {"a": "1"}))
    api.create(configmap("req", {"a": "1"}))
    volumes = [
        configmap_volume("opt", "opt", optional=True),
        configmap_volume("req", "req"),
    ]
    api.create(pod(volumes=volumes))
    with kube_agent() as agent:
        agent.expect_log('refresh failed .*configmap "req" not found')
        optional = agent.wait_mounted(agent.volume(UID, "configmap", "opt"))
        required = agent.wait_mounted(agent.volume(UID, "configmap", "req"))
        api.delete("ConfigMap", "default", "opt")
        api.delete("ConfigMap", "default", "req")
        wait_for(lambda: read(optional / "a") is None, timeout_s=5)
        assert os.path.isdir(optional / "..data")
        message = 'MountVolume.SetUp failed for volume "req" : configmap "req" not found'

        def event() -> dict[str, Any] | None:
            found = [e for e in api.events.values() if e["message"] == message]
            return found[0] if found else None

        first = wait_for(event, timeout_s=5)
        assert first["reason"] == "FailedMount"
        assert first["type"] == "Warning"
        assert first["involvedObject"]["kind"] == "Pod"
        assert first["involvedObject"]["uid"] == UID
        # The retries (0.5 s, 1 s, ...) count on the same event instead of creating new ones.
        wait_for(lambda: (event() or {}).get("count", 0) >= 2, timeout_s=5)
        assert len(api.events) == 1
        assert read(required / "a") == "1"  # a running pod keeps its last files
        # It comes back: served again.
        api.create(configmap("req", {"a": "back"}))
        wait_for(lambda: read(required / "a") == "back", timeout_s=10)


def test_a_pod_as_stored_gets_its_volumes_and_one_it_cannot_serve_fails_alone(
    api: ApiServer, kube_agent: Callable[..., Any]
) -> None:
    """A resourceFieldRef written without a divisor reaches the agent as `divisor: "0"` (the
    server stores pods defaulted) and serves as divisor 1; a volume whose source the agent
    refuses gets a FailedMount event naming its field, and the pod's other volumes are served."""
    api.create(configmap("app", {"a": "1"}))

    def cpu(**divisor: str) -> Obj:
        ref = {"containerName": "c", "resource": "limits.cpu", **divisor}
        return {"items": [{"path": "cpu", "resourceFieldRef": ref}]}

    container = {"name": "c", "resources": {"limits": {"cpu": "1500m"}}}
    stored = api.create(
        pod(
            containers=[container],
            volumes=[
                configmap_volume("config", "app"),
                {"name": "info", "downwardAPI": cpu()},
                {"name": "bad", "downwardAPI": cpu(divisor="3")},
            ],
        )
    )
    assert stored["spec"]["volumes"][1]["downwardAPI"]["items"][0]["resourceFieldRef"] == {
        "containerName": "c",
        "resource": "limits.cpu",
        "divisor": "0",
    }
    field = "spec.volumes[2].downwardAPI.items[0].resourceFieldRef.divisor"
    with kube_agent(expect_log=(f"{re.escape(field)}: invalid value",)) as agent:
        config = agent.wait_mounted(agent.volume(UID, "configmap", "config"))
        info = agent.wait_mounted(agent.volume(UID, "downward-api", "info"))
        assert (config / "a").read_text() == "1"
        assert (info / "cpu").read_text() == "2"  # 1.5 cores, divided by 1, rounded up
        message = (
            f'MountVolume.SetUp failed for volume "bad" : {field}: invalid value "3": '
            "only divisor's values 1m and 1 are supported with the cpu resource"
        )
        event = wait_for(
            lambda: [e for e in api.events.values() if e["message"] == message], timeout_s=5
        )[0]
        assert (event["reason"], event["type"]) == ("FailedMount", "Warning")
        assert event["involvedObject"]["uid"] == UID
        assert not agent.volume(UID, "downward-api", "bad").exists()
        assert "object rejected" not in agent.log_text()


def test_an_immutable_object_is_not_watched(api: ApiServer, kube_agent: Callable[..., Any]) -> None:
    api.create(configmap("frozen", {"a": "1"}, immutable=True))
    api.create(configmap("app", {"a": "1"}))
    api.create(pod(volumes=[configmap_volume("f", "frozen"), configmap_volume("c", "app")]))
    with kube_agent() as agent:
        frozen = agent.wait_mounted(agent.volume(UID, "configmap", "f")) / "a"
        agent.wait_mounted(agent.volume(UID, "configmap", "c"))
        wait_for(
            lambda: (
                api.open_watches("configmaps") == [("configmaps", "default", "metadata.name=app")]
            ),
            timeout_s=5,
        )
        with pytest.raises(ApiError, match="immutable"):
            api.update(configmap("frozen", {"a": "2"}, immutable=True))
        # A second pod using it is served from what the agent holds, without a new watch.
        api.create(pod("second", OTHER_UID, volumes=[configmap_volume("f", "frozen")]))
        second = agent.wait_mounted(agent.volume(OTHER_UID, "configmap", "f")) / "a"
        assert second.read_text() == frozen.read_text() == "1"
        assert len(api.open_watches("configmaps")) == 1


def _claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    result: dict[str, Any] = json.loads(
        base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    )
    return result


def test_service_account_tokens_are_bound_refreshed_and_moded(
    api: ApiServer, kube_agent: Callable[..., Any]
) -> None:
    api.token_lifetime_s = 3  # the server grants less than asked: refresh at 80 % of that
    api.service_accounts.add(("default", "robot"))
    token_volume = {
        "name": "token",
        "projected": {
            "sources": [
                {"serviceAccountToken": {"path": "token", "audience": "vault"}},
                {"configMap": {"name": "app"}},
            ]
        },
    }
    api.create(configmap("app", {"a": "1"}))
    api.create(pod(volumes=[token_volume]))
    api.create(
        pod(
            "runner",
            OTHER_UID,
            volumes=[token_volume],
            serviceAccountName="robot",
            securityContext={"runAsUser": 1000},
        )
    )
    with kube_agent() as agent:
        path = agent.wait_mounted(agent.volume(UID, "projected", "token")) / "token"
        claims = _claims(path.read_text())
        assert claims["aud"] == ["vault"]
        assert claims["sub"] == "system:serviceaccount:default:default"
        assert claims["kubernetes.io"]["pod"] == {"name": "web", "uid": UID}
        status = os.stat(path)
        assert (status.st_mode & 0o7777, status.st_uid) == (0o644, 0)
        # runAsUser: 0600, owned by that user (kubelet's e2e expectations).
        other = agent.wait_mounted(agent.volume(OTHER_UID, "projected", "token")) / "token"
        assert _claims(other.read_text())["sub"] == "system:serviceaccount:default:robot"
        status = os.stat(other)
        assert (status.st_mode & 0o7777, status.st_uid, status.st_gid) == (0o600, 1000, 0)
        # Refreshed at 80 % of its 3 s lifetime, minus jitter: a new token within ~2.5 s.
        started = time.monotonic()
        wait_for(lambda: _claims(path.read_text())["n"] != claims["n"], timeout_s=6)
        assert time.monotonic() - started < 3
        token = path.read_text()  # in memory and in the volume only: never shown or logged
        assert token not in json.dumps(agent.snapshot())
        assert token not in agent.log_text()


@pytest.mark.parametrize("strategy", ["Cache", "Get"])
def test_cache_and_get_strategies(
    api: ApiServer, kube_agent: Callable[..., Any], strategy: str
) -> None:
    api.create(configmap("app", {"a": "1"}))
    api.create(pod(volumes=[configmap_volume("config", "app")]))
    # Cache with a TTL far beyond the test; Get refetches at every 0.3 s sync.
    args = ("--change-detection", strategy, "--sync-period", "0.3", "--cache-ttl", "600")
    with kube_agent(*args) as agent:
        key = agent.wait_mounted(agent.volume(UID, "configmap", "config")) / "a"
        assert api.open_watches("configmaps") == []  # no watch: GETs only
        api.update(configmap("app", {"a": "2"}))
        if strategy == "Get":
            wait_for(lambda: read(key) == "2", timeout_s=3)
            fetched = api.count("GET", "configmaps")
            time.sleep(1.0)
            assert api.count("GET", "configmaps") >= fetched + 2  # at every sync
            return
        time.sleep(1.5)  # five syncs: the cached copy is still fresh
        assert read(key) == "1"
        assert api.count("GET", "configmaps") == 1
        # A pod update invalidates its objects (kubelet's cache-based manager).
        updated = pod(volumes=[configmap_volume("config", "app")])
        updated["metadata"]["annotations"] = {"touched": "1"}
        api.update(updated)
        wait_for(lambda: read(key) == "2", timeout_s=3)
        assert api.count("GET", "configmaps") == 2


def test_no_mount_is_left_behind(api: ApiServer, kube_agent: Callable[..., Any]) -> None:
    """The agent's clean stop unmounts what the API source set up (checked by `kube_agent`)."""
    api.create(configmap("app", {"a": "1"}))
    api.create(pod(volumes=[configmap_volume("config", "app")]))
    with kube_agent() as agent:
        agent.wait_mounted(agent.volume(UID, "configmap", "config"))
        root = agent.root
    assert mounts_below(root) == []
