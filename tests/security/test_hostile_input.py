"""A tenant's hostile volume spec against the real agent: no item path, depth, size or CSI
attribute stops the agent, and every other pod keeps its files and its updates meanwhile.

kubelet writes a configMap item path of 1500 levels (`d/d/.../d/f`, 3001 characters): fusevol
serves it at its full path, and serves the next edit of its ConfigMap. A path AtomicWriter refuses
(100,000 levels: 200,000 bytes, over its 4096), or one that fits AtomicWriter but not the kernel
below kubelet's volume directory (ENAMETOOLONG), fails that volume alone: one error line naming
the pod, the volume and the item's field, backoff, a FailedMount event with the API source, and
nothing of it left on the agent's mount. The same through each item source (configMap, secret,
downwardAPI, projected) and through a CSI volume's `volume` attribute.

One agent on a manifest directory serves most of the module, with tests/manifests.py's pod as the
bystander that must keep its files and receive an edit during each attack; the CSI and API source
cases run an agent of their own on a loopback API server.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from tests.agent import (
    HAS_FUSE,
    AgentProcess,
    LogTail,
    running_agent,
    wait_for,
    write_atomically,
)
from tests.csi.conftest import api, csi_agent, csi_volume, kubelet_dir, pod
from tests.kube.conftest import kube_agent, kube_agent_on
from tests.manifests import POD_UID, configmap, write_pod_set
from tests.served import read_within

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.helpers.apiserver import ApiServer

pytestmark = pytest.mark.skipif(not HAS_FUSE, reason="needs root and /dev/fuse")
__all__ = ["api", "csi_agent", "kube_agent", "kube_agent_on", "kubelet_dir"]  # imported fixtures

DEEP = "/".join(["d"] * 1500 + ["f"])
"""1500 levels, 3001 characters: kubelet writes it."""
HUGE = "/".join(["d"] * 99_999 + ["f"])
"""100,000 levels, 199,999 bytes: AtomicWriter refuses it (more than 4096 bytes)."""
TOO_LONG_FOR_THE_KERNEL = "/".join(["d" * 254] * 15 + ["f" * 200])
"""4019 bytes: AtomicWriter's rules take it, but below kubelet's volume directory the file's
path is longer than PATH_MAX: kubelet's write fails with ENAMETOOLONG."""

OBJECTS = """\
kind: ConfigMap
metadata: {name: deep, namespace: default}
data: {k: v1}
---
kind: Secret
metadata: {name: deep, namespace: default}
stringData: {k: s1}
"""

PLUGINS = {
    "configMap": "configmap",
    "secret": "secret",
    "downwardAPI": "downward-api",
    "projected": "projected",
}


def volume_source(kind: str, path: str) -> dict[str, Any]:
    """A volume of `kind` with one file at `path`: the `k` of ConfigMap or Secret `deep`, or
    the pod's name."""
    item = {"key": "k", "path": path}
    name = {"path": path, "fieldRef": {"fieldPath": "metadata.name"}}
    sources: dict[str, dict[str, Any]] = {
        "configMap": {"configMap": {"name": "deep", "items": [item]}},
        "secret": {"secret": {"secretName": "deep", "items": [item]}},
        "downwardAPI": {"downwardAPI": {"items": [name]}},
        "projected": {
            "projected": {
                "sources": [
                    {"configMap": {"name": "deep", "items": [item]}},
                    {"downwardAPI": {"items": [{**name, "path": "name"}]}},
                ]
            }
        },
    }
    return sources[kind]


CONTENT = {"configMap": b"v1", "secret": b"s1", "downwardAPI": None, "projected": b"v1"}
"""What the file at the path holds (None: the pod's name)."""
FIELD = {
    "configMap": "items[0].path: ",
    "secret": "items[0].path: ",
    "downwardAPI": "items[0].path: ",
    "projected": "sources[0].configMap.items[0].path: ",
}


def pod_manifest(name: str, uid: str, volumes: dict[str, dict[str, Any]]) -> str:
    entries = [{"name": volume, **source} for volume, source in volumes.items()]
    return json.dumps(
        {
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": uid},
            "spec": {"containers": [{"name": "c"}], "volumes": entries},
        }
    )


@dataclass
class Served:
    agent: AgentProcess
    manifests: Path
    edits: int = 0

    def drop(self, name: str, text: str) -> LogTail:
        tail = LogTail(self.agent.log_path)
        write_atomically(self.manifests / name, text)
        return tail

    def remove(self, name: str, uid: str) -> None:
        (self.manifests / name).unlink()
        wait_for(lambda: not (self.agent.root / "pods" / uid).exists(), timeout_s=30)

    def subtrees(self) -> set[str]:
        """What the agent's own mount holds, listed as root: a directory per served subtree."""
        return set(os.listdir(self.agent.fuse_mountpoint()))

    def bystander_gets_an_edit(self) -> None:
        """tests/manifests.py's pod still serves its files, and an edit of its ConfigMap."""
        self.edits += 1
        text = f"edit-{self.edits}"
        write_atomically(self.manifests / "configmap.yaml", configmap(a=text))
        config = self.agent.volume(POD_UID, "configmap", "config")
        wait_for(lambda: (config / "a").read_text() == text, timeout_s=10)
        assert (config / "b").read_bytes() == b"beta"
        assert (self.agent.volume(POD_UID, "secret", "creds") / "token").read_bytes() == b"t0ken"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("hostile")
    manifests = base / "manifests"
    manifests.mkdir()
    write_pod_set(manifests)
    (manifests / "deep-objects.yaml").write_text(OBJECTS)
    expected = (r" ERROR fusevol\.volumemanager\.reconciler\.executor: mount failed ",)
    with running_agent(manifests, base / "root", expect_log=expected) as agent:
        agent.wait_state(POD_UID, "config", "mounted")
        agent.wait_state(POD_UID, "creds", "mounted")
        yield Served(agent, manifests)
        agent.stop()


@pytest.fixture(autouse=True)
def _agent_serves_on(served: Served) -> Iterator[None]:
    """Each test ends with the agent alive and the bystander served, an edit included: nothing
    a test does to its own pods may stop it."""
    yield
    assert served.agent.agent_alive(), served.agent.log_text()[-3000:]
    served.bystander_gets_an_edit()


@pytest.fixture
def subtrees_before(served: Served) -> set[str]:
    """The agent's subtrees before the test: what its mount holds again once its pods are gone."""
    return served.subtrees()


def chain(volume: Path, path: str) -> list[os.stat_result]:
    """lstat of every directory of `path` below `volume`, the version's first (`..data` resolved
    through the top-level link), one open directory at a time: no path near PATH_MAX."""
    *directories, _ = path.split("/")
    found = []
    fd = os.open(volume / directories[0], os.O_RDONLY | os.O_DIRECTORY)
    try:
        found.append(os.fstat(fd))
        for name in directories[1:]:
            below = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = below
            found.append(os.fstat(fd))
    finally:
        os.close(fd)
    return found


# -- served as kubelet serves it -------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(PLUGINS))
def test_an_item_path_of_1500_levels_is_served_at_its_full_path(
    served: Served, subtrees_before: set[str], kind: str
) -> None:
    uid = f"aaaaaaaa-0000-4000-8000-{list(PLUGINS).index(kind):012d}"
    served.drop("deep-pod.json", pod_manifest("deep", uid, {"deep": volume_source(kind, DEEP)}))
    volume = served.agent.wait_mounted(served.agent.volume(uid, PLUGINS[kind], "deep"))

    # kubelet's layout (docs/kubelet.md fact 2): `d -> ..data/d`, the file at its full path, of
    # the default mode, every directory of the version 0755.
    assert len(str(volume / DEEP)) < 4096
    assert os.readlink(volume / "d") == "..data/d"
    assert (volume / DEEP).read_bytes() == (CONTENT[kind] or b"deep")
    assert stat.S_IMODE((volume / DEEP).stat().st_mode) == 0o644
    directories = chain(volume, DEEP)
    assert len(directories) == 1500
    assert {stat.S_IMODE(s.st_mode) for s in directories} == {0o755}
    served.bystander_gets_an_edit()

    served.remove("deep-pod.json", uid)
    assert served.subtrees() == subtrees_before


def test_an_edit_of_the_configmap_of_a_1500_level_path_is_published(
    served: Served, subtrees_before: set[str]
) -> None:
    uid = "aaaaaaaa-1111-4000-8000-000000000001"
    source = volume_source("configMap", DEEP)
    served.drop("deep-pod.json", pod_manifest("deep", uid, {"deep": source}))
    volume = served.agent.wait_mounted(served.agent.volume(uid, "configmap", "deep"))
    assert (volume / DEEP).read_bytes() == b"v1"

    served.drop("deep-objects.yaml", OBJECTS.replace("{k: v1}", "{k: v2}"))
    wait_for(lambda: (volume / DEEP).read_bytes() == b"v2", timeout_s=10)
    served.bystander_gets_an_edit()
    served.drop("deep-objects.yaml", OBJECTS)
    wait_for(lambda: (volume / DEEP).read_bytes() == b"v1", timeout_s=10)

    served.remove("deep-pod.json", uid)
    assert served.subtrees() == subtrees_before


def test_twenty_deep_chains_in_one_volume_are_served(
    served: Served, subtrees_before: set[str]
) -> None:
    uid = "aaaaaaaa-2222-4000-8000-000000000001"
    paths = [f"e{i}/{DEEP[:2800]}f" for i in range(20)]
    items = [{"key": "k", "path": path} for path in paths]
    source = {"configMap": {"name": "deep", "items": items}}
    served.drop("chains-pod.json", pod_manifest("chains", uid, {"chains": source}))
    volume = served.agent.wait_mounted(
        served.agent.volume(uid, "configmap", "chains"), timeout_s=30
    )
    for path in paths[::7]:
        assert (volume / path).read_bytes() == b"v1"
    served.remove("chains-pod.json", uid)
    assert served.subtrees() == subtrees_before


_LIST = """
import os, sys, time
start = time.monotonic()
names = os.listdir(sys.argv[1])
print(len(names), time.monotonic() - start)
"""


def test_a_listing_of_100000_keys_leaves_every_other_read_answered(
    served: Served, subtrees_before: set[str]
) -> None:
    """A ConfigMap of 100,000 keys (some 600 KB) is listed while the bystander's file is read
    again and again: each read is answered in time, and the listing costs the agent little CPU
    (0.3 s, measured), where sorting the whole directory in each of its thousands of READDIR
    requests cost 6.4 s of the trio thread, and 26 s of the listing's time. So do a thousand
    STATFS of the volume, which counted every node of the agent's inode table each."""
    uid = "aaaaaaaa-3333-4000-8000-000000000001"
    data = "".join(f"  k{i}: ''\n" for i in range(100_000))
    served.drop(
        "wide.yaml", f"kind: ConfigMap\nmetadata: {{name: wide, namespace: default}}\ndata:\n{data}"
    )
    source = {"configMap": {"name": "wide"}}
    served.drop("wide-pod.json", pod_manifest("wide", uid, {"wide": source}))
    volume = served.agent.wait_mounted(served.agent.volume(uid, "configmap", "wide"), timeout_s=120)
    bystander = served.agent.volume(POD_UID, "configmap", "config") / "b"

    spent = cpu_s(served.agent.pid)
    lister = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _LIST, str(volume)], stdout=subprocess.PIPE, text=True
    )
    try:
        while lister.poll() is None:
            assert read_within(bystander, timeout_s=2.0) == b"beta"
        count, _ = lister.communicate(timeout=120)[0].split()
    finally:
        lister.kill()
        lister.wait()
    assert int(count) == 100_000 + 2  # the keys, `..data` and the version
    assert cpu_s(served.agent.pid) - spent < 3  # 0.3 s; sorting in each request: 6.4 s
    spent = cpu_s(served.agent.pid)
    for _ in range(1000):  # a STATFS each, which counted every node of the agent's table
        os.statvfs(volume)
    assert cpu_s(served.agent.pid) - spent < 1.5
    served.remove("wide-pod.json", uid)
    (served.manifests / "wide.yaml").unlink()
    assert served.subtrees() == subtrees_before


def test_edits_renaming_every_key_of_two_large_volumes_delay_no_other_pods_update(
    served: Served, subtrees_before: set[str]
) -> None:
    """Two ConfigMaps of 50,000 keys each, every key renamed in one edit: 200,000 symlinks and
    unlinks in the two volumes (kubelet's steps (10) and (11)). The bystander's edit, made
    meanwhile, is published in seconds: it took 390 s while those two publishes held both
    publishing helpers, each of their operations costing a count of the whole directory."""

    def wide(name: str, prefix: str) -> str:
        data = "".join(f"  {prefix}{i}: ''\n" for i in range(50_000))
        return f"kind: ConfigMap\nmetadata: {{name: {name}, namespace: default}}\ndata:\n{data}"

    volumes = []
    for n in (1, 2):
        uid = f"aaaaaaaa-4444-4000-8000-00000000000{n}"
        served.drop(f"wide{n}.yaml", wide(f"wide{n}", "a"))
        source = {"configMap": {"name": f"wide{n}"}}
        served.drop(f"wide{n}-pod.json", pod_manifest(f"wide{n}", uid, {"wide": source}))
        volumes.append((uid, served.agent.volume(uid, "configmap", "wide")))
    for _, volume in volumes:
        wait_for(lambda v=volume: (v / "a49999").exists(), timeout_s=120)  # type: ignore[misc]

    for n in (1, 2):
        served.drop(f"wide{n}.yaml", wide(f"wide{n}", "b"))
    for _, volume in volumes:  # their publishes have begun
        wait_for(lambda v=volume: (v / "..data" / "b0").exists(), timeout_s=60)  # type: ignore[misc]
    started = time.monotonic()
    served.bystander_gets_an_edit()
    assert time.monotonic() - started < 30

    # The publish is over when its last old name is unlinked (11): the publisher unlinks in name
    # order, turn by turn (fusevol/fuse/publish.py). An lstat each poll, not a listing of 50,000
    # names, which would load the agent it waits for.
    last = max(f"a{i}" for i in range(50_000))
    for _, volume in volumes:
        wait_for(lambda v=volume: not (v / last).is_symlink(), timeout_s=300)  # type: ignore[misc]
        assert (volume / "b49999").read_bytes() == b""
        assert not (volume / "a0").is_symlink()
    for n, (uid, _) in enumerate(volumes, 1):
        served.remove(f"wide{n}-pod.json", uid)
        (served.manifests / f"wide{n}.yaml").unlink()
    assert served.subtrees() == subtrees_before


# -- over a limit: that volume alone fails ---------------------------------------------------------


def fails_alone(served: Served, tail: LogTail, uid: str, volume: str) -> str:
    """The volume's one error line; meanwhile the bystander gets an edit; the volume is in
    backoff with its error, has no directory, and its retries are DEBUG lines."""
    line = tail.wait_line(" ERROR ", "mount failed", f"{uid}-{volume}", timeout_s=20)
    served.bystander_gets_an_edit()
    served.agent.wait_state(uid, volume, "failed")
    status = served.agent.volume_status(uid, volume)
    assert str(status["last_error"]) in line
    assert status["next_retry_in_s"] is not None
    assert not os.path.exists(served.agent.root / "pods" / uid / "volumes")
    tail.wait_line(" DEBUG ", "mount failed", f"{uid}-{volume}", "retry_in=1s")  # a retry
    lines = [entry for entry in tail.text.splitlines() if f"{uid}-{volume}" in entry]
    assert [entry for entry in lines if " ERROR " in entry] == [line]
    return line


@pytest.mark.parametrize("kind", list(PLUGINS))
def test_an_item_path_of_100000_levels_fails_alone_naming_pod_volume_and_field(
    served: Served, subtrees_before: set[str], kind: str
) -> None:
    uid = f"bbbbbbbb-0000-4000-8000-{list(PLUGINS).index(kind):012d}"
    tail = served.drop(
        "huge-pod.json", pod_manifest("huge", uid, {"huge": volume_source(kind, HUGE)})
    )

    line = fails_alone(served, tail, uid, "huge")
    assert "pod=default/huge" in line
    assert f"error={FIELD[kind]}invalid path " in line
    assert "must be no more than 4096 bytes, not 199999" in line
    assert len(line) < 1000
    assert served.subtrees() == subtrees_before
    served.remove("huge-pod.json", uid)


def test_a_path_longer_than_the_kernel_takes_below_the_volume_fails_with_enametoolong(
    served: Served, subtrees_before: set[str]
) -> None:
    uid = "bbbbbbbb-1111-4000-8000-000000000001"
    source = volume_source("configMap", TOO_LONG_FOR_THE_KERNEL)
    tail = served.drop("long-pod.json", pod_manifest("long", uid, {"long": source}))

    line = fails_alone(served, tail, uid, "long")
    assert "error=items[0].path: invalid path " in line
    assert f"/pods/{uid}/volumes/kubernetes.io~configmap/long/..<version>/dddd" in line
    assert ": open /" in line
    assert ": file name too long (" in line
    assert served.subtrees() == subtrees_before
    served.remove("long-pod.json", uid)


def test_items_reading_a_large_annotation_share_one_copy(
    served: Served, subtrees_before: set[str]
) -> None:
    """1000 files of a 200 KiB annotation: 200 MiB if each held its own copy."""
    uid = "cccccccc-0000-4000-8000-000000000001"
    items = [
        {"path": f"a{i}", "fieldRef": {"fieldPath": "metadata.annotations"}} for i in range(1000)
    ]
    manifest = json.loads(pod_manifest("notes", uid, {"notes": {"downwardAPI": {"items": items}}}))
    manifest["metadata"]["annotations"] = {"big": "x" * 200_000}
    before = rss_mib(served.agent.pid)
    served.drop("notes-pod.json", json.dumps(manifest))
    volume = served.agent.wait_mounted(served.agent.volume(uid, "downward-api", "notes"))
    assert (volume / "a999").read_bytes().startswith(b'big="xxx')
    assert rss_mib(served.agent.pid) - before < 60
    served.remove("notes-pod.json", uid)


def cpu_s(pid: int) -> float:
    """The CPU time process `pid` has used, user and system, in seconds."""
    with open(f"/proc/{pid}/stat") as stat_file:
        fields = stat_file.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return kib / 1024


# -- CSI volumes, and pod volumes of the API source ------------------------------------------------


def refused(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as failed:
        call()
    return failed.value.code(), str(failed.value.details())


def test_csi_volumes_deep_and_over_the_limits(
    api: ApiServer, csi_agent: Callable[..., Any]
) -> None:
    uid = "dddddddd-0000-4000-8000-0000000000aa"
    api.create({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "1"}})
    api.create({"kind": "ConfigMap", "metadata": {"name": "deep"}, "data": {"k": "v1"}})
    huge = {"configMap": {"name": "deep", "items": [{"key": "k", "path": HUGE}]}}
    web = pod(
        uid=uid,
        volumes=[
            csi_volume("good", configMap="app"),
            csi_volume("deep", volume=json.dumps(volume_source("configMap", DEEP))),
            csi_volume("huge", volume=json.dumps(huge)),
            csi_volume("nested", volume="[" * 100_000),
        ],
    )
    api.create(web)
    with csi_agent() as (agent, kubelet):
        agent.expect_log(r"mount failed .*must be no more than 4096 bytes")
        good = kubelet.publish(web, "good")
        deep = kubelet.publish(web, "deep")
        assert (deep / DEEP).read_bytes() == b"v1"
        assert os.readlink(deep / "d") == "..data/d"

        # Over the limits: the publish fails as kubelet's FailedMount will say, naming the field.
        code, message = refused(lambda: kubelet.publish(web, "huge"))
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert message.startswith("items[0].path: invalid path ")
        assert "must be no more than 4096 bytes, not 199999" in message
        code, message = refused(lambda: kubelet.publish(web, "nested"))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "volumeAttributes 'volume' is not YAML or JSON" in message

        # Meanwhile: edits reach the good volume and the deep one; the agent serves on.
        api.update({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "2"}})
        api.update({"kind": "ConfigMap", "metadata": {"name": "deep"}, "data": {"k": "v2"}})
        wait_for(lambda: (good / "a").read_text() == "2", timeout_s=10)
        wait_for(lambda: (deep / DEEP).read_bytes() == b"v2", timeout_s=10)
        assert agent.agent_alive()
        assert kubelet.probe()

        kubelet.unpublish(web, "deep")
        kubelet.unpublish(web, "good")
        assert os.listdir(agent.fuse_mountpoint()) == []  # nothing of `huge` either


def test_a_pod_volume_over_the_limit_gets_kubelets_failed_mount_event(
    api: ApiServer, kube_agent: Callable[..., Any]
) -> None:
    uid = "dddddddd-1111-4000-8000-0000000000aa"
    api.create({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "1"}})
    api.create({"kind": "ConfigMap", "metadata": {"name": "deep"}, "data": {"k": "v1"}})
    volumes = {
        "config": {"configMap": {"name": "app"}},
        "deep": volume_source("configMap", DEEP),
        "huge": volume_source("configMap", HUGE),
    }
    api.create(pod(uid=uid, volumes=[{"name": k, **v} for k, v in volumes.items()]))
    with kube_agent(expect_log=(r"mount failed .*must be no more than 4096 bytes",)) as agent:
        config = agent.wait_mounted(agent.volume(uid, "configmap", "config"))
        deep = agent.wait_mounted(agent.volume(uid, "configmap", "deep"))
        assert (deep / DEEP).read_bytes() == b"v1"
        wanted = 'MountVolume.SetUp failed for volume "huge" : items[0].path: invalid path "d/d/d/'
        event = wait_for(
            lambda: [e for e in api.events.values() if e["message"].startswith(wanted)],
            timeout_s=10,
        )[0]
        assert (event["reason"], event["type"]) == ("FailedMount", "Warning")
        assert event["involvedObject"]["uid"] == uid
        assert "must be no more than 4096 bytes, not 199999" in event["message"]

        api.update({"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "2"}})
        api.update({"kind": "ConfigMap", "metadata": {"name": "deep"}, "data": {"k": "v2"}})
        wait_for(lambda: (config / "a").read_text() == "2", timeout_s=10)
        wait_for(lambda: (deep / DEEP).read_bytes() == b"v2", timeout_s=10)
        assert agent.agent_alive()
        assert not agent.volume(uid, "configmap", "huge").exists()
