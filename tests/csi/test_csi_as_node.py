"""The default install: the agent reads CSI volumes' objects as its node (kubelet's client
certificate, `system:node:<name>`), within the Node authorizer the loopback API server enforces
(`tests.helpers.authz`). A pod converted by the webhook's own conversion keeps naming the objects
its converted volumes read (their originals, unmounted), so the node may read them, updates
included; a `fusevol.io` volume whose pod names its object nowhere is refused, as another node's
object is."""

from __future__ import annotations

import base64
import copy
from typing import TYPE_CHECKING, Any

import grpc
import jsonpatch
import pytest

from fusevol.webhook.convert import Driver, convert_pod
from tests.agent import NODE, wait_for
from tests.csi.conftest import csi_volume, pod
from tests.helpers.h2server import certificates

if TYPE_CHECKING:
    import contextlib
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.agent import AgentProcess
    from tests.csi.kubelet import Kubelet
    from tests.helpers.apiserver import ApiServer

Obj = dict[str, Any]
CONVERTIBLE = Driver(requires_republish=True)
"""The CSIDriver the chart renders (no token requests: the pod's own service account volume is
left to kubelet, which changes nothing here)."""


def configmap(name: str, data: dict[str, str]) -> Obj:
    return {"kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def secret(name: str, data: dict[str, str]) -> Obj:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {"kind": "Secret", "metadata": {"name": name}, "data": encoded}


WRITTEN_VOLUMES = [
    {"name": "config", "configMap": {"name": "app"}},
    {"name": "creds", "secret": {"secretName": "creds"}},
    {
        "name": "info",
        "downwardAPI": {
            "items": [{"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]
        },
    },
    {
        "name": "all",
        "projected": {
            "sources": [
                {"configMap": {"name": "app", "items": [{"key": "a", "path": "cm/a"}]}},
                {"secret": {"name": "creds", "items": [{"key": "password", "path": "s/p"}]}},
            ]
        },
    },
]


def named_twice(name: str, uid: str, secret_name: str) -> Obj:
    """A pod whose `fusevol.io` volume's Secret an unmounted secret volume of its own names too
    (what `fusevol convert` writes): the Node authorizer lets its node read it."""
    return pod(
        name,
        uid,
        volumes=[
            csi_volume(secret_name, secret=secret_name),
            {"name": f"fusevol-ref-{secret_name}", "secret": {"secretName": secret_name}},
        ],
    )


def converted(written: Obj) -> Obj:
    """`written` as the webhook makes it (the conversion's JSON Patch, applied)."""
    conversion = convert_pod(copy.deepcopy(written), namespace="default", driver=CONVERTIBLE)
    assert conversion.converted == ("config", "creds", "info", "all"), conversion
    patched: Obj = jsonpatch.apply_patch(written, conversion.patch)
    return patched


@pytest.fixture
def node_agent(
    api: ApiServer,
    tmp_path: Path,
    csi_agent: Callable[..., contextlib.AbstractContextManager[tuple[AgentProcess, Kubelet]]],
) -> Iterator[tuple[AgentProcess, Kubelet]]:
    """The agent as its node, with kubelet's kubeconfig, serving CSI as the chart runs it."""
    pem = certificates().client(f"system:node:{NODE}", ("system:nodes",))
    kubeconfig = api.write_kubeconfig(tmp_path / "kubelet.conf", client_certificate=pem)
    with csi_agent("--csi-token-requests", "false", kubeconfig=kubeconfig) as started:
        yield started


def test_a_converted_pod_is_served_to_its_node_with_updates(
    api: ApiServer, node_agent: tuple[AgentProcess, Kubelet]
) -> None:
    agent, kubelet = node_agent
    api.create(configmap("app", {"a": "1"}))
    api.create(secret("creds", {"password": "s3cret"}))
    written = pod(volumes=copy.deepcopy(WRITTEN_VOLUMES))
    written["metadata"]["annotations"] = {"example.com/owner": 'team "web"'}
    web = converted(written)
    api.create(web)

    paths = {name: kubelet.publish(web, name) for name in ("config", "creds", "info", "all")}
    assert (paths["config"] / "a").read_text() == "1"
    assert (paths["creds"] / "password").read_text() == "s3cret"
    assert (paths["all"] / "cm" / "a").read_text() == "1"
    assert (paths["all"] / "s" / "p").read_text() == "s3cret"
    # kubelet's annotations file: the pod's own (the webhook's report included) and kubelet's.
    lines = (paths["info"] / "annotations").read_text().split("\n")
    assert [line.split("=", 1)[0] for line in lines] == [
        "example.com/owner",
        "fusevol.io/volumes",
        "kubernetes.io/config.seen",
        "kubernetes.io/config.source",
    ]
    assert lines[0] == 'example.com/owner="team \\"web\\""'
    assert lines[3] == 'kubernetes.io/config.source="api"'

    # Kept current by watches the node may make (by name, as kubelet's).
    api.update(configmap("app", {"a": "2"}))
    api.update(secret("creds", {"password": "n3w"}))
    wait_for(lambda: (paths["config"] / "a").read_text() == "2")
    wait_for(lambda: (paths["all"] / "s" / "p").read_text() == "n3w")
    # Another volume: its own refresh, which may end after this one's (a shared subtree's
    # refresh goes first, but the pass waits for it 50 ms at most: under load, longer).
    wait_for(lambda: (paths["creds"] / "password").read_text() == "n3w")
    # An annotation's edit shows, as kubelet rewrites the file on its sync.
    web["metadata"]["annotations"]["example.com/owner"] = "ops"
    api.update(web)
    wait_for(lambda: 'example.com/owner="ops"' in (paths["info"] / "annotations").read_text())
    log = agent.log_text()
    assert " ERROR " not in log, log
    assert "read refused" not in log


def test_an_object_its_pod_does_not_name_is_refused_to_the_node(
    api: ApiServer, node_agent: tuple[AgentProcess, Kubelet]
) -> None:
    """A hand-written `fusevol.io` volume names its Secret in an attribute, which the Node
    authorizer does not read: with its original beside it, unmounted (what `fusevol convert`
    writes), it is served; alone it is refused with the API server's reason, as kubelet would
    be refused a Secret no pod of its node names."""
    agent, kubelet = node_agent
    api.create(secret("creds", {"password": "s3cret"}))
    api.create(secret("loose", {"password": "nobody's"}))
    kept = named_twice("kept", "dddddddd-0000-4000-8000-0000000000b1", "creds")
    api.create(kept)
    # Read as the pod comes, before kubelet publishes (as kubelet registers a pod's objects).
    wait_for(lambda: ("secrets", "default", "metadata.name=creds") in api.open_watches())
    assert (kubelet.publish(kept, "creds") / "password").read_text() == "s3cret"

    bare = pod("bare", volumes=[csi_volume("loose", secret="loose")])
    api.create(bare)
    # Not before its publish: the node may not read what its pod names nowhere. (The next
    # pod's objects are read once the agent has seen both.)
    api.create(secret("later", {"k": "v"}))
    api.create(named_twice("later", "dddddddd-0000-4000-8000-0000000000b2", "later"))
    wait_for(lambda: ("secrets", "default", "metadata.name=later") in api.open_watches())
    assert not [r for r in api.requests if "loose" in r.query.get("fieldSelector", "")]
    agent.expect_log(
        "read refused query=secrets namespace=default fieldSelector=metadata.name=loose"
    )
    with pytest.raises(grpc.RpcError) as failed:
        kubelet.publish(bare, "loose")
    assert failed.value.code() == grpc.StatusCode.PERMISSION_DENIED
    details = str(failed.value.details())
    assert f'User "system:node:{NODE}" cannot list resource "secrets"' in details
    assert f"no relationship found between node '{NODE}' and this object" in details
    # One ERROR line naming the object and the API server's message; retried with backoff.
    wait_for(lambda: "read refused query=secrets" in agent.log_text())
    line = next(x for x in agent.log_text().splitlines() if "read refused" in x)
    assert " ERROR " in line
    assert "fieldSelector=metadata.name=loose" in line
    assert "no relationship found between node" in line
