"""The agent as its node: kubelet's credentials (a client certificate for `system:node:<name>`
in `system:nodes`) over the agent's own HTTP/2 transport, within kube's Node authorizer and
NodeRestriction, as the loopback API server enforces them (`tests.helpers.authz`)."""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from fusevol.base.settings import DEFAULT_KUBELET_DIR
from fusevol.kube import kubelet_credentials
from fusevol.kube.client import KubeClient
from fusevol.kube.errors import ApiError, ApiUnavailable
from fusevol.model import Kind
from tests.agent import NODE, running_agent, wait_for
from tests.helpers import fake_node
from tests.helpers.h2server import certificates
from tests.kube.conftest import UID, configmap, configmap_volume, pod

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.agent import AgentProcess
    from tests.helpers.apiserver import ApiServer

OTHER_NODE = "other-node"
OTHER_UID = "cccccccc-0000-4000-8000-0000000000ff"
WINDOW_S = 6.0
"""How long the refused reads are counted: the reflector's backoff (0.8 s doubling, jittered)
allows at most 4 attempts in it, the token manager's (1 s doubling) 3; a hot retry makes
hundreds."""


def secret(name: str, data: dict[str, str]) -> dict[str, Any]:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {"kind": "Secret", "metadata": {"name": name}, "data": encoded}


VOLUMES = [
    configmap_volume("config", "app"),
    {"name": "creds", "secret": {"secretName": "creds"}},
    {
        "name": "token",
        "projected": {
            "sources": [
                {"serviceAccountToken": {"path": "token", "audience": "vault"}},
                {"configMap": {"name": "app"}},
            ]
        },
    },
]


@contextlib.contextmanager
def node_agent(
    api: ApiServer, tmp_path: Path, identity: str, *args: str, expect_log: tuple[str, ...] = ()
) -> Iterator[AgentProcess]:
    """The agent with kubelet's kubeconfig: a client certificate of node `identity`."""
    pem = certificates().client(f"system:node:{identity}", ("system:nodes",))
    kubeconfig = api.write_kubeconfig(tmp_path / "kubelet.conf", client_certificate=pem)
    with running_agent(
        None, tmp_path / "root", "--kubeconfig", str(kubeconfig), *args, expect_log=expect_log
    ) as agent:
        yield agent
        agent.stop()


def node_certificate(node: str) -> Path:
    return certificates().client(f"system:node:{node}", ("system:nodes",))


def in_cluster(api: ApiServer) -> dict[str, str]:
    """The in-cluster address of `api`, as a pod's environment has it."""
    return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port)}


def _claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


def test_as_its_node_the_agent_serves_its_pods_volumes(api: ApiServer, tmp_path: Path) -> None:
    api.create(configmap("app", {"a": "1"}))
    api.create(secret("creds", {"password": "s3cret"}))
    api.create(secret("theirs", {"x": "y"}))
    api.create(pod(volumes=VOLUMES))
    api.create(
        pod(
            "other",
            OTHER_UID,
            node=OTHER_NODE,
            volumes=[{"name": "s", "secret": {"secretName": "theirs"}}],
        )
    )
    with node_agent(api, tmp_path, NODE) as agent:
        config = agent.wait_mounted(agent.volume(UID, "configmap", "config"))
        assert (config / "a").read_text() == "1"
        creds = agent.wait_mounted(agent.volume(UID, "secret", "creds"))
        assert (creds / "password").read_text() == "s3cret"
        token = agent.wait_mounted(agent.volume(UID, "projected", "token"))
        claims = _claims((token / "token").read_text())
        assert claims["sub"] == "system:serviceaccount:default:default"
        assert claims["kubernetes.io"]["pod"] == {"name": "web", "uid": UID}
        # The watches by name work under the Node authorizer: an edit arrives.
        api.update(configmap("app", {"a": "2"}))
        wait_for(lambda: (config / "a").read_text() == "2")
        log = agent.log_text()
        assert log.count(f"node identity user=system:node:{NODE}:") == 1, log
        assert "hostpath provisioning and the watch of the cluster's claims are off" in log
        # Nothing the Node authorizer would refuse was asked for: no list of every claim, no
        # PV list, no StorageClass, nothing of the other node's pod.
        for resource in ("persistentvolumeclaims", "persistentvolumes", "storageclasses"):
            assert api.count("GET", resource) == 0, resource
        assert not [r for r in api.requests if r.path.endswith("/secrets/theirs")]
        assert " ERROR " not in log, log
        assert " WARNING " not in log, log


def test_a_kubeconfigs_embedded_key_is_used_and_never_written_to_a_file(
    api: ApiServer, tmp_path: Path
) -> None:
    """kubeadm's admin.conf form: CA, client certificate and key inside the kubeconfig. The
    agent authenticates with them, and none reaches a file: the `kubernetes` library would
    write each to $TMPDIR for the agent's lifetime, and a kill -9 would leave them there."""
    api.create(configmap("app", {"a": "1"}))
    api.create(pod(volumes=[configmap_volume("config", "app")]))
    pem = certificates().client(f"system:node:{NODE}", ("system:nodes",))
    kubeconfig = api.write_kubeconfig(
        tmp_path / "admin.conf", client_certificate=pem, embedded=True
    )
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    args = ("--kubeconfig", str(kubeconfig))
    with running_agent(None, tmp_path / "root", *args, env={"TMPDIR": str(tmpdir)}) as agent:
        config = agent.wait_mounted(agent.volume(UID, "configmap", "config"))
        assert (config / "a").read_text() == "1"
        assert f"node identity user=system:node:{NODE}:" in agent.log_text()
        assert list(tmpdir.iterdir()) == []
        agent.kill()
    assert list(tmpdir.iterdir()) == []


def test_the_objects_and_tokens_of_another_nodes_pods_are_refused_and_not_retried_hot(
    api: ApiServer, tmp_path: Path
) -> None:
    """Credentials of another node than `--node-name`: the API server refuses what that node's
    pods reference, and NodeRestriction its tokens; the agent says so, naming the object, and
    backs off."""
    api.create(configmap("app", {"a": "1"}))
    api.create(pod(volumes=[configmap_volume("config", "app"), VOLUMES[2]]))
    api.create(pod("other", OTHER_UID, node=OTHER_NODE))  # its service account: "default"
    expected = (
        "node identity system:node:other-node is not node",
        "read refused query=configmaps namespace=default fieldSelector=metadata.name=app",
        "TokenRequest failed pod=default/web",
        "mount failed",
    )
    with node_agent(api, tmp_path, OTHER_NODE, expect_log=expected) as agent:
        agent.wait_state(UID, "config", "failed")
        started = time.monotonic()
        before = api.count("GET", "configmaps")
        tokens_before = api.count("POST", "serviceaccounts/token")
        time.sleep(WINDOW_S)
        reads = api.count("GET", "configmaps") - before
        tokens = api.count("POST", "serviceaccounts/token") - tokens_before
        assert 1 <= reads <= 4, f"{reads} reads of the refused ConfigMap in {WINDOW_S}s"
        assert tokens <= 3, f"{tokens} TokenRequests in {time.monotonic() - started:.1f}s"
        log = agent.log_text()
        refusal = (
            'configmaps "app" is forbidden: User "system:node:other-node" cannot list resource '
            '"configmaps" in API group "" in the namespace "default": no relationship found '
            "between node 'other-node' and this object"
        )
        assert refusal in log, log
        # One line each, then quiet retries with backoff.
        assert log.count("ERROR fusevol.kube.reflector: read refused query=configmaps") == 1, log
        assert log.count("ERROR fusevol.source.kube.tokens: TokenRequest failed") == 1, log
        assert "node requested token bound to a pod scheduled on a different node" in log, log
        # The pod's FailedMount event says why, not merely "not found".
        events = [e for e in api.events.values() if e["reason"] == "FailedMount"]
        assert any(refusal in e["message"] for e in events), events
        # And /metrics counts the refusals, as client-go does (alert FusevolAPIRequestsRefused).
        refused = [
            sample
            for family in text_string_to_metric_families(agent.http_get("/metrics")[1])
            for sample in family.samples
            if sample.name == "rest_client_requests_total" and sample.labels["code"] == "403"
        ]
        assert sum(sample.value for sample in refused) >= reads, refused


@pytest.mark.parametrize(
    ("kind", "name", "status"),
    [
        pytest.param(Kind.SECRET, "mine", None, id="referenced-secret"),
        pytest.param(Kind.SECRET, "theirs", "no relationship", id="another-nodes-secret"),
        pytest.param(Kind.CONFIG_MAP, "lonely", "no relationship", id="unreferenced"),
        pytest.param(Kind.PERSISTENT_VOLUME_CLAIM, "data", None, id="referenced-claim"),
    ],
)
def test_the_api_server_double_decides_as_the_node_authorizer(
    api: ApiServer, tmp_path: Path, kind: Kind, name: str, status: str | None
) -> None:
    """GETs as node NODE, through the agent's client with the node's certificate."""
    claim_volume = {"name": "d", "persistentVolumeClaim": {"claimName": "data"}}
    api.create(pod(volumes=[{"name": "s", "secret": {"secretName": "mine"}}, claim_volume]))
    api.create(pod("other", OTHER_UID, node=OTHER_NODE, volumes=[
        {"name": "s", "secret": {"secretName": "theirs"}}
    ]))  # fmt: skip
    pem = certificates().client(f"system:node:{NODE}", ("system:nodes",))
    client = KubeClient(
        kubeconfig=api.write_kubeconfig(tmp_path / "kubelet.conf", client_certificate=pem)
    )

    async def get() -> str:
        try:
            await client.get(kind, namespace="default", name=name)
        except ApiError as exc:
            return str(exc)
        return "allowed"

    answer = trio.run(get)
    if status is None:
        assert answer == "allowed"
    else:
        resource = {Kind.SECRET: "secrets", Kind.CONFIG_MAP: "configmaps"}[kind]
        assert answer == (
            f'Forbidden: {resource} "{name}" is forbidden: User "system:node:{NODE}" cannot get '
            f'resource "{resource}" in API group "" in the namespace "default": no relationship '
            f"found between node '{NODE}' and this object"
        )
    # A claim may be read by GET only: never listed, even by name.
    if kind is Kind.PERSISTENT_VOLUME_CLAIM:

        async def listed() -> str:
            try:
                await client.list(kind, namespace="default", field_selector="metadata.name=data")
            except ApiError as exc:
                return str(exc)
            return "allowed"

        assert "can only get individual resources of this type" in trio.run(listed)


def test_kubeconfig_kubelet_finds_kubelets_client_certificate_and_runs_as_the_node(
    api: ApiServer, tmp_path: Path
) -> None:
    """`--kubeconfig kubelet` on a node (a fake one, below tmp_path) with no kubeconfig of
    kubelet's: the agent takes kubelet's current client certificate with the in-cluster API
    server and CA, and is its node."""
    api.create(configmap("app", {"a": "1"}))
    api.create(pod(volumes=[configmap_volume("config", "app")]))
    node = tmp_path / "node"
    current = fake_node.make(node, pem=node_certificate(NODE), ca=certificates().ca)
    with running_agent(
        None,
        tmp_path / "root",
        "--kubeconfig",
        "kubelet",
        env=in_cluster(api),
        wrapper=fake_node.wrapper(node),
    ) as agent:
        config = agent.wait_mounted(agent.volume(UID, "configmap", "config"))
        assert (config / "a").read_text() == "1"
        log = agent.log_text()
        found = (
            f"kubelet's credentials: client certificate={current} "
            f"server=https://127.0.0.1:{api.port} ca={node / fake_node.CA} "
            "(no kubeconfig of kubelet's found)"
        )
        assert log.count("kubelet's credentials:") == 1, log
        assert found in log, log
        assert log.count(f"node identity user=system:node:{NODE}:") == 1, log
        agent.stop()


def test_kubeconfig_kubelet_on_a_node_without_them_is_one_line_naming_the_paths(
    tmp_path: Path,
) -> None:
    node = tmp_path / "node"
    node.mkdir()
    argv = [*fake_node.wrapper(node), sys.executable, "-m", "fusevol", "run"]
    argv += ["--kubeconfig", "kubelet", "--root", str(tmp_path / "root"), "--http-port", "-1"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1, result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("fusevol: ")]
    assert line.startswith(
        f"fusevol: --kubeconfig kubelet: kubelet's credentials not found: no kubeconfig "
        f"{node}/etc/kubernetes/kubelet.conf, {node}/var/lib/kubelet/kubeconfig, "
    ), result.stderr
    assert line.endswith(
        f"no client certificate {node}/var/lib/kubelet/pki/kubelet-client-current.pem; give "
        "--kubeconfig PATH (the chart's rbac.node.kubeconfig)"
    ), result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_a_rotated_client_certificate_is_the_next_connections_identity(
    api: ApiServer, tmp_path: Path
) -> None:
    """kubelet's certificate manager switches `kubelet-client-current.pem` to a new file: the
    connection made after that presents the new certificate (here of another name, to tell)."""
    node = tmp_path / "node"
    fake_node.make(node, pem=node_certificate(NODE), ca=certificates().ca)
    found = kubelet_credentials.find(
        kubelet_dir=Path(DEFAULT_KUBELET_DIR), root=node, environ=in_cluster(api)
    )
    client = KubeClient(kubeconfig=found)

    async def node_name() -> str | None:
        with trio.fail_after(20):
            while True:
                try:
                    identity = await client.whoami()
                except ApiUnavailable:  # the server restarting
                    await trio.sleep(0.05)
                    continue
                assert identity is not None
                return identity.node

    async def rotate() -> tuple[str | None, str | None]:
        before = await node_name()
        fake_node.rotate(node, pem=node_certificate("rotated-node"))
        await trio.to_thread.run_sync(api.stop)  # the connection closes: the next is new
        await trio.to_thread.run_sync(api.start)
        return before, await node_name()

    assert trio.run(rotate) == (NODE, "rotated-node")
