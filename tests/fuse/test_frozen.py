"""A frozen volume never hides (`fusevol.observe.frozen`): a container whose private bind still
shows a connection no agent serves is named in `fusevol status`, in /metrics and in the log (the
API source also records a Warning event on the pod), until that container is gone."""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING, Any

from fusevol.observe.frozen import CHECK_S
from tests.agent import AgentProcess, running_agent, wait_for
from tests.helpers.apiserver import running_apiserver
from tests.kube.conftest import UID, configmap, configmap_volume, pod
from tests.manifests import POD_UID

if TYPE_CHECKING:
    from pathlib import Path

HOLD = """
import os, subprocess, sys, time
flag, volumes = sys.argv[1], sys.argv[2:]
for volume in volumes:
    seen_at = os.path.join(flag, os.path.basename(volume))
    os.mkdir(seen_at)
    subprocess.run(["mount", "--bind", volume, seen_at], check=True)
open(os.path.join(flag, "ready"), "w").close()
time.sleep(3600)
"""
"""A container: a process in a private mount namespace (`unshare --mount --propagation private`,
as runc's) that reads its volumes at paths of its own (`<flag>/<volume>`), through copies of their
binds made before the agent died."""
CONTAINER = ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", HOLD]
"""`CONTAINER + [flag, *volumes]` runs one."""


def frozen_gauge(agent: AgentProcess) -> dict[tuple[str, str, str], float]:
    return {
        (labels["namespace"], labels["pod"], labels["volume"]): value
        for labels, value in agent.samples("fusevol_frozen_volumes")
    }


def test_a_container_left_on_a_dead_connection_is_named_until_it_goes(
    manifests: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    first = AgentProcess(manifests=manifests, root=root).start()
    first.wait_state(POD_UID, "config", "mounted")
    volume = first.volume(POD_UID, "configmap", "config")
    flag = tmp_path / "flag"
    flag.mkdir()
    volumes = [volume, first.volume(POD_UID, "secret", "creds")]
    container = subprocess.Popen([*CONTAINER, str(flag), *map(str, volumes)])
    # A build tool's namespace (buildah's): a private copy of the node's table, reading nothing.
    (builder_flag := tmp_path / "builder").mkdir()
    builder = subprocess.Popen([*CONTAINER, str(builder_flag)])
    try:
        wait_for((flag / "ready").exists)
        wait_for((builder_flag / "ready").exists)
        # kill -9 of `fusevol run` and its agent, outside systemd and with no holder: nothing
        # keeps the connection, the next agent mounts a new one and stacks its binds.
        first.kill_all()
        expected = r"frozen volume pod=default/web volume=(config|creds): .* 1 container\(s\) read"
        first.expect_log(expected)  # the same log file as the next agent's
        with running_agent(manifests, root, expect_log=(expected,)) as agent:
            agent.wait_state(POD_UID, "config", "mounted")
            wait_for(lambda: agent.snapshot().get("frozen_volumes"), timeout_s=10)
            # The container reads both of the pod's volumes through copies of the old binds.
            entries = {e["volume"]: e for e in agent.snapshot()["frozen_volumes"]}
            assert sorted(entries) == ["config", "creds"]
            entry = entries["config"]
            assert (entry["namespace"], entry["pod"], entry["containers"]) == ("default", "web", 1)
            assert entry["path"] == str(volume)
            assert "no fusevol agent serves" in entry["message"]
            assert 'FROZEN pod default/web: volume "config"' in agent.status()
            assert frozen_gauge(agent) == {
                ("default", "web", "config"): 1.0,
                ("default", "web", "creds"): 1.0,
            }
            # Only the container's copy is frozen: the node's path serves the new connection.
            assert (volume / "a").read_text() == "alpha"

            container.kill()
            container.wait(timeout=10)
            wait_for(lambda: not agent.snapshot().get("frozen_volumes"), timeout_s=CHECK_S * 2)
            assert "FROZEN" not in agent.status()
            assert frozen_gauge(agent) == {}
            agent.stop()
    finally:
        for process in (container, builder):
            process.kill()
            process.wait(timeout=10)


def test_with_the_api_source_the_pod_gets_a_warning_event(tmp_path: Path) -> None:
    """The same, with the Kubernetes API source: a Warning event `FrozenVolume` on the pod,
    naming the volume."""
    with running_apiserver() as api:
        api.create(configmap("app", {"a": "1"}))
        api.create(pod(volumes=[configmap_volume("config", "app")]))
        kubeconfig = ("--kubeconfig", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        root = tmp_path / "root"
        first = AgentProcess(manifests=None, root=root, extra_args=kubeconfig).start()
        volume = first.wait_mounted(first.volume(UID, "configmap", "config"))
        flag = tmp_path / "flag"
        flag.mkdir()
        container = subprocess.Popen([*CONTAINER, str(flag), str(volume)])
        try:
            wait_for((flag / "ready").exists)
            first.kill_all()
            expected = r"frozen volume pod=default/web volume=config: "
            first.expect_log(expected)
            with running_agent(None, root, *kubeconfig, expect_log=(expected,)) as agent:
                agent.wait_mounted(volume)

                def events() -> list[dict[str, Any]]:
                    return [e for e in api.events.values() if e["reason"] == "FrozenVolume"]

                [event] = wait_for(events, timeout_s=10)
                assert event["type"] == "Warning"
                assert event["involvedObject"]["uid"] == UID
                assert event["message"].startswith('volume "config" is bound to a FUSE connection')
                agent.stop()
        finally:
            container.kill()
            container.wait(timeout=10)
