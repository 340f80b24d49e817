"""A saved manifest edit reaches the pod volume atomically, with kubelet's inotify events."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING

import pytest

from tests.agent import AgentProcess, mounts_below, wait_for, write_atomically
from tests.manifests import POD_UID, configmap, pod

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.inotify import Watcher


@pytest.fixture
def bind_of(tmp_path: Path) -> Iterator[Path]:
    """A second path for a directory, by bind mount: what a container sees."""
    target = tmp_path / "bind"
    target.mkdir()
    yield target
    if str(target) in mounts_below(tmp_path):
        subprocess.run(["umount", str(target)], check=True)


def test_edit_is_visible_with_kubelets_events(
    agent: AgentProcess, manifests: Path, bind_of: Path, watch: Callable[[Path], Watcher]
) -> None:
    volume = agent.volume(POD_UID, "configmap", "config")
    subprocess.run(["mount", "--bind", str(volume), str(bind_of)], check=True)
    watchers = [watch(volume), watch(bind_of)]
    old_target = (volume / "..data").readlink()

    write_atomically(manifests / "configmap.yaml", configmap(a="2", b="2"))

    wait_for(lambda: (volume / "a").read_text() == "2")
    assert (bind_of / "b").read_text() == "2"
    for watcher in watchers:
        events = watcher.events_until("MOVED_TO ..data")
        assert "CREATE,ISDIR " + str((volume / "..data").readlink()) in events
        assert "CREATE ..data_tmp" in events
        assert "MOVED_FROM ..data_tmp" in events
        assert "MOVED_TO ..data" in events
    # The old version goes after the grace period, as one DELETE of its directory.
    wait_for(lambda: not (volume / old_target).exists(), timeout_s=10)


def test_keys_appear_and_disappear(agent: AgentProcess, manifests: Path) -> None:
    volume = agent.volume(POD_UID, "configmap", "config")
    write_atomically(
        manifests / "configmap.yaml",
        "kind: ConfigMap\nmetadata: {name: app}\ndata: {a: '1', c: 'new'}\n",
    )
    wait_for(lambda: (volume / "c").read_text() == "new")
    # As kubelet's AtomicWriter: the new names' links are made after the switch of `..data`,
    # then the vanished names' removed, one after the other (`Publisher.publish`, steps 10 and
    # 11): until then `b` is a link to a name the new version lacks.
    assert not (volume / "b").exists()
    wait_for(lambda: not (volume / "b").is_symlink())
    assert sorted(p.name for p in volume.iterdir() if not p.name.startswith("..")) == ["a", "c"]


BARRIER_UID = "22222222-3333-4444-8555-666666666666"
BARRIER_POD = f"""\
kind: Pod
metadata: {{name: barrier, namespace: default, uid: {BARRIER_UID}}}
spec:
  containers: [{{name: c}}]
  volumes: [{{name: creds, secret: {{secretName: creds}}}}]
"""


def _nothing_in_flight(agent: AgentProcess) -> bool:
    """Every volume in the agent's last status snapshot is set up, none mounting or refreshing."""
    volumes = [v for pod in agent.snapshot()["pods"] for v in pod["volumes"]]
    return bool(volumes) and all(v["state"] == "mounted" for v in volumes)


def test_unchanged_save_publishes_nothing(agent: AgentProcess, manifests: Path) -> None:
    volume = agent.volume(POD_UID, "configmap", "config")
    updated = "volume updated volume=kubernetes.io/configmap/"
    before = (volume / "..data").readlink()
    (manifests / "configmap.yaml").write_text(configmap())  # same content, saved again
    (manifests / "pod.yaml").write_text(pod())
    # Barrier: a pod saved after them. The pass that sets up its volume sees both saves, so once
    # that volume is set up and no operation is in flight, whatever they caused is done and logged.
    (manifests / "barrier.yaml").write_text(BARRIER_POD)
    agent.wait_state(BARRIER_UID, "creds", "mounted")
    wait_for(lambda: _nothing_in_flight(agent))
    assert agent.log_text().count(updated) == 0
    assert (volume / "..data").readlink() == before
    write_atomically(manifests / "configmap.yaml", configmap(a="after"))
    wait_for(lambda: (volume / "a").read_text() == "after")
    wait_for(lambda: updated in agent.log_text())  # logged just after the switch
    # Exactly one version switch happened: the old version is the one from before.
    assert agent.log_text().count(updated) == 1
    assert before != (volume / "..data").readlink()


READER = textwrap.dedent(
    """
    import json, os, sys, time
    volume, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
    reads = mixed = errors = 0
    while time.monotonic() < deadline:
        try:
            fd = os.open(os.path.join(volume, "..data"), os.O_RDONLY | os.O_DIRECTORY)
            try:
                values = []
                for key in ("a", "b"):
                    f = os.open(key, os.O_RDONLY, dir_fd=fd)
                    values.append(os.read(f, 100))
                    os.close(f)
            finally:
                os.close(fd)
            reads += 1
            mixed += values[0] != values[1]
        except OSError as exc:
            errors += 1
            print(repr(exc), file=sys.stderr)
    print(json.dumps({"reads": reads, "mixed": mixed, "errors": errors}))
    """
)


def _has_value(path: Path, value: str) -> bool:
    return path.read_text() == value


def test_readers_never_see_mixed_versions(agent: AgentProcess, manifests: Path) -> None:
    volume = agent.volume(POD_UID, "configmap", "config")
    # The pod set's own ConfigMap has a != b: the readers start once a version with a == b is in.
    write_atomically(manifests / "configmap.yaml", configmap(a="start", b="start"))
    wait_for(lambda: (volume / "a").read_text() == "start" == (volume / "b").read_text())
    readers = [
        subprocess.Popen(
            [sys.executable, "-c", READER, str(volume), "6"], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    for i in range(200):
        write_atomically(manifests / "configmap.yaml", configmap(a=f"v{i}", b=f"v{i}"))
        if i % 20 == 0:
            wait_for(functools.partial(_has_value, volume / "a", f"v{i}"))
    wait_for(lambda: (volume / "a").read_text() == "v199")
    results = [json.loads(r.communicate(timeout=30)[0]) for r in readers]
    for result in results:
        assert result["reads"] > 100
        assert result["mixed"] == 0
        assert result["errors"] == 0
    assert agent.log_text().count("volume updated volume=kubernetes.io/configmap/") >= 10


def test_pod_file_added_and_removed(agent: AgentProcess, manifests: Path) -> None:
    uid = "99999999-2222-4333-8444-555555555555"
    (manifests / "pod2.yaml").write_text(pod(name="second", uid=uid))
    second = agent.wait_mounted(agent.volume(uid, "configmap", "config"))
    assert (second / "a").read_text() == "alpha"

    (manifests / "pod2.yaml").unlink()
    wait_for(lambda: not (agent.root / "pods" / uid).exists())
    assert str(second) not in mounts_below(agent.root)
    # The first pod is untouched.
    assert (agent.volume(POD_UID, "configmap", "config") / "a").read_text() == "alpha"


def test_pod_of_another_node_is_ignored(agent: AgentProcess, manifests: Path) -> None:
    uid = "88888888-2222-4333-8444-555555555555"
    other = pod(name="elsewhere", uid=uid).replace("spec:\n", "spec:\n  nodeName: other-node\n")
    (manifests / "elsewhere.yaml").write_text(other)
    marker = "99999999-0000-4000-8000-000000000000"
    (manifests / "marker.yaml").write_text(pod(name="marker", uid=marker))
    agent.wait_mounted(agent.volume(marker, "configmap", "config"))
    assert not (agent.root / "pods" / uid).exists()
