"""Fixtures for the Kubernetes API source: a loopback API server and the real agent talking to it.

The agent is a real child process, its HTTP/2 client configured by the `kubernetes` package from a
kubeconfig (the server's CA, a bearer token), against `tests.helpers.apiserver`; the tests change
the cluster through the server's Python methods, as a controller would through the API.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any

import pytest

from tests.agent import NODE, running_agent
from tests.helpers.apiserver import ApiServer, running_apiserver

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.agent import AgentProcess

Obj = dict[str, Any]
UID = "cccccccc-0000-4000-8000-000000000001"


def configmap(name: str, data: dict[str, str], **extra: Any) -> Obj:
    return {"kind": "ConfigMap", "metadata": {"name": name}, "data": data, **extra}


def pod(name: str = "web", uid: str = UID, *, node: str = NODE, **spec: Any) -> Obj:
    return {
        "kind": "Pod",
        "metadata": {"name": name, "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": "c"}], **spec},
    }


def configmap_volume(name: str, configmap_name: str, **extra: Any) -> Obj:
    return {"name": name, "configMap": {"name": configmap_name, **extra}}


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with running_apiserver() as server:
        yield server


@pytest.fixture
def kube_agent(api: ApiServer, kube_agent_on: Callable[..., Any]) -> Callable[..., Any]:
    """`with kube_agent(*args) as agent:` runs the agent on `api`; a clean stop is checked.
    `expect_log`: as `tests.agent.running_agent`'s."""
    return functools.partial(kube_agent_on, api)


@pytest.fixture
def kube_agent_on(tmp_path: Path) -> Callable[..., Any]:
    """`with kube_agent_on(server, *args) as agent:` as `kube_agent`, on an API server the test
    made itself."""

    @contextlib.contextmanager
    def start(
        server: ApiServer, *args: str, expect_log: tuple[str, ...] = ()
    ) -> Iterator[AgentProcess]:
        config = ("--kubeconfig", str(server.write_kubeconfig(tmp_path / "kubeconfig")))
        with running_agent(None, tmp_path / "root", *config, *args, expect_log=expect_log) as a:
            yield a
            a.stop()

    return start
