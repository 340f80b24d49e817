"""Fixtures for the CSI node plugin: the loopback API server, the real agent serving CSI on a unix
socket (`--csi-endpoint`, `--kubelet-dir` a temporary directory), and `Kubelet`, which plays
kubelet v1.28's CSI volume plugin against it."""

from __future__ import annotations

import contextlib
import subprocess
from typing import TYPE_CHECKING, Any

import pytest

from tests.agent import NODE, mounts_below, running_agent
from tests.csi.kubelet import DRIVER, Kubelet
from tests.helpers.apiserver import ApiServer, running_apiserver

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.agent import AgentProcess

Obj = dict[str, Any]
UID = "dddddddd-0000-4000-8000-000000000001"


def csi_volume(name: str, **attributes: str) -> Obj:
    return {
        "name": name,
        "csi": {"driver": DRIVER, "readOnly": True, "volumeAttributes": attributes},
    }


def pod(name: str = "web", uid: str = UID, *, volumes: list[Obj], **spec: Any) -> Obj:
    return {
        "kind": "Pod",
        "metadata": {"name": name, "uid": uid, "labels": {"app": name}},
        "spec": {"nodeName": NODE, "containers": [{"name": "c"}], "volumes": volumes, **spec},
    }


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with running_apiserver() as server:
        yield server


@pytest.fixture
def kubelet_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "kubelet"
    path.mkdir()
    yield path
    for mount in reversed(mounts_below(path)):
        subprocess.run(["umount", "-l", mount], check=False)


@pytest.fixture
def csi_agent(
    api: ApiServer, tmp_path: Path, kubelet_dir: Path
) -> Callable[..., contextlib.AbstractContextManager[tuple[AgentProcess, Kubelet]]]:
    """`with csi_agent() as (agent, kubelet):` the agent serving CSI, and kubelet talking to it;
    `csi_agent(kubeconfig=PATH)`: as the identity that kubeconfig names (the API server's admin's
    by default)."""
    admin = api.write_kubeconfig(tmp_path / "kubeconfig")
    socket = tmp_path / "plugins" / DRIVER / "csi.sock"

    @contextlib.contextmanager
    def start(*args: str, kubeconfig: Path = admin) -> Iterator[tuple[AgentProcess, Kubelet]]:
        extra = ("--csi-endpoint", f"unix://{socket}", "--kubelet-dir", str(kubelet_dir))
        root = tmp_path / "root"
        with running_agent(None, root, "--kubeconfig", str(kubeconfig), *extra, *args) as agent:
            kubelet = Kubelet(kubelet_dir, socket, NODE)
            try:
                yield agent, kubelet
            finally:
                kubelet.close()

    return start


@pytest.fixture
def reference_agent(api: ApiServer, tmp_path: Path) -> Iterator[AgentProcess]:
    """An agent on the same API server serving the pods' own volumes (pod directories): the
    yardstick for what a CSI volume of the same source must hold."""
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig-ref")
    # It sees the pods' CSI volumes too, and fails them: CSI is kubelet's business.
    csi = ("mount failed .*volume type 'csi' is not supported by fusevol",)
    config = ("--kubeconfig", str(kubeconfig))
    with running_agent(None, tmp_path / "ref-root", *config, expect_log=csi) as agent:
        yield agent
