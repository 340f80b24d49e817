"""Prepared publishes (`fusevol.csi.preparing`): a pod's fusevol.io volumes served when the pod
arrives, and each publish answered in gRPC's thread with one bind, identical to what the publish
path serves; and every way a publish may not find its volume prepared as it asks."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from tests.agent import mounts_below, wait_for
from tests.csi.conftest import UID, csi_volume, pod
from tests.csi.test_csi_kubelet import PROJECTED, read, recorded, secret, snapshot

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests.agent import AgentProcess
    from tests.helpers.apiserver import ApiServer


def staged(root: Path) -> list[Path]:
    """The records written ahead for prepared volumes (`fusevol.csi.state.stage`)."""
    return sorted((root / "fusevol" / "csi").glob(".csi-*.json.*.tmp"))


def csi_statistics(agent: AgentProcess) -> dict[str, int]:
    statistics: dict[str, int] = agent.live_statistics()["csi"]
    return statistics


def test_volumes_prepared_on_their_pods_arrival_are_published_in_one_bind_byte_for_byte(
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
            csi_volume("info", volume=json.dumps(PROJECTED)),
            {"name": "ref-config", "configMap": {"name": "app"}},
            {"name": "ref-creds", "secret": {"secretName": "creds"}},
            {"name": "ref-info", **PROJECTED},
        ],
        securityContext={"fsGroup": 2000},
    )
    with csi_agent() as (agent, kubelet):
        assert csi_statistics(agent)["prepared"] == 0
        api.create(web)
        wait_for(lambda: csi_statistics(agent)["prepared"] == 3)
        assert mounts_below(kubelet_dir) == []  # served, bound nowhere
        assert recorded(agent.root) == []  # their records written ahead, not made yet
        assert len(staged(agent.root)) == 3
        config = kubelet.publish(web, "config")
        creds = kubelet.publish(web, "creds")
        info = kubelet.publish(web, "info")
        assert csi_statistics(agent) == {"published": 3, "prepared": 0, "prepared_publishes": 3}
        assert staged(agent.root) == []  # renamed into place
        assert (config / "a").read_text() == "1"  # at once: the bind came before the answer
        for target, kind, name in (
            (config, "configmap", "ref-config"),
            (creds, "secret", "ref-creds"),
            (info, "projected", "ref-info"),
        ):
            ref = reference_agent.wait_mounted(reference_agent.volume(UID, kind, name))
            assert snapshot(target) == snapshot(ref)
        assert (config / "..data").stat().st_gid == 2000
        for name in ("config", "creds", "info"):
            agent.wait_state(UID, name, "mounted")
        records = recorded(agent.root)
        assert sorted(r["targetPath"] for r in records) == sorted(map(str, (config, creds, info)))
        assert "hunter2" not in json.dumps(records)
        # From then on a volume like any other: edits reach it, a restart keeps it, unpublish.
        api.update({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "2", "b": "x"}})
        wait_for(lambda: read(config / "a") == "2", timeout_s=5)
        wait_for(lambda: read(info / "conf" / "a") == "2", timeout_s=5)
        for name in ("config", "creds", "info"):
            kubelet.unpublish(web, name)
        assert mounts_below(kubelet_dir) == []
        assert recorded(agent.root) == []


def test_an_object_edited_before_the_publish_is_served_as_the_store_holds_it(
    api: ApiServer, csi_agent: Callable[..., Any]
) -> None:
    """A volume prepared from an object that changes before kubelet publishes it is prepared
    again; a publish that comes in between takes the publish path. Either way the publish serves
    what the store holds when it comes, never the version the volume was prepared from."""
    api.create({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "1"}})
    web = pod(volumes=[csi_volume("config", configMap="app")])
    with csi_agent() as (agent, kubelet):
        api.create(web)
        wait_for(lambda: csi_statistics(agent)["prepared"] == 1)
        api.update({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "2"}})
        agent.wait_reconciled()  # the store holds the edit
        assert (kubelet.publish(web, "config") / "a").read_text() == "2"
        api.update({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "3"}})
        wait_for(lambda: read(kubelet.target(web, "config") / "a") == "3", timeout_s=5)


def test_publishes_racing_the_preparation_of_an_edit_serve_every_later_edit(
    api: ApiServer, csi_agent: Callable[..., Any]
) -> None:
    """An edit makes the preparer prepare its volume again while kubelet's publish may come:
    whichever path the publish takes, the volume it sets up is the one later edits reach (the
    set-up and a preparation take the same place among the subtree's users; each volume here
    has a subtree of its own, which the other's release would remove)."""
    many = {f"k{n}": "v" for n in range(2000)}  # a preparation that takes its time

    def config(i: int, value: str) -> dict[str, Any]:
        return {"kind": "ConfigMap", "metadata": {"name": f"app{i}"}, "data": {"a": value, **many}}

    with csi_agent() as (agent, kubelet):
        targets = []
        for i in range(8):
            api.create(config(i, "0"))
            web = pod(
                f"web{i}",
                f"dddddddd-0000-4000-8000-00000000010{i}",
                volumes=[csi_volume("config", configMap=f"app{i}")],
            )
            api.create(web)
            wait_for(lambda: csi_statistics(agent)["prepared"] == 1)
            api.update(config(i, "1"))
            time.sleep(0.002 * i)  # the publish at another moment of the new preparation
            targets.append(kubelet.publish(web, "config"))
        for i in range(8):
            api.update(config(i, "last"))
        wait_for(lambda: all(read(t / "a") == "last" for t in targets), timeout_s=5)


def test_a_volume_prepared_for_a_pod_that_goes_before_its_publish_is_released(
    api: ApiServer, csi_agent: Callable[..., Any]
) -> None:
    api.create({"kind": "ConfigMap", "metadata": {"name": "solo"}, "data": {"a": "1"}})
    with csi_agent() as (agent, _):
        before = agent.live_statistics()["publisher"]["volumes"]
        api.create(pod(volumes=[csi_volume("config", configMap="solo")]))
        wait_for(lambda: csi_statistics(agent)["prepared"] == 1)
        assert agent.live_statistics()["publisher"]["volumes"] == before + 1
        api.delete("Pod", "default", "web")
        wait_for(lambda: csi_statistics(agent)["prepared"] == 0)
        wait_for(lambda: agent.live_statistics()["publisher"]["volumes"] == before)


def test_a_stopping_pod_has_nothing_prepared_and_what_was_is_released(
    api: ApiServer, csi_agent: Callable[..., Any]
) -> None:
    """kubelet publishes nothing more for a pod being deleted or finished (it stops the pod's
    containers instead). A volume prepared for a pod deleted before its publish is released at
    once, and a finished pod whose volume kubelet unpublished is never prepared again, however
    often it changes afterwards (a Job's pod, kept until someone deletes it: the job
    controller takes its finalizer away, a label changes)."""
    api.create({"kind": "ConfigMap", "metadata": {"name": "solo"}, "data": {"a": "1"}})
    api.create({"kind": "ConfigMap", "metadata": {"name": "other"}, "data": {"a": "1"}})
    solo = csi_volume("config", configMap="solo")
    own = csi_volume("config", volume='{"configMap": {"name": "solo", "defaultMode": 256}}')
    with csi_agent() as (agent, kubelet):
        before = agent.live_statistics()["publisher"]["volumes"]
        api.create(pod("early", "dddddddd-0000-4000-8000-000000000011", volumes=[solo]))
        wait_for(lambda: csi_statistics(agent)["prepared"] == 1)
        assert len(staged(agent.root)) == 1
        api.delete("Pod", "default", "early", grace_period_s=30)
        assert api.get("Pod", "default", "early") is not None  # being deleted
        wait_for(lambda: csi_statistics(agent)["prepared"] == 0)
        wait_for(lambda: agent.live_statistics()["publisher"]["volumes"] == before)
        assert staged(agent.root) == []  # its record, written ahead, went with it
        # A running pod keeps the job's ConfigMap read; the job's volume has a subtree of its
        # own (another mode).
        api.create(pod("keeper", "dddddddd-0000-4000-8000-000000000012", volumes=[solo]))
        job = api.create(pod("job", volumes=[own], restartPolicy="Never"))
        wait_for(lambda: csi_statistics(agent)["prepared"] == 2)
        assert (kubelet.publish(job, "config") / "a").read_text() == "1"
        job["status"] = {"phase": "Succeeded"}
        job = api.update(job)
        kubelet.unpublish(job, "config")
        publishes = agent.live_statistics()["publisher"]["publishes"]
        job["metadata"]["labels"]["done"] = "yes"
        api.update(job)
        # A pod created after the job's last change is prepared after that change was seen.
        later = pod(
            "later",
            "dddddddd-0000-4000-8000-000000000013",
            volumes=[csi_volume("config", configMap="other")],
        )
        api.create(later)
        wait_for(lambda: csi_statistics(agent)["prepared"] >= 2)
        agent.wait_reconciled()
        assert csi_statistics(agent) == {"published": 0, "prepared": 2, "prepared_publishes": 1}
        publisher = agent.live_statistics()["publisher"]
        assert publisher["volumes"] == before + 2  # the keeper's and the later pod's
        assert publisher["publishes"] == publishes + 1  # and nothing was served for the job


def test_a_publish_unlike_the_prepared_volume_takes_the_publish_path(
    api: ApiServer, csi_agent: Callable[..., Any], kubelet_dir: Path
) -> None:
    """kubelet's request is compared whole with the one the volume was prepared for: another
    fsGroup (a pod whose fsGroup kubelet read otherwise) is served by the publish path, with
    that fsGroup, and the prepared volume is released. kubelet's tokens are not compared: with
    `tokenRequests`, every publish carries them."""
    api.create({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "1"}})
    web = pod(volumes=[csi_volume("config", configMap="app"), csi_volume("other", configMap="app")])
    with csi_agent() as (agent, kubelet):
        api.create(web)
        wait_for(lambda: csi_statistics(agent)["prepared"] == 2)
        as_kubelet_read_it = {**web, "spec": {**web["spec"], "securityContext": {"fsGroup": 3000}}}
        config = kubelet.publish(as_kubelet_read_it, "config")
        assert (config / "..data").stat().st_gid == 3000
        other = kubelet.publish(web, "other", tokens={"vault": "token-1"})
        assert (other / "a").read_text() == "1"
        assert csi_statistics(agent) == {"published": 2, "prepared": 0, "prepared_publishes": 1}
        for name in ("config", "other"):
            kubelet.unpublish(web, name)
        assert mounts_below(kubelet_dir) == []


def test_a_prepared_volume_whose_target_is_below_a_symlink_is_refused_and_bound_nowhere(
    api: ApiServer, csi_agent: Callable[..., Any], kubelet_dir: Path, tmp_path: Path
) -> None:
    """The request is compared as kubelet sends it, but the directories above the target are
    checked all the same: a volume directory that is a symlink (to anywhere) gets the publish
    path's refusal, and no bind is made through it."""
    api.create({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "1"}})
    web = pod(volumes=[csi_volume("config", configMap="app")])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with csi_agent() as (agent, kubelet):
        api.create(web)
        wait_for(lambda: csi_statistics(agent)["prepared"] == 1)
        volumes = kubelet_dir / "pods" / UID / "volumes" / "kubernetes.io~csi"
        volumes.mkdir(parents=True)
        (volumes / "config").symlink_to(elsewhere)
        with pytest.raises(grpc.RpcError) as refused:
            kubelet.publish(web, "config")
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a directory kubelet made" in (refused.value.details() or "")
        assert mounts_below(kubelet_dir) == []
        assert mounts_below(elsewhere) == []
        assert csi_statistics(agent)["prepared_publishes"] == 0


def test_volumes_a_tenant_made_unpreparable_are_refused_at_their_publish_as_before(
    api: ApiServer, csi_agent: Callable[..., Any]
) -> None:
    """Whatever a tenant writes in a pod's attributes is read when the pod arrives: what does
    not check is not prepared, its publish refuses it with the reason, and the pod's other
    volumes are prepared and published all the same."""
    api.create({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "1"}})
    bomb = (
        "a: &a ["
        + ",".join(["*a"] * 9)
        + "]\n"
        + "".join(
            f"{c}: &{c} [" + ",".join([f"*{p}"] * 9) + "]\n"
            for p, c in zip("abcdefgh", "bcdefghi", strict=True)
        )
    )
    web = pod(
        volumes=[
            csi_volume("config", configMap="app"),
            csi_volume("bomb", volume=bomb),
            csi_volume("elsewhere", volume='{"configMap": {"name": "app", "namespace": "kube"}}'),
            csi_volume("deep", volume="[" * 10000 + "]" * 10000),
        ]
    )
    with csi_agent() as (agent, kubelet):
        api.create(web)
        wait_for(lambda: csi_statistics(agent)["prepared"] == 1)
        time.sleep(0.2)  # the others had their chance
        assert csi_statistics(agent)["prepared"] == 1
        for name, code in (
            ("bomb", grpc.StatusCode.INVALID_ARGUMENT),
            ("elsewhere", grpc.StatusCode.PERMISSION_DENIED),
            ("deep", grpc.StatusCode.INVALID_ARGUMENT),
        ):
            with pytest.raises(grpc.RpcError) as refused:
                kubelet.publish(web, name)
            assert refused.value.code() == code, refused.value.details()
        assert (kubelet.publish(web, "config") / "a").read_text() == "1"
        assert csi_statistics(agent)["prepared_publishes"] == 1
