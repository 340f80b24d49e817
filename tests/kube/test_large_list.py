"""A LIST of hundreds of pods, as kube-apiserver v1.28 stores them, read through the agent's
client: its items decoded one at a time (`fusevol.kube.listing`) are the very items of the same
answer read whole."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from fusevol.kube import client as client_module
from fusevol.kube.client import KubeClient
from fusevol.kube.listing import LazyItems
from fusevol.model import Kind
from tests.agent import NODE

if TYPE_CHECKING:
    import pytest

    from tests.helpers.apiserver import ApiServer

PODS = 200
STORED_POD = json.loads(
    (Path(__file__).parents[1] / "fixtures/apiserver/configmap-secret.json").read_text()
)["stored"]


def test_a_large_list_reads_item_by_item_as_it_reads_whole(
    api: ApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(PODS):
        metadata = {**STORED_POD["metadata"], "name": f"web-{i}"}
        for made_by_the_server in ("uid", "resourceVersion", "creationTimestamp"):
            metadata.pop(made_by_the_server, None)
        spec = {**STORED_POD["spec"], "nodeName": NODE}
        api.create({**STORED_POD, "metadata": metadata, "spec": spec})
    client = KubeClient(kubeconfig=api.write_kubeconfig(tmp_path / "kubeconfig"))

    async def listed() -> tuple[object, str]:
        return await client.list(Kind.POD, namespace=None, field_selector=f"spec.nodeName={NODE}")

    lazy, version = trio.run(listed)
    monkeypatch.setattr(client_module, "LARGE_BODY", 1 << 40)  # every answer read whole
    whole, whole_version = trio.run(listed)

    assert isinstance(lazy, LazyItems)
    assert isinstance(whole, list)
    assert version == whole_version != ""
    assert len(lazy) == PODS
    assert list(lazy) == whole
    assert {item["kind"] for item in whole} == {"Pod"}
    assert sorted(item["metadata"]["name"] for item in whole) == sorted(
        f"web-{i}" for i in range(PODS)
    )
