"""`--csi-read-as pod`: a CSI volume's ConfigMaps and Secrets are read with its pod's own token
(the one kubelet passes for the API server's audience), so the pod's RBAC decides what it may
mount; the agent runs with an identity that may read no ConfigMap and no Secret at all."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from tests.agent import NODE, running_agent, wait_for
from tests.csi.conftest import csi_volume, pod
from tests.csi.kubelet import DRIVER, Kubelet

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tests.agent import AgentProcess
    from tests.helpers.apiserver import ApiServer

AGENT_TOKEN = "agent-without-secrets"
AGENT_USER = "system:serviceaccount:fusevol:fusevol"
ACCOUNT = "app-sa"
SUBJECT = f"system:serviceaccount:default:{ACCOUNT}"
OTHER_UID = "dddddddd-0000-4000-8000-0000000000aa"


def configmap(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def secret(name: str, data: dict[str, str]) -> dict[str, Any]:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {"kind": "Secret", "metadata": {"name": name}, "data": encoded}


def grant_read(api: ApiServer, subject: str, resource: str, name: str) -> None:
    """A Role of `get, list, watch` on the one object, bound to `subject`."""
    for verb in ("get", "list", "watch"):
        api.allow(subject, verb, resource, name=name, namespace="default")


@pytest.fixture
def agent_as_pods(
    api: ApiServer, tmp_path: Path, kubelet_dir: Path
) -> Iterator[tuple[AgentProcess, Kubelet]]:
    """The agent with `--csi-read-as pod`, as a user the chart's RBAC of that mode makes: this
    node's pods and events, no ConfigMap, no Secret, no token."""
    api.users[AGENT_TOKEN] = (AGENT_USER, ["system:serviceaccounts"])
    for verb in ("list", "watch"):
        api.allow(AGENT_USER, verb, "pods")
    for verb in ("create", "patch"):
        api.allow(AGENT_USER, verb, "events")
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", token=AGENT_TOKEN)
    socket = tmp_path / "plugins" / DRIVER / "csi.sock"
    args = (
        *("--kubeconfig", str(kubeconfig), "--csi-read-as", "pod"),
        *("--csi-endpoint", f"unix://{socket}", "--kubelet-dir", str(kubelet_dir)),
        *("--csi-token-requests", "false"),
    )
    with running_agent(None, tmp_path / "root", *args) as agent:
        kubelet = Kubelet(kubelet_dir, socket, NODE)
        try:
            yield agent, kubelet
        finally:
            kubelet.close()
        agent.stop()


def refused(call: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as failed:
        call()
    return failed.value


def test_the_pods_rbac_decides_what_it_mounts(
    api: ApiServer, agent_as_pods: tuple[AgentProcess, Kubelet]
) -> None:
    agent, kubelet = agent_as_pods
    api.service_accounts.add(("default", ACCOUNT))
    api.create(configmap("app", {"a": "1"}))
    api.create(secret("creds", {"password": "s3cret"}))
    web = pod(
        volumes=[csi_volume("config", configMap="app"), csi_volume("creds", secret="creds")],
        serviceAccountName=ACCOUNT,
    )
    api.create(web)
    token = api.issue_token("default", ACCOUNT, "web")
    grant_read(api, SUBJECT, "configmaps", "app")

    config = kubelet.publish(web, "config", tokens={"": token})
    assert (config / "a").read_text() == "1"

    # The Secret: not the pod's to read. PERMISSION_DENIED, naming it and the account.
    error = refused(lambda: kubelet.publish(web, "creds", tokens={"": token}))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert (
        f'secrets "creds" is forbidden: User "{SUBJECT}" cannot get resource "secrets" in API '
        'group "" in the namespace "default"'
    ) in str(error.details())
    # Granted (a Role and its RoleBinding): kubelet's next retry succeeds.
    grant_read(api, SUBJECT, "secrets", "creds")
    creds = kubelet.publish(web, "creds", tokens={"": token})
    assert (creds / "password").read_text() == "s3cret"

    # Read as the pod, kept current by a watch made with its token.
    api.update(configmap("app", {"a": "2"}))
    wait_for(lambda: (config / "a").read_text() == "2")

    # Without the pod's token for the API server's audience, nothing is read.
    no_token = refused(lambda: kubelet.publish(web, "creds", tokens={"vault": "x"}))
    assert "kubelet passed no token for the API server's audience" in str(no_token.details())
    # Every read was the pod's: one made with the agent's identity would have been refused,
    # and logged as an ERROR (which fails the test).
    assert "read refused" not in agent.log_text()


def test_one_copy_and_one_watch_for_every_pod_that_may_read_it(
    api: ApiServer, agent_as_pods: tuple[AgentProcess, Kubelet]
) -> None:
    agent, kubelet = agent_as_pods
    api.service_accounts.update({("default", ACCOUNT), ("default", "other-sa")})
    api.create(configmap("app", {"a": "1"}))
    first = pod(volumes=[csi_volume("config", configMap="app")], serviceAccountName=ACCOUNT)
    second = pod(
        "second",
        OTHER_UID,
        volumes=[csi_volume("config", configMap="app")],
        serviceAccountName="other-sa",
    )
    api.create(first)
    api.create(second)
    grant_read(api, SUBJECT, "configmaps", "app")
    grant_read(api, "system:serviceaccount:default:other-sa", "configmaps", "app")
    targets = [
        kubelet.publish(each, "config", tokens={"": api.issue_token("default", account, name)})
        for each, account, name in ((first, ACCOUNT, "web"), (second, "other-sa", "second"))
    ]
    assert [(t / "a").read_text() for t in targets] == ["1", "1"]
    assert api.open_watches("configmaps") == [("configmaps", "default", "metadata.name=app")]
    wait_for(lambda: agent.snapshot()["statistics"]["source"]["objects"]["watches"] == 1)
    # The first pod goes: the second's token keeps the watch going.
    kubelet.unpublish(first, "config")
    api.update(configmap("app", {"a": "2"}))
    wait_for(lambda: (targets[1] / "a").read_text() == "2")
