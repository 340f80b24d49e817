"""The CSI node plugin as kubelet v1.28 drives it (tests/csi/kubelet.py), against the real agent
and the loopback API server: what a pod's csi volume holds, how it follows its objects, and how it
goes."""

from __future__ import annotations

import base64
import json
import re
import shutil
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from fusevol.csi import registration_pb2 as reg
from tests import kubelet_reference
from tests.agent import Holder, mounts_below, wait_for
from tests.csi.conftest import UID, csi_volume, pod
from tests.csi.kubelet import Kubelet, Obj, is_mount_point, volume_handle
from tests.fuse.test_read_path import hot_read, requests_during_first_reads

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from google.protobuf.message import Message

    from tests.agent import AgentProcess
    from tests.helpers.apiserver import ApiServer

PROJECTED = {
    "projected": {
        "sources": [
            {
                "downwardAPI": {
                    "items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]
                }
            },
            {"configMap": {"name": "app", "items": [{"key": "a", "path": "conf/a"}]}},
        ]
    }
}
WITH_TOKEN = {
    "projected": {
        "sources": [
            *PROJECTED["projected"]["sources"],
            {"serviceAccountToken": {"path": "token", "audience": "vault"}},
        ]
    }
}


def secret(name: str, data: dict[str, str]) -> dict[str, Any]:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {"kind": "Secret", "metadata": {"name": name}, "data": encoded}


def snapshot(path: Path, *, without: str = "") -> dict[str, Any]:
    entries = kubelet_reference.snapshot(path)
    return {k: v for k, v in entries.items() if not without or without not in k}


def recorded(root: Path) -> list[dict[str, Any]]:
    """The agent's records of its published targets, a file each (`fusevol.csi.state`)."""
    return [json.loads(p.read_text()) for p in sorted((root / "fusevol" / "csi").glob("*.json"))]


def read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def test_kubelet_publishes_configmap_secret_and_projected_volumes(
    api: ApiServer,
    csi_agent: Callable[..., Any],
    reference_agent: AgentProcess,
    kubelet_dir: Path,
) -> None:
    api.create({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "1", "b": "x"}})
    api.create(secret("creds", {"password": "hunter2"}))
    web = pod(
        volumes=[
            csi_volume("config", configMap="app"),
            csi_volume("creds", secret="creds"),
            csi_volume("info", volume=json.dumps(WITH_TOKEN)),
            # The same sources as pod-spec volumes: the reference agent serves them.
            {"name": "ref-config", "configMap": {"name": "app"}},
            {"name": "ref-creds", "secret": {"secretName": "creds"}},
            {"name": "ref-info", **PROJECTED},
        ],
        securityContext={"fsGroup": 2000},
    )
    api.create(web)
    with csi_agent() as (agent, kubelet):
        assert kubelet.register() == ("fusevol.io", "test-node")
        assert kubelet.probe()
        config = kubelet.publish(web, "config")
        creds = kubelet.publish(web, "creds")
        info = kubelet.publish(web, "info", tokens={"vault": "token-1"})
        # Returned only when the content is there: read at once, no waiting.
        assert (config / "a").read_text() == "1"
        assert (creds / "password").read_text() == "hunter2"
        assert (info / "token").read_text() == "token-1"
        # 0600 for a token when the pod sets fsGroup, then the fsGroup walk adds group read.
        assert oct((info / "token").stat().st_mode & 0o777) == "0o640"
        # Byte for byte (names, modes, owners, links, contents) what the pod-spec volume holds.
        ref = reference_agent.volume(UID, "configmap", "ref-config")
        reference_agent.wait_mounted(ref)
        assert snapshot(config) == snapshot(ref)
        ref_creds = reference_agent.wait_mounted(reference_agent.volume(UID, "secret", "ref-creds"))
        assert snapshot(creds) == snapshot(ref_creds)
        ref_info = reference_agent.wait_mounted(
            reference_agent.volume(UID, "projected", "ref-info")
        )
        assert snapshot(info, without="token") == snapshot(ref_info)
        assert (config / "..data").stat().st_gid == 2000  # fsGroup via volume_mount_group
        assert kubelet.calls[:3] == ["GetPluginInfo", "NodeGetInfo", "Probe"]
        assert kubelet.calls[3:6] == ["NodeGetCapabilities"] * 2 + ["NodePublishVolume"]
        # Nothing secret in the agent's record of its targets.
        records = recorded(agent.root)
        assert "token-1" not in json.dumps(records)
        assert "hunter2" not in json.dumps(records)
        assert len(records) == 3

        # An edit reaches the target as fast as a pod-spec volume.
        started = time.monotonic()
        api.update({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "2", "b": "x"}})
        wait_for(lambda: read(config / "a") == "2", timeout_s=5)
        print(f"configMap edit visible at the CSI target after {time.monotonic() - started:.3f}s")
        wait_for(lambda: read(info / "conf" / "a") == "2", timeout_s=5)

        # A repeat publish is OK and changes nothing; a republish with new tokens updates them.
        before = snapshot(config)
        assert kubelet.publish(web, "config") == config
        assert snapshot(config) == before
        kubelet.publish(web, "info", tokens={"vault": "token-2"})
        assert (info / "token").read_text() == "token-2"

        # Unpublish: no mount left, target, vol_data.json and the volume directory gone.
        for name in ("config", "creds", "info"):
            kubelet.unpublish(web, name)
        assert mounts_below(kubelet_dir) == []
        assert not (
            kubelet_dir / "pods" / UID / "volumes" / "kubernetes.io~csi" / "config"
        ).exists()
        assert recorded(agent.root) == []
        kubelet.unpublish(web, "config")  # again: OK, nothing to do


def test_a_publish_is_answered_once_bound_and_warm_before_a_container_could_read(
    api: ApiServer, csi_agent: Callable[..., Any]
) -> None:
    """NodePublishVolume waits for the bind only (kubelet's own SetUp has no warming to wait
    for); the warming of a new volume goes on meanwhile, and its first reads then ask the agent
    nothing (docs/fuse.md fact 15). kubelet answers every volume of a pod before it makes the
    pod's sandbox, and only then starts a container."""
    api.create({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "1"}})
    api.create(secret("creds", {"password": "hunter2", "user": "admin"}))
    web = pod(volumes=[csi_volume("config", configMap="app"), csi_volume("creds", secret="creds")])
    api.create(web)
    with csi_agent() as (agent, kubelet):
        negotiated = re.search(r"FUSE capabilities negotiated (.*)", agent.log_text())
        if negotiated is None or "no_open_support" not in negotiated[1].split():
            pytest.skip("the kernel does not offer no_open: every open asks the agent")
        config = kubelet.publish(web, "config")
        assert hot_read(config / "a") == b"1"  # the connection's first open (no_open)
        creds = kubelet.publish(web, "creds")  # a new subtree of its own, warmed after
        wait_for(lambda: agent.live_statistics()["publisher"]["warming"] == 0, timeout_s=10)
        files = {creds / "password": b"hunter2", creds / "user": b"admin"}
        assert requests_during_first_reads(agent, files) == {}


def test_what_a_pods_volumes_reference_is_watched_from_its_arrival_before_any_publish(
    api: ApiServer, csi_agent: Callable[..., Any]
) -> None:
    """kubelet registers a pod's ConfigMaps and Secrets when it admits the pod, ~100 ms before
    it mounts anything: the agent watches what a pod's fusevol.io volumes reference from the
    moment it sees the pod, so that a publish finds them read (no list of its own), and stops
    once the pod and its volumes are gone."""
    api.create({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "1"}})
    api.create(secret("creds", {"password": "hunter2"}))
    projected = {"projected": {"sources": [{"secret": {"name": "creds"}}]}}
    web = pod(
        volumes=[
            csi_volume("config", configMap="app"),
            csi_volume("all", volume=json.dumps(projected)),
            csi_volume("broken", volume="{"),  # refused at its publish, and nothing else
            {"name": "other", "csi": {"driver": "other.example.com", "volumeAttributes": {}}},
        ]
    )

    def watched() -> set[tuple[str, str]]:
        return {(r, f) for r, _, f in api.open_watches() if r in ("configmaps", "secrets")}

    with csi_agent() as (_, kubelet):
        assert watched() == set()
        api.create(web)
        expected = {("configmaps", "metadata.name=app"), ("secrets", "metadata.name=creds")}
        wait_for(lambda: watched() == expected)
        lists = api.count("GET", "configmaps", watch=False) + api.count("GET", "secrets")
        assert (kubelet.publish(web, "config") / "a").read_text() == "1"
        assert (kubelet.publish(web, "all") / "password").read_text() == "hunter2"
        assert api.count("GET", "configmaps", watch=False) + api.count("GET", "secrets") == lists
        for name in ("config", "all"):
            kubelet.unpublish(web, name)
        assert watched() == expected  # the pod is still there
        api.delete("Pod", "default", "web")
        wait_for(lambda: watched() == set())


def test_an_object_refused_when_its_pod_came_is_read_afresh_by_the_publish(
    api: ApiServer, csi_agent: Callable[..., Any], tmp_path: Path
) -> None:
    """Read when its pod came, an object may be refused (the Node authorizer may not know the
    pod yet, a Role may come later): the publish reads it afresh at once, instead of answering
    with a refusal its reflector holds until its backoff ends."""
    user = "system:serviceaccount:fusevol:limited"
    api.users["agent-token"] = (user, ["system:serviceaccounts"])
    for verb in ("list", "watch"):
        for resource in ("pods", "persistentvolumeclaims", "persistentvolumes", "storageclasses"):
            api.allow(user, verb, resource)
    kubeconfig = api.write_kubeconfig(tmp_path / "agent.conf", token="agent-token")
    api.create({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "1"}})
    web = pod(volumes=[csi_volume("config", configMap="app")])
    with csi_agent(kubeconfig=kubeconfig) as (agent, kubelet):
        agent.expect_log("read refused query=configmaps")
        api.create(web)
        wait_for(lambda: "read refused query=configmaps" in agent.log_text())
        for verb in ("get", "list", "watch"):
            api.allow(user, verb, "configmaps", name="app", namespace="default")
        assert (kubelet.publish(web, "config") / "a").read_text() == "1"


def test_a_missing_object_fails_then_appears_on_kubelets_retry(
    api: ApiServer, csi_agent: Callable[..., Any], kubelet_dir: Path
) -> None:
    web = pod(volumes=[csi_volume("config", configMap="later")])
    api.create(web)
    with csi_agent() as (agent, kubelet):
        agent.expect_log('mount failed .*configmap "later" not found')
        with pytest.raises(grpc.RpcError) as failed:
            kubelet.publish(web, "config")
        assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert 'configmap "later" not found' in str(failed.value.details())
        target = kubelet.target(web, "config")
        assert not target.exists()
        assert mounts_below(kubelet_dir) == []
        api.create({"kind": "ConfigMap", "metadata": {"name": "later"}, "data": {"k": "v"}})
        started = time.monotonic()

        def retried() -> bool:  # kubelet's retries, with its backoff cut short
            try:
                kubelet.publish(web, "config")
            except grpc.RpcError:
                time.sleep(0.1)
                return False
            return True

        wait_for(retried, timeout_s=10)
        print(f"missing configMap served {time.monotonic() - started:.3f}s after it was created")
        assert (target / "k").read_text() == "v"
        assert is_mount_point(target)
        # The pod force-deleted from the API before kubelet unpublished: still served (kubelet
        # unpublishes in any case), still in `fusevol status`, and then unpublished as usual.
        api.delete("Pod", "default", "web")
        wait_for(lambda: "pod removed pod=default/web" in agent.log_text(), timeout_s=10)
        wait_for(lambda: agent.volume_status(UID, "config").get("state") == "mounted")
        assert "kubernetes.io/csi/fusevol.io^csi-" in str(agent.volume_status(UID, "config"))
        assert "config" in agent.status()  # `fusevol status` renders it
        assert (target / "k").read_text() == "v"
        kubelet.unpublish(web, "config")
        wait_for(lambda: agent.volume_status(UID, "config") == {})


def test_a_record_that_cannot_be_written_refuses_the_publish_and_disturbs_nothing(
    api: ApiServer, csi_agent: Callable[..., Any], kubelet_dir: Path, tmp_path: Path
) -> None:
    """The agent's directory read-only (a full or read-only disk): the publish answers INTERNAL
    naming the records' directory and the error, sets nothing up, and kubelet's retry succeeds
    once the record can be written; a volume published before keeps being served."""
    api.create({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "1"}})
    web = pod(volumes=[csi_volume("config", configMap="app"), csi_volume("more", configMap="app")])
    api.create(web)
    records = tmp_path / "root" / "fusevol" / "csi"
    with csi_agent() as (agent, kubelet):
        config = kubelet.publish(web, "config")
        records.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "--bind", str(records), str(records)], check=True)
        try:
            subprocess.run(["mount", "-o", "remount,bind,ro", str(records)], check=True)
            with pytest.raises(grpc.RpcError) as failed:
                kubelet.publish(web, "more")
            assert failed.value.code() == grpc.StatusCode.INTERNAL
            details = str(failed.value.details())
            handle = volume_handle(UID, "more")
            assert details == (
                f"volume {handle}: its record in {records} cannot be written: Read-only file system"
            )
            more = kubelet.target(web, "more")
            assert not more.exists()  # nothing set up: kubelet removed its directory
            assert mounts_below(kubelet_dir) == [str(config)]
            assert agent.volume_status(UID, "more") == {}
            assert (config / "a").read_text() == "1"
        finally:
            subprocess.run(["umount", str(records)], check=True)
        kubelet.publish(web, "more")  # kubelet's retry
        assert (more / "a").read_text() == "1"
        targets = {r["volumeId"]: r["targetPath"] for r in recorded(tmp_path / "root")}
        assert targets == {
            volume_handle(UID, "config"): str(config),
            volume_handle(UID, "more"): str(more),
        }
        assert "Traceback" not in agent.log_text()


@pytest.mark.parametrize("layout", ["a file each", "one file of an earlier agent"])
def test_a_restart_serves_every_published_target_again(
    api: ApiServer, csi_agent: Callable[..., Any], kubelet_dir: Path, layout: str
) -> None:
    """kill -9 and a start: every recorded target is served again, its content unchanged,
    without kubelet's help, from the records of this agent or from the one file an earlier
    agent kept them in (moved into a file each). A token kubelet did not pass (its audience is
    not in the CSIDriver's tokenRequests) is requested by TokenRequest, as for a pod-spec
    volume: before and after."""
    api.create({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "1"}})
    api.create(secret("creds", {"password": "hunter2"}))
    web = pod(
        volumes=[
            csi_volume("config", configMap="app"),
            csi_volume("creds", secret="creds"),
            csi_volume("info", volume=json.dumps(WITH_TOKEN)),
        ]
    )
    api.create(web)
    with csi_agent() as (agent, kubelet):
        targets = {name: kubelet.publish(web, name) for name in ("config", "creds", "info")}
        token = (targets["info"] / "token").read_text()
        [claims] = api.tokens_issued
        assert claims["aud"] == ["vault"]
        assert claims["kubernetes.io"]["pod"] == {"name": "web", "uid": UID}
        before = {name: snapshot(path, without="token") for name, path in targets.items()}
        agent.kill()  # kill -9
        records = recorded(agent.root)
        if layout == "one file of an earlier agent":
            shutil.rmtree(agent.root / "fusevol" / "csi")
            legacy = agent.root / "fusevol" / "csi.json"
            legacy.write_text(json.dumps({"published": records}))
        agent.start()
        started = time.monotonic()
        assert recorded(agent.root) == records
        assert not (agent.root / "fusevol" / "csi.json").exists()

        # (The kernel may still answer a read of the dead bind from its page cache: only a
        # whole snapshot, every directory listed, shows the fresh bind.)
        def served_again() -> bool:
            for name, path in targets.items():
                now = snapshot(path, without="token")
                assert now == before[name], (name, set(now.items()) ^ set(before[name].items()))
            return True

        wait_for(served_again, timeout_s=30)
        print(f"CSI targets served again {time.monotonic() - started:.3f}s after the agent's ready")
        assert (targets["info"] / "token").read_text() != token  # a new TokenRequest's
        assert len(api.tokens_issued) == 2
        # Still kubelet's: it unpublishes them as usual.
        for name in targets:
            kubelet.unpublish(web, name)
        assert mounts_below(kubelet_dir) == []


def test_reads_of_a_csi_target_never_fail_through_a_hand_over(
    api: ApiServer, csi_agent: Callable[..., Any], tmp_path: Path
) -> None:
    """SIGTERM then a new agent (systemctl restart): the new agent takes the FUSE connection over
    from the stopping one, so the CSI target's bind stays what it was and a reader whose copy of
    the target is a slave (a container's HostToContainer bind) sees no failed read.
    tests/containerd/test_takeover.py checks plain rprivate binds the same way."""
    api.create({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "1"}})
    web = pod(volumes=[csi_volume("config", configMap="app")])
    api.create(web)
    reads = tmp_path / "reads"
    with csi_agent() as (first, kubelet):
        target = kubelet.publish(web, "config")
        # `ls` always reaches the FUSE server (opendir); `cat` may be served from the caches.
        loop = (
            f"while :; do if cat {target}/a >/dev/null && ls {target} >/dev/null;"
            f" then echo ok; else echo fail; fi; done >> {reads} 2>> {reads}.errors"
        )
        reader = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "slave", "sh", "-c", loop]
        )
        try:
            wait_for(lambda: reads.exists() and reads.stat().st_size > 0)
            first.hand_over()
            with csi_agent() as (second, _):
                first.wait_agent_gone(10)  # the second agent serves the same connection
                released = reads.stat().st_size
                wait_for(lambda: reads.stat().st_size > released + 60)  # 20 reads more
                reader.kill()
                reader.wait(timeout=10)
                assert "lame duck done: the next agent took the connection over" in first.log_text()
                assert "FUSE taken over" in second.log_text()
                kubelet.unpublish(web, "config")
                second.stop()
        finally:
            reader.kill()
            reader.wait(timeout=10)
    lines = reads.read_text().split()
    failed = lines.count("fail")
    assert failed == 0, f"{failed} failed reads of {len(lines)}: {reads.with_suffix('.errors')}"
    print(f"{len(lines)} reads of the CSI target through a hand-over, none failed")


def test_concurrent_publishes_and_unpublishes_all_succeed_and_the_record_ends_exact(
    api: ApiServer, csi_agent: Callable[..., Any]
) -> None:
    """kubelet publishes and unpublishes on several gRPC threads at once: every call succeeds,
    and the records end as the published set, after 50 publishes at once and after 50 mixed
    calls (25 unpublishes of those, 25 publishes of new volumes) at once."""
    api.create({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "1"}})
    pods = [
        pod(f"web-{i}", f"dddddddd-0000-4000-8000-{i:012d}", volumes=[
            csi_volume(f"v{j}", configMap="app") for j in range(5)
        ])
        for i in range(15)
    ]  # fmt: skip
    for each in pods:
        api.create(each)
    first = [(p, f"v{j}") for p in pods[:10] for j in range(5)]
    second = [(p, f"v{j}") for p in pods[10:] for j in range(5)]

    with csi_agent() as (agent, kubelet), ThreadPoolExecutor(max_workers=50) as threads:

        def published() -> set[tuple[str, str]]:
            return {(e["volumeId"], e["targetPath"]) for e in recorded(agent.root)}

        def expected(volumes: list[tuple[Obj, str]]) -> set[tuple[str, str]]:
            return {
                (volume_handle(p["metadata"]["uid"], name), str(kubelet.target(p, name)))
                for p, name in volumes
            }

        calls = [threads.submit(kubelet.publish, p, name) for p, name in first]
        for call in calls:
            assert (call.result() / "a").read_text() == "1"
        assert published() == expected(first)

        gone, kept = first[::2], first[1::2]
        calls = [threads.submit(kubelet.unpublish, p, name) for p, name in gone]
        calls += [threads.submit(kubelet.publish, p, name) for p, name in second]
        for call in calls:
            call.result()  # raises the call's RpcError, if any
        assert published() == expected(kept + second)
        assert sorted((agent.root / "fusevol" / "csi").glob(".*")) == []  # no temporary left


def test_the_agent_registers_the_driver_with_kubelets_plugin_watcher(
    api: ApiServer, csi_agent: Callable[..., Any], kubelet_dir: Path
) -> None:
    """kubelet's plugin watcher finds `fusevol.io-reg.sock` in plugins_registry and asks it what
    it is (GetInfo), then says how registration went: the agent answers both itself, as
    node-driver-registrar would. A tear-down removes the socket (kubelet forgets the driver)."""
    registration = kubelet_dir / "plugins_registry" / "fusevol.io-reg.sock"
    with csi_agent() as (agent, kubelet):
        assert registration.is_socket()
        with grpc.insecure_channel(f"unix://{registration}") as channel:

            def call(method: str, request: Message, response: type[Message]) -> Any:
                rpc: grpc.UnaryUnaryMultiCallable[Message, Any] = channel.unary_unary(
                    f"/pluginregistration.Registration/{method}",
                    request_serializer=lambda m: m.SerializeToString(),
                    response_deserializer=response.FromString,
                )
                return rpc(request, timeout=10)

            info = call("GetInfo", reg.InfoRequest(), reg.PluginInfo)
            assert (info.type, info.name, list(info.supported_versions)) == (
                "CSIPlugin",
                "fusevol.io",
                ["1.0.0"],
            )
            assert info.endpoint == str(kubelet.socket)
            call(
                "NotifyRegistrationStatus",
                reg.RegistrationStatus(plugin_registered=True),
                reg.RegistrationStatusResponse,
            )
        wait_for(lambda: "csi driver registered with kubelet" in agent.log_text())
        assert kubelet.register() == ("fusevol.io", "test-node")
    assert not registration.exists()


def test_publishes_during_a_rollout_succeed_at_the_first_call(
    api: ApiServer, csi_agent: Callable[..., Any]
) -> None:
    """A rollout (a second agent started with `--replace` while the first serves) never leaves
    kubelet without a CSI server: the successor's socket replaces ours in one rename, and the
    calls that reach the stopping agent meanwhile wait for it and are forwarded there. kubelet
    publishes and unpublishes all the while: every call succeeds at once (kubelet would retry a
    failed one after 500 ms), and the published set ends exact."""
    api.create({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "1"}})
    volumes = [csi_volume("config", configMap="app")]
    pods = [
        pod(f"web-{i}", f"eeeeeeee-0000-4000-8000-{i:012d}", volumes=volumes) for i in range(400)
    ]
    for each in pods:
        api.create(each)
    failures: list[str] = []
    calls: list[float] = []
    stop = threading.Event()

    def kubelet_calls(kubelet: Kubelet) -> None:
        for each in pods:
            if stop.is_set():
                return
            try:
                assert (kubelet.publish(each, "config") / "a").read_text() == "1"
                kubelet.unpublish(each, "config")
                kubelet.publish(each, "config")
            except (grpc.RpcError, OSError, AssertionError) as exc:
                failures.append(f"{each['metadata']['name']}: {exc}")
            calls.append(time.monotonic())
            time.sleep(0.02)

    with csi_agent("--replace") as (first, kubelet):
        caller = threading.Thread(target=kubelet_calls, args=(kubelet,), daemon=True)
        caller.start()
        try:
            wait_for(lambda: len(calls) >= 5)
            started = time.monotonic()
            with csi_agent("--replace") as (second, _):
                ready = time.monotonic()
                first.wait_agent_gone(30)  # its CSI server lingered until ours took over
                wait_for(lambda: len([at for at in calls if at > ready]) >= 5, timeout_s=20)
                stop.set()
                caller.join(timeout=30)
                during = len([at for at in calls if started <= at <= ready])
                assert "-> transferring" in first.log_text()
                forwarded = first.log_text().count("csi call forwarded to the next agent")
                published = {e["volumeId"] for e in recorded(second.root)}
                done = {volume_handle(p["metadata"]["uid"], "config") for p in pods[: len(calls)]}
                assert published == done
                for each in pods[: len(calls)]:
                    kubelet.unpublish(each, "config")
                second.stop()
        finally:
            stop.set()
            caller.join(timeout=30)
            assert first.process is not None
            first.process.send_signal(signal.SIGTERM)  # the retired launcher: the old pod goes
    assert failures == [], failures[:5]
    print(f"{len(calls)} rounds, {during} during the rollout, {forwarded} forwarded, 0 failed")


def test_the_holder_answers_registration_and_a_rollout_never_makes_it_anew(
    api: ApiServer, csi_agent: Callable[..., Any], kubelet_dir: Path, tmp_path: Path
) -> None:
    """kubelet's plugin watcher registers the driver again, with a moment in which kubelet does
    not know it, whenever a new registration socket appears. With the chart's holder answering
    it (`fusevol hold --csi-endpoint`, agents started with `--csi-registration holder`), a
    rollout never touches it: the same socket before and after, answered throughout."""
    registration = kubelet_dir / "plugins_registry" / "fusevol.io-reg.sock"
    endpoint = f"unix://{tmp_path / 'plugins' / 'fusevol.io' / 'csi.sock'}"
    holder = Holder(
        tmp_path / "root", "--csi-endpoint", endpoint, "--kubelet-dir", str(kubelet_dir)
    )
    try:
        inode = registration.stat().st_ino
        args = ("--replace", "--csi-registration", "holder")
        assert get_info(registration).endpoint == str(tmp_path / "plugins/fusevol.io/csi.sock")
        with csi_agent(*args) as (first, kubelet):
            assert kubelet.register() == ("fusevol.io", "test-node")
            with csi_agent(*args) as (second, _):
                first.wait_agent_gone(30)
                assert registration.stat().st_ino == inode
                assert get_info(registration).name == "fusevol.io"
                assert kubelet.register() == ("fusevol.io", "test-node")
                second.stop()
            assert first.process is not None
            first.process.send_signal(signal.SIGTERM)  # the retired launcher
        for agent in (first, second):
            assert "csi registration socket" not in agent.log_text()
        assert registration.stat().st_ino == inode
    finally:
        assert holder.stop() == 0
    assert not registration.exists()  # kubelet forgets the driver with the holder


def get_info(registration: Path) -> Any:
    """What kubelet's plugin watcher asks a registration socket first."""
    with grpc.insecure_channel(f"unix://{registration}") as channel:
        rpc: grpc.UnaryUnaryMultiCallable[Message, Any] = channel.unary_unary(
            "/pluginregistration.Registration/GetInfo",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=reg.PluginInfo.FromString,
        )
        return rpc(reg.InfoRequest(), timeout=10)


def test_without_token_requests_tokens_are_kubelets_only(
    api: ApiServer, csi_agent: Callable[..., Any]
) -> None:
    """`--csi-token-requests false` (the chart with CSI, which grants no serviceaccounts/token):
    a token comes from kubelet (the CSIDriver's tokenRequests) or the publish fails, naming the
    audience to list there; the agent requests none."""
    api.create({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "1"}})
    web = pod(volumes=[csi_volume("info", volume=json.dumps(WITH_TOKEN))])
    api.create(web)
    with csi_agent("--csi-token-requests", "false") as (agent, kubelet):
        agent.expect_log("mount failed .*no token for audience 'vault'")
        with pytest.raises(grpc.RpcError) as failed:
            kubelet.publish(web, "info")
        assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert str(failed.value.details()).endswith(
            "list it in the tokenRequests of the CSIDriver fusevol.io (the agent requests none:"
            " --csi-token-requests false)"
        )
        info = kubelet.publish(web, "info", tokens={"vault": "kubelets-token"})
        assert (info / "token").read_text() == "kubelets-token"
        kubelet.unpublish(web, "info")
    assert api.tokens_issued == []


def test_a_downward_api_file_of_annotations_shows_kubelets_own(
    api: ApiServer, csi_agent: Callable[..., Any]
) -> None:
    """kubelet adds `kubernetes.io/config.seen` and `kubernetes.io/config.source` to every pod it
    accepts, and its downwardAPI volume shows them in `metadata.annotations`: a CSI volume of
    the same source shows them too, as a pod-spec volume served by fusevol does."""
    notes = {
        "downwardAPI": {
            "items": [{"path": "notes", "fieldRef": {"fieldPath": "metadata.annotations"}}]
        }
    }
    web = pod(volumes=[csi_volume("notes", volume=json.dumps(notes))])
    web["metadata"]["annotations"] = {"example.com/owner": "team-a"}
    api.create(web)
    with csi_agent() as (_, kubelet):
        lines = (kubelet.publish(web, "notes") / "notes").read_text().splitlines()
        kubelet.unpublish(web, "notes")
    assert [line.split("=", 1)[0] for line in lines] == [
        "example.com/owner",
        "kubernetes.io/config.seen",
        "kubernetes.io/config.source",
    ]
    assert lines[0] == 'example.com/owner="team-a"'
    assert lines[2] == 'kubernetes.io/config.source="api"'
