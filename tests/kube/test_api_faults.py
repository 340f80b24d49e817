"""A sick API server: what is served stays served, and the agent converges once it is healthy.

Four API faults, each injected by the loopback server (`ApiServer.set_fault`) for longer
than the reflector's first backoff steps (0.8 s, 1.6 s): every request answered 500, every watch
answered 410 Gone, every request stalled (read, never answered), every connection dropped. Under
each, a pod's ConfigMap volume keeps its content, the agent stays alive and `/healthz` says ok,
its log says what happens without a storm of errors, and the agent does not hammer the server
(client-go's reflector backs off, 410s included). Once the fault is cleared, an update of the
ConfigMap reaches the pod within `CONVERGE_S`.

The loopback API server and its agent fixture are tests/kube's.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from tests.agent import wait_for
from tests.helpers.apiserver import FAULTS
from tests.kube.conftest import UID, configmap, configmap_volume, pod

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any

    from tests.helpers.apiserver import ApiServer

FAULT_S = 4.0
"""Past the first backoff steps (0.8 s, then 1.6 s, jittered up to twice that)."""
CONVERGE_S = 10.0
MAX_REQUESTS = 12
"""Requests for the ConfigMap during the fault: a few retries with backoff, never a tight loop."""
MAX_ERROR_LINES = 3


def read(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


@pytest.mark.parametrize("mode", FAULTS)
def test_a_sick_api_server_changes_nothing_served_and_the_agent_converges_after(
    api: ApiServer, kube_agent: Callable[..., Any], mode: str
) -> None:
    api.create(configmap("app", {"a": "1"}))
    api.create(pod(volumes=[configmap_volume("config", "app")]))
    with kube_agent() as agent:
        agent.expect_log("watch failed ", "http2 connection lost ", "API server unreachable")
        key = agent.wait_mounted(agent.volume(UID, "configmap", "config")) / "a"
        assert key.read_text() == "1"
        agent.wait_state(UID, "config", "mounted")
        log_offset = len(agent.log_text())
        before, dropped = api.count("GET", "configmaps"), api.dropped
        api.set_fault(mode)
        if mode == "stall":  # the watches die as it stalls: reconnecting meets the stall
            api.cut_watches()
        try:
            deadline = time.monotonic() + FAULT_S
            while time.monotonic() < deadline:
                assert key.read_text() == "1"
                assert agent.volume_status(UID, "config")["state"] == "mounted"
                assert agent.http_get("/healthz") == (200, "ok\n")
                time.sleep(0.2)
            assert agent.agent_alive()
            during, bound = api.count("GET", "configmaps") - before, MAX_REQUESTS
            if mode == "drop":  # closed unread, so counted for the pods', the ConfigMap's,
                # the PVs' and the claims' reflectors together
                during, bound = api.dropped - dropped, 4 * MAX_REQUESTS
        finally:
            api.set_fault(None)
        assert during >= 1
        assert during <= bound, f"{during} requests in {FAULT_S}s: no backoff"
        started = time.monotonic()
        api.update(configmap("app", {"a": "2"}))
        wait_for(lambda: read(key) == "2", timeout_s=CONVERGE_S)
        print(
            f"{mode}: {during} requests during the fault, converged in "
            f"{time.monotonic() - started:.1f}s"
        )
        log = agent.log_text()[log_offset:]
        assert "Traceback" not in log, log
        errors = [line for line in log.splitlines() if " ERROR " in line]
        assert len(errors) <= MAX_ERROR_LINES, log
        if mode == "410":
            assert "watch expired, relisting" in log, log
        else:  # for a stall: the cut watches; the stalled ones wait (well within the timeout)
            assert "watch failed" in log, log
