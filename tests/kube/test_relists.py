"""The watches of one namespace that relist together (an API server restart) ask the server once:
`fusevol.kube.relists` through the agent's client, against the loopback API server, with
objects as kube-apiserver stores them. What each relist is told is checked against what the
server holds, and the requests against the server's record."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio
import trio.testing

from fusevol.kube import relists as relists_module
from fusevol.kube.client import KubeClient
from fusevol.kube.relists import BATCH_MIN, SIZE_RATIO, Answer, Relists
from fusevol.model import Kind
from tests.helpers.h2server import certificates
from tests.kube.conftest import configmap

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

    from tests.helpers.apiserver import ApiServer

OBJECTS = 20


def populate(api: ApiServer, count: int) -> str:
    """ConfigMaps cm-0... of namespace default; the resourceVersion after them (what their
    watches last saw)."""
    for i in range(count):
        created = api.create(configmap(f"cm-{i}", {"a": str(i)}))
    return str(created["metadata"]["resourceVersion"])


def check_all(relists: Relists, names: list[str], since: str) -> dict[str, Answer | None]:
    """Every name's relist at once, as after an API server restart."""
    answers: dict[str, Answer | None] = {}

    async def one(name: str) -> None:
        answers[name] = await relists.check(Kind.CONFIG_MAP, "default", name, since)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for name in names:
                nursery.start_soon(one, name)

    trio.run(main)
    return answers


def metadata_lists(api: ApiServer) -> list[dict[str, str]]:
    return [r.query for r in api.requests if r.metadata]


def test_relists_of_one_namespace_ask_its_names_and_versions_once(
    api: ApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(relists_module, "GATHER_S", 0.05)
    since = populate(api, OBJECTS)
    api.create({"kind": "ConfigMap", "metadata": {"name": "cm-1", "namespace": "other"}})
    # While the watches are away: one object changes, one goes, one comes that none watches.
    api.update(configmap("cm-3", {"a": "changed"}))
    api.delete("ConfigMap", "default", "cm-5")
    version = api.create(configmap("new", {}))["metadata"]["resourceVersion"]
    client = KubeClient(kubeconfig=api.write_kubeconfig(tmp_path / "kubeconfig"))
    relists = Relists(client)

    answers = check_all(relists, [f"cm-{i}" for i in range(OBJECTS)], since)

    assert answers.pop("cm-3") is None  # changed: its reflector lists it
    assert answers.pop("cm-5") == Answer(version, gone=True)
    assert set(answers.values()) == {Answer(version, gone=False)}
    # One list of the namespace's metadata, no older than what the watches saw.
    (query,) = metadata_lists(api)
    assert query == {
        "resourceVersion": since,
        "resourceVersionMatch": "NotOlderThan",
        "limit": str(SIZE_RATIO * OBJECTS),
    }
    (request,) = [r for r in api.requests if r.metadata]
    assert request.path == "/api/v1/namespaces/default/configmaps"
    assert relists.lists == 1
    assert relists.answered == OBJECTS - 1


def test_a_few_relists_and_a_large_namespace_list_their_own_objects(
    api: ApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(relists_module, "GATHER_S", 0.05)
    waiting = BATCH_MIN
    since = populate(api, waiting * SIZE_RATIO + 1)
    client = KubeClient(kubeconfig=api.write_kubeconfig(tmp_path / "kubeconfig"))
    relists = Relists(client)
    names = [f"cm-{i}" for i in range(waiting)]

    # One fewer than BATCH_MIN: no list; each relist lists its own object.
    assert check_all(relists, names[1:], since) == dict.fromkeys(names[1:])
    assert metadata_lists(api) == []
    # BATCH_MIN: a list of at most SIZE_RATIO times them, which the namespace is larger than...
    assert check_all(relists, names, since) == dict.fromkeys(names)
    (query,) = metadata_lists(api)
    assert query["limit"] == str(SIZE_RATIO * waiting)
    # ...and so not asked again for as few; for twice as many, the whole namespace.
    assert check_all(relists, names, since) == dict.fromkeys(names)
    assert len(metadata_lists(api)) == 1
    twice = [f"cm-{i}" for i in range(2 * waiting)]
    assert None not in check_all(relists, twice, since).values()
    assert len(metadata_lists(api)) == 2


def test_a_node_may_not_list_a_namespace_and_is_not_asked_again(
    api: ApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(relists_module, "GATHER_S", 0.05)
    since = populate(api, OBJECTS)
    pem = certificates().client("system:node:node-a", ("system:nodes",))
    kubeconfig = api.write_kubeconfig(tmp_path / "kubelet.conf", client_certificate=pem)
    relists = Relists(KubeClient(kubeconfig=kubeconfig))
    names = [f"cm-{i}" for i in range(OBJECTS)]

    assert check_all(relists, names, since) == dict.fromkeys(names)
    assert check_all(relists, names, since) == dict.fromkeys(names)
    assert len(metadata_lists(api)) == 1  # refused once (403), never asked again
    refused = [r for r in api.requests if r.metadata]
    assert refused[0].path == "/api/v1/namespaces/default/configmaps"


def test_the_others_list_their_own_objects_when_the_first_is_stopped_while_it_gathers(
    api: ApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first relist of a namespace lists for all: stopped (its watch closed) before it did,
    none of the others waits for it longer than it gathered. (Its gathering is made longer than
    the test may take, and the steps wait for the tasks, not for the clock: a loaded machine
    that let the test's own sleeps overrun the gathering made the list happen before the stop.)"""
    monkeypatch.setattr(relists_module, "GATHER_S", 60.0)
    since = populate(api, OBJECTS)
    relists = Relists(KubeClient(kubeconfig=api.write_kubeconfig(tmp_path / "kubeconfig")))
    answers: dict[str, Answer | None] = {}
    scopes: dict[str, trio.CancelScope] = {}

    async def one(name: str) -> None:
        with trio.CancelScope() as scopes[name]:
            answers[name] = await relists.check(Kind.CONFIG_MAP, "default", name, since)

    async def main() -> None:
        with trio.fail_after(10):  # far less than the gathering: nobody waits it out
            async with trio.open_nursery() as nursery:
                nursery.start_soon(one, "cm-0")
                await trio.testing.wait_all_tasks_blocked()  # cm-0 gathers
                for i in range(1, OBJECTS):
                    nursery.start_soon(one, f"cm-{i}")
                await trio.testing.wait_all_tasks_blocked()  # the others wait for its list
                scopes["cm-0"].cancel()

    trio.run(main)
    assert answers == {f"cm-{i}": None for i in range(1, OBJECTS)}
    assert metadata_lists(api) == []


def test_a_namespace_refused_by_rbac_leaves_the_others_listed_together(
    api: ApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Role in some namespaces only (the chart's `rbac.namespaces`): the refused namespace is
    not asked again, the allowed one still is."""
    monkeypatch.setattr(relists_module, "GATHER_S", 0.05)
    since = populate(api, OBJECTS)
    for i in range(OBJECTS):
        api.create({"kind": "ConfigMap", "metadata": {"name": f"cm-{i}", "namespace": "other"}})
    api.users["alice-token"] = ("alice", [])
    api.allow("alice", "list", "configmaps", namespace="default")
    client = KubeClient(kubeconfig=api.write_kubeconfig(tmp_path / "kc", token="alice-token"))
    relists = Relists(client)
    names = [f"cm-{i}" for i in range(OBJECTS)]

    async def both() -> dict[str, list[Answer | None]]:
        answers: dict[str, list[Answer | None]] = {"default": [], "other": []}

        async def one(namespace: str, name: str) -> None:
            answer = await relists.check(Kind.CONFIG_MAP, namespace, name, since)
            answers[namespace].append(answer)

        async with trio.open_nursery() as nursery:
            for namespace in answers:
                for name in names:
                    nursery.start_soon(one, namespace, name)
        return answers

    for _ in range(2):
        answers = trio.run(both)
        assert None not in answers["default"]
        assert answers["other"] == [None] * OBJECTS
    paths = [r.path for r in api.requests if r.metadata]
    assert paths.count("/api/v1/namespaces/default/configmaps") == 2
    assert paths.count("/api/v1/namespaces/other/configmaps") == 1  # refused once
