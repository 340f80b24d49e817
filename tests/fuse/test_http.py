"""/healthz, /readyz, /status and /metrics after a scenario: the counters moved."""

from __future__ import annotations

import json
import os
import re
from typing import TYPE_CHECKING

from tests.agent import AgentProcess, wait_for, write_atomically
from tests.manifests import POD_UID, configmap

if TYPE_CHECKING:
    from pathlib import Path


def sample(metrics: str, name: str, **labels: str) -> float:
    """The value of one sample of the Prometheus text `metrics` (0 if absent)."""
    for line in metrics.splitlines():
        match = re.fullmatch(r"([a-z_]+)(?:\{(.*)\})? (\S+)", line)
        if not match or match[1] != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match[2] or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(match[3])
    return 0.0


def test_health_and_readiness(agent: AgentProcess) -> None:
    assert agent.http_get("/healthz") == (200, "ok\n")
    assert agent.http_get("/readyz") == (200, "ok\n")
    assert agent.http_get("/nope")[0] == 404
    status = json.loads(agent.http_get("/status")[1])
    assert [p["uid"] for p in status["pods"]] == [POD_UID]


def test_metrics_move_with_a_scenario(agent: AgentProcess, manifests: Path) -> None:
    before = agent.http_get("/metrics")[1]
    configmap_volumes = {"plugin_name": "kubernetes.io/configmap"}
    assert (
        sample(
            before,
            "volume_manager_total_volumes",
            state="actual_state_of_world",
            **configmap_volumes,
        )
        == 1
    )
    assert (
        sample(
            before,
            "volume_manager_total_volumes",
            state="desired_state_of_world",
            **configmap_volumes,
        )
        == 1
    )
    mounts = sample(
        before,
        "storage_operation_duration_seconds_count",
        volume_plugin="kubernetes.io/configmap",
        operation_name="volume_mount",
        status="success",
    )
    assert mounts == 1
    assert sample(before, "fusevol_objects", kind="ConfigMap") == 1

    volume = agent.volume(POD_UID, "configmap", "config")
    write_atomically(manifests / "configmap.yaml", configmap(a="2"))
    wait_for(lambda: (volume / "a").read_text() == "2")
    # The new version's pages were put in the kernel's page cache before it showed: drop them,
    # so that a read asks the agent.
    fd = os.open(volume / "b", os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    for _ in range(10):
        (volume / "b").read_text()

    after = agent.http_get("/metrics")[1]
    assert sample(after, "fusevol_update_propagation_seconds_count") >= 1
    assert sample(after, "fusevol_update_propagation_seconds_bucket", le="1.0") >= 1
    assert sample(after, "fusevol_fuse_requests_total", operation="lookup") > sample(
        before, "fusevol_fuse_requests_total", operation="lookup"
    )
    assert sample(after, "fusevol_fuse_read_bytes_total") > sample(
        before, "fusevol_fuse_read_bytes_total"
    )
    assert (
        sample(
            after,
            "storage_operation_duration_seconds_count",
            volume_plugin="kubernetes.io/configmap",
            operation_name="volume_mount",
            status="success",
        )
        == 2  # the set-up and the refresh
    )


def listening_addresses(port: int) -> set[str]:
    """The local addresses of every TCP socket listening on `port` (/proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, _, hex_port = local.partition(":")
                if state == "0A" and int(hex_port, 16) == port:
                    found.add(address)
    return found


def test_the_endpoints_listen_on_loopback_unless_told(agent: AgentProcess) -> None:
    """`/status` names the node's pods and their errors: by default only this host may ask (and
    of its users root, or a caller with a token: tests/security/test_http_and_names.py)."""
    match = re.search(r"http listening address=(\S*):(\d+)", agent.log_text())
    assert match is not None
    assert match[1] == "127.0.0.1"
    assert listening_addresses(int(match[2])) == {"0100007F"}  # 127.0.0.1, nothing else
    assert agent.http_get("/healthz") == (200, "ok\n")
