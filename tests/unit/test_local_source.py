"""ManifestSource against a real directory and real inotify events (no sleeps: store changes and a
barrier manifest tell when the source has handled an edit)."""

from __future__ import annotations

import itertools
import logging
import os
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from fusevol.base.errors import ManifestError
from fusevol.model import ConfigMap, Kind, ObjectKey, Pod, Secret
from fusevol.source.local import ManifestSource, is_manifest_name
from fusevol.volumemanager.cache.store import ObjectStore
from tests.agent import write_atomically

if TYPE_CHECKING:
    from collections.abc import Callable

NODE = "node-1"
_barriers = itertools.count()


def cm_key(name: str) -> ObjectKey:
    return ObjectKey(Kind.CONFIG_MAP, "default", name)


def pod_key(name: str) -> ObjectKey:
    return ObjectKey(Kind.POD, "default", name)


def config_map(name: str, value: str) -> str:
    return f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}}}\ndata: {{k: '{value}'}}\n"


def pod(name: str, node: str = "") -> str:
    return f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec: {{nodeName: '{node}'}}\n"


def value(store: ObjectStore, name: str) -> str | None:
    obj = store.get(cm_key(name), ConfigMap)
    return None if obj is None else obj.data["k"].decode()


async def wait_until(store: ObjectStore, predicate: Callable[[], bool]) -> None:
    with trio.fail_after(5):
        while not predicate():
            await store.wait_changed(store.generation)


async def barrier(directory: Path, store: ObjectStore) -> None:
    """Write one more manifest and wait for it: every earlier event has been handled by then."""
    name = f"barrier-{next(_barriers)}"
    (directory / f"zz-{name}.yaml").write_text(config_map(name, "x"))
    await wait_until(store, lambda: value(store, name) == "x")


@pytest.fixture
def store() -> ObjectStore:
    return ObjectStore()


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    directory = tmp_path / "manifests"
    directory.mkdir()
    return directory


async def start(nursery: trio.Nursery, directory: Path, store: ObjectStore) -> ManifestSource:
    source = ManifestSource(directory=directory, node_name=NODE, store=store)
    await nursery.start(source.run)
    return source


def take_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    """WARNING+ messages logged so far, consumed (tests/conftest.py fails on unconsumed ones)."""
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert all(r.levelno == logging.ERROR for r in records)
    caplog.clear()
    return [r.getMessage() for r in records]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("app.yaml", True, id="yaml"),
        pytest.param("app.yml", True, id="yml"),
        pytest.param("app.json", True, id="json"),
        pytest.param("app.txt", False, id="other-suffix"),
        pytest.param(".app.yaml", False, id="hidden"),
        pytest.param("app.yaml~", False, id="backup"),
        pytest.param(".app.yaml.swp", False, id="vim-swap"),
        pytest.param("..data", False, id="kubelet-data-link"),
    ],
)
def test_manifest_names(name: str, expected: bool) -> None:
    assert is_manifest_name(name) is expected


async def test_initial_load_then_synced(manifests: Path, store: ObjectStore, nursery) -> None:
    (manifests / "a.yaml").write_text(
        config_map("a", "1") + "---\nkind: Secret\nmetadata: {name: s}\nstringData: {k: v}\n"
    )
    (manifests / "b.json").write_text('{"kind": "ConfigMap", "metadata": {"name": "b"}}')
    for ignored in (".hidden.yaml", "a.yaml~", "notes.txt", "sub/c.yaml"):
        (manifests / ignored).parent.mkdir(exist_ok=True)
        (manifests / ignored).write_text(config_map("ignored", "1"))

    source = await start(nursery, manifests, store)

    assert store.synced
    keys = {obj.key for kind in Kind for obj in store.list(kind)}
    assert keys == {cm_key("a"), cm_key("b"), ObjectKey(Kind.SECRET, "default", "s")}
    secret = store.get(ObjectKey(Kind.SECRET, "default", "s"), Secret)
    assert secret is not None
    assert secret.data == {"k": b"v"}
    versions = {obj.resource_version for kind in Kind for obj in store.list(kind)}
    assert len(versions) == 3
    assert "" not in versions
    assert source.statistics().objects == 3


async def test_missing_directory_fails_start(tmp_path: Path, store: ObjectStore, nursery) -> None:
    with pytest.raises(ManifestError, match="manifest directory does not exist"):
        await start(nursery, tmp_path / "nope", store)
    assert not store.synced


async def test_in_place_edit_changes_only_the_edited_object(
    manifests: Path, store: ObjectStore, nursery
) -> None:
    path = manifests / "app.yaml"
    path.write_text(config_map("a", "1") + "---\n" + config_map("b", "1"))
    await start(nursery, manifests, store)
    before_a, before_b = store.get(cm_key("a")), store.get(cm_key("b"))
    generation = store.generation

    path.write_text(config_map("a", "2") + "---\n" + config_map("b", "1"))
    await wait_until(store, lambda: value(store, "a") == "2")

    after_a = store.get(cm_key("a"))
    assert before_a is not None
    assert after_a is not None
    assert after_a.resource_version != before_a.resource_version
    assert store.get(cm_key("b")) is before_b  # untouched: same version, upsert returned False
    assert store.generation == generation + 1


async def test_atomic_rename_save(manifests: Path, store: ObjectStore, nursery, caplog) -> None:
    path = manifests / "app.yaml"
    path.write_text(config_map("a", "1"))
    await start(nursery, manifests, store)

    write_atomically(path, config_map("a", "2") + "---\n" + config_map("c", "3"))
    await wait_until(store, lambda: value(store, "a") == "2" and value(store, "c") == "3")
    assert take_errors(caplog) == []


async def test_object_removed_from_file_and_file_deleted(
    manifests: Path, store: ObjectStore, nursery
) -> None:
    (manifests / "app.yaml").write_text(config_map("a", "1") + "---\n" + config_map("b", "1"))
    (manifests / "other.yaml").write_text(config_map("o", "1"))
    await start(nursery, manifests, store)

    (manifests / "app.yaml").write_text(config_map("a", "1"))
    await wait_until(store, lambda: store.get(cm_key("b")) is None)
    assert value(store, "a") == "1"

    (manifests / "app.yaml").unlink()
    await wait_until(store, lambda: store.get(cm_key("a")) is None)
    assert value(store, "o") == "1"


async def test_bad_edit_keeps_previous_objects_and_logs_one_error(
    manifests: Path, store: ObjectStore, nursery, caplog
) -> None:
    path = manifests / "app.yaml"
    path.write_text(config_map("a", "1") + "---\n" + config_map("b", "1"))
    await start(nursery, manifests, store)
    before = store.get(cm_key("a")), store.get(cm_key("b"))

    # The second object is invalid, so the first one's edit is not taken either.
    path.write_text(config_map("a", "2") + "---\n" + config_map("b", "1").replace("k:", "../k:"))
    await barrier(manifests, store)

    assert (store.get(cm_key("a")), store.get(cm_key("b"))) == before
    assert take_errors(caplog) == [
        f"manifest rejected, keeping its previous objects: {path}: configmap default/b: "
        "data[\"../k\"]: a valid config key must consist of alphanumeric characters, '-', '_'"
        " or '.'"
    ]

    path.write_text(config_map("a", "3"))
    await wait_until(store, lambda: value(store, "a") == "3" and store.get(cm_key("b")) is None)


async def test_secret_values_never_logged(manifests: Path, store: ObjectStore, nursery, caplog):
    caplog.set_level(logging.DEBUG)
    path = manifests / "s.yaml"
    path.write_text("kind: Secret\nmetadata: {name: s}\ndata: {k: aHVudGVyMg==}\n")
    await start(nursery, manifests, store)
    path.write_text("kind: Secret\nmetadata: {name: s}\ndata: {k: hunter2!}\n")
    await barrier(manifests, store)

    assert all("hunter2" not in r.getMessage() for r in caplog.records)
    assert len(take_errors(caplog)) == 1


async def test_pods_bound_to_other_nodes_are_ignored(
    manifests: Path, store: ObjectStore, nursery
) -> None:
    path = manifests / "pods.yaml"
    path.write_text("---\n".join([pod("mine", NODE), pod("unbound"), pod("theirs", "node-2")]))
    await start(nursery, manifests, store)
    assert {p.name for p in store.pods()} == {"mine", "unbound"}

    path.write_text("---\n".join([pod("mine", "node-2"), pod("unbound")]))
    await wait_until(store, lambda: store.get(pod_key("mine")) is None)
    assert store.get(pod_key("unbound"), Pod) is not None


async def test_duplicate_object_first_file_wins(
    manifests: Path, store: ObjectStore, nursery, caplog
) -> None:
    (manifests / "a.yaml").write_text(config_map("shared", "from-a"))
    (manifests / "b.yaml").write_text(config_map("shared", "from-b"))
    await start(nursery, manifests, store)

    assert value(store, "shared") == "from-a"
    assert take_errors(caplog) == [
        f"{manifests / 'b.yaml'}: configmap default/shared is already defined in"
        f" {manifests / 'a.yaml'}; ignoring this definition"
    ]

    (manifests / "a.yaml").unlink()
    await wait_until(store, lambda: value(store, "shared") == "from-b")


async def test_symlink_to_a_manifest(
    tmp_path: Path, manifests: Path, store: ObjectStore, nursery
) -> None:
    target = tmp_path / "elsewhere.yaml"
    target.write_text(config_map("linked", "1"))
    await start(nursery, manifests, store)

    (manifests / "linked.yaml").symlink_to(target)
    await wait_until(store, lambda: value(store, "linked") == "1")


async def test_kubelet_data_swap_rescans(manifests: Path, store: ObjectStore, nursery) -> None:
    """The manifest directory is itself a configMap volume: kubelet swaps `..data`."""
    for version, content in (("..v1", "1"), ("..v2", "2")):
        (manifests / version).mkdir()
        (manifests / version / "app.yaml").write_text(config_map("a", content))
    (manifests / "..data").symlink_to("..v1")
    (manifests / "app.yaml").symlink_to("..data/app.yaml")
    await start(nursery, manifests, store)
    assert value(store, "a") == "1"

    (manifests / "..data_tmp").symlink_to("..v2")
    os.replace(manifests / "..data_tmp", manifests / "..data")
    await wait_until(store, lambda: value(store, "a") == "2")


async def test_directory_moved_away_and_back(
    tmp_path: Path, manifests: Path, store: ObjectStore, nursery, caplog
) -> None:
    (manifests / "app.yaml").write_text(config_map("a", "1"))
    source = await start(nursery, manifests, store)

    away = tmp_path / "away"
    manifests.rename(away)
    (away / "app.yaml").write_text(config_map("a", "2"))
    (away / "new.yaml").write_text(config_map("n", "1"))
    away.rename(manifests)

    await wait_until(store, lambda: value(store, "a") == "2" and value(store, "n") == "1")
    assert source.statistics().watching
    assert take_errors(caplog) == [
        f"manifest directory {manifests} is gone; keeping its objects until it is back"
    ]


async def test_a_file_invalid_from_the_start_says_nothing_is_served_from_it(
    manifests: Path, store: ObjectStore, nursery, caplog
) -> None:
    """Unlike a file that turns invalid later, it had no previous objects to keep."""
    path = manifests / "bad.yaml"
    path.write_text(config_map("b", "1").replace("k:", "../k:"))
    await start(nursery, manifests, store)
    [error] = take_errors(caplog)
    assert error.startswith(f"manifest rejected, nothing served from it: {path}: configmap ")
    assert store.get(cm_key("b")) is None


async def test_the_examples_second_pod_shares_the_demo_objects_without_an_error(
    manifests: Path, store: ObjectStore, nursery, caplog
) -> None:
    """examples/README.md's second pod, as its reader makes it: no object defined twice."""
    examples = Path(__file__).parents[2] / "examples"
    (manifests / "demo.yaml").write_text((examples / "demo.yaml").read_text())
    walk = (examples / "README.md").read_text()
    heredoc = walk.split("cat > examples/demo2.yaml <<'EOF'\n", 1)[1].split("EOF\n", 1)[0]
    (manifests / "demo2.yaml").write_text(textwrap.dedent(heredoc))
    await start(nursery, manifests, store)
    assert take_errors(caplog) == []
    assert sorted(pod.name for pod in store.pods()) == ["demo", "demo2"]
    second = store.get(pod_key("demo2"), Pod)
    assert second is not None
    assert second.uid == "6a1f2c3e-0000-4000-8000-000000000002"
