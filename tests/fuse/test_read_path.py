"""The fast read path (docs/fuse.md fact 4): with fusevol's patched pyfuse3, the kernel caches
symlink targets and opens files without asking, so a hot open+read+close of `vol/key` makes no
request.

Runs only with the patched pyfuse3 (`.ci/install-pyfuse3`); stock pyfuse3 cannot request either
capability, and the other tests cover it.
"""

from __future__ import annotations

import errno
import importlib.metadata
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from fusevol.fuse.publish import WARM_FILES
from fusevol.fuse.session import has_fast_read_path
from tests.agent import wait_for, write_atomically
from tests.manifests import FILES, PINNED, POD_UID, configmap, pod

if TYPE_CHECKING:
    from tests.agent import AgentProcess

pytestmark = pytest.mark.skipif(
    not has_fast_read_path(),
    reason=f"stock pyfuse3 {importlib.metadata.version('pyfuse3')} is installed: it cannot request "
    "symlink caching or no_open (.ci/install-pyfuse3 installs fusevol's patched build)",
)

HOT_READS = 100
NO_REQUEST = ("lookup", "getattr", "readlink", "open", "read", "release")
"""What a hot read would cost without the fast read path (docs/fuse.md fact 4, timeouts 0)."""


def hot_read(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def requests_during_hot_reads(agent: AgentProcess, path: Path, expected: bytes) -> dict[str, int]:
    """Warm up, then read `path` HOT_READS times: the requests the agent answered meanwhile."""
    for _ in range(3):
        assert hot_read(path) == expected
    before = agent.fuse_requests()
    for _ in range(HOT_READS):
        assert hot_read(path) == expected
    return {op: n for op, n in (agent.fuse_requests() - before).items() if op in NO_REQUEST}


@pytest.fixture
def capabilities(agent: AgentProcess) -> set[str]:
    match = re.search(r"FUSE capabilities negotiated (.*)", agent.log_text())
    assert match, "the agent logged no negotiated capabilities"
    negotiated = set(match[1].split())
    if not {"cache_symlinks", "no_open_support"} <= negotiated:
        pytest.skip(f"the kernel does not offer symlink caching and no_open: {match[1]}")
    return negotiated


@pytest.mark.usefixtures("capabilities")
def test_hot_reads_make_no_request(agent: AgentProcess) -> None:
    key = agent.volume(POD_UID, "configmap", "config") / "a"
    assert requests_during_hot_reads(agent, key, b"alpha") == {}


@pytest.mark.usefixtures("capabilities")
def test_a_new_version_is_read_then_cached_again(agent: AgentProcess, manifests: Path) -> None:
    volume = agent.volume(POD_UID, "configmap", "config")
    assert requests_during_hot_reads(agent, volume / "a", b"alpha") == {}

    write_atomically(manifests / "configmap.yaml", configmap(a="2"))
    wait_for(lambda: (volume / "a").read_text() == "2")

    assert requests_during_hot_reads(agent, volume / "a", b"2") == {}


def _write_errno(path: Path, flags: int) -> int:
    """The errno of open(path, flags) or, if that succeeds, of a write through it (0: none)."""
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        return exc.errno or 0
    try:
        os.write(fd, b"x")
    except OSError as exc:
        return exc.errno or 0
    finally:
        os.close(fd)
    return 0


WRITE_FLAGS = [
    pytest.param(os.O_WRONLY, id="O_WRONLY"),
    pytest.param(os.O_RDWR, id="O_RDWR"),
    pytest.param(os.O_WRONLY | os.O_APPEND, id="O_APPEND"),
    pytest.param(os.O_WRONLY | os.O_TRUNC, id="O_TRUNC"),
]


@pytest.mark.usefixtures("capabilities")
@pytest.mark.parametrize("flags", WRITE_FLAGS)
def test_without_open_requests_writes_are_still_erofs(agent: AgentProcess, flags: int) -> None:
    """The kernel no longer asks `open` once it has answered ENOSYS, whatever the flags. A pod's
    read-only bind refuses the open itself; on the agent's own mount the O_TRUNC `setattr` or the
    `write` is refused. The content never changes."""
    in_pod = agent.volume(POD_UID, "configmap", "config") / "a"
    in_mount = agent.fuse_subtree(in_pod.parent) / "a"
    assert hot_read(in_pod) == b"alpha"  # answered ENOSYS: no open requests from now on

    with pytest.raises(OSError, match="Read-only file system"):
        os.open(in_pod, flags)
    assert _write_errno(in_mount, flags) == errno.EROFS

    assert hot_read(in_pod) == hot_read(in_mount) == b"alpha"
    assert os.stat(in_mount).st_size == len(b"alpha")


# -- warm before visible ---------------------------------------------------------------------------

FIRST_READ = (*NO_REQUEST, "readdir", "opendir")


def requests_during_first_reads(agent: AgentProcess, files: dict[Path, bytes]) -> dict[str, int]:
    """Read each of `files` once, as a program reloading its configuration does: the requests
    the agent answered meanwhile. (The connection's first open, answered ENOSYS, was made
    before: `no_open`.) A getattr of a volume directory is left out, once a volume: a change in
    it (an old version removed after its grace period) makes the kernel forget its attributes
    until the publisher's helper asks again, and a reader walking through it in between asks
    instead (docs/fuse.md fact 15)."""
    before = agent.fuse_requests()
    for path, expected in files.items():
        assert hot_read(path) == expected
    made = agent.fuse_requests() - before
    volumes = len({path.parent for path in files})
    made["getattr"] = max(0, made["getattr"] - volumes)
    return {op: n for op, n in made.items() if op in FIRST_READ and n}


@pytest.mark.usefixtures("capabilities")
def test_a_new_pods_first_reads_ask_the_agent_nothing(agent: AgentProcess, manifests: Path) -> None:
    """A volume set up for a new pod is in the kernel's caches before it is bound into the pod's
    directory: entries, attributes, link targets and pages."""
    assert hot_read(agent.volume(POD_UID, "configmap", "config") / "a") == b"alpha"  # (no_open)
    uid = "11111111-2222-4333-8444-666666666666"
    (manifests / "pod-2.yaml").write_text(pod("web-2", uid))
    volume = agent.wait_mounted(agent.volume(uid, "configmap", "config"))
    creds = agent.wait_mounted(agent.volume(uid, "secret", "creds"))
    files = {volume / "a": b"alpha", volume / "b": b"beta", creds / "token": b"t0ken"}
    assert requests_during_first_reads(agent, files) == {}


@pytest.mark.usefixtures("capabilities")
def test_the_first_reads_of_a_new_version_ask_the_agent_nothing(
    agent: AgentProcess, manifests: Path
) -> None:
    """Before `..data` names a new version, the kernel holds its entries, attributes and pages:
    a reloader reading every key when `..data` moves asks nothing (it was ~4 requests a key)."""
    volume = agent.volume(POD_UID, "configmap", "config")
    assert hot_read(volume / "a") == b"alpha"  # (no_open)
    for version in range(2, 5):
        old = os.readlink(volume / "..data")
        write_atomically(manifests / "configmap.yaml", configmap(a=f"{version}", b=f"b{version}"))
        wait_for(lambda: os.readlink(volume / "..data") != old)  # noqa: B023 (read at once)
        wait_for(lambda: agent.volume_status(POD_UID, "config").get("state") == "mounted")
        files = {volume / "a": f"{version}".encode(), volume / "b": f"b{version}".encode()}
        assert requests_during_first_reads(agent, files) == {}


# -- pinned: a read after the kernel dropped its caches ------------------------------------------


def pinned_names(agent: AgentProcess) -> int:
    return int(agent.live_statistics()["publisher"]["pinned"])


def drop_caches() -> None:
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


@pytest.mark.usefixtures("capabilities")
def test_a_read_after_dropped_caches_costs_one_readlink(agent: AgentProcess) -> None:
    """The kernel keeps the entries and attributes of every served name, as a tmpfs keeps its
    own: after `drop_caches` a stat+open of a key asks only its link's target (and `..data`'s,
    once a volume), where it asked a lookup of the link, its target and the file too."""
    wait_for(lambda: pinned_names(agent) == PINNED)
    volume = agent.volume(POD_UID, "configmap", "config")
    keys = FILES[("configmap", "config")]
    assert hot_read(volume / "a") == b"alpha"  # (no_open)

    drop_caches()
    before = agent.fuse_requests()
    for key in keys:
        os.stat(volume / key)
        os.close(os.open(volume / key, os.O_RDONLY))
    made = agent.fuse_requests() - before

    assert {op: n for op, n in made.items() if op in NO_REQUEST} == {"readlink": len(keys) + 1}


def test_the_names_of_old_versions_and_removed_volumes_are_let_go(
    agent: AgentProcess, manifests: Path
) -> None:
    """An update pins the new version's names and lets go of the old one's before it is
    removed; a removed volume's names are let go of before its directory goes, and the kernel
    then forgets its nodes."""
    wait_for(lambda: pinned_names(agent) == PINNED)
    inodes = agent.live_statistics()["fuse_tree"]["nodes"]
    volume = agent.volume(POD_UID, "configmap", "config")

    write_atomically(manifests / "configmap.yaml", configmap(a="2"))
    wait_for(lambda: (volume / "a").read_text() == "2")
    wait_for(lambda: pinned_names(agent) == PINNED, timeout_s=15)  # old one's after grace

    (manifests / "pod.yaml").unlink()
    wait_for(lambda: pinned_names(agent) == 0, timeout_s=15)
    drop_caches()  # the kernel forgets what nobody holds: nothing of the pod's volumes stays
    wait_for(lambda: agent.live_statistics()["fuse_tree"]["nodes"] < inodes, timeout_s=15)


def test_a_version_too_large_to_warm_is_pinned_from_listings(
    agent: AgentProcess, manifests: Path
) -> None:
    """A volume past the warming's bounds (`WARM_FILES`) is bound before the kernel holds its
    names: the pin holder lists its directories (a READDIRPLUS request gives the kernel dozens
    of entries) rather than asking a lookup of each name."""
    wait_for(lambda: pinned_names(agent) == PINNED)
    keys = WARM_FILES + 100
    data = "".join(f"  k{i:05d}: v\n" for i in range(keys))
    before = agent.fuse_requests()
    (manifests / "big.yaml").write_text(
        f"kind: ConfigMap\nmetadata: {{name: big, namespace: default}}\ndata:\n{data}"
    )
    (manifests / "pod-2.yaml").write_text(
        "kind: Pod\nmetadata: {name: big, namespace: default, uid: " + BIG_UID + "}\n"
        "spec: {containers: [{name: c}], volumes: [{name: big, configMap: {name: big}}]}\n"
    )
    wait_for(lambda: pinned_names(agent) == PINNED + 1 + 2 * keys, timeout_s=20)
    made = agent.fuse_requests() - before  # the volume is made whole in memory: no request

    assert made["readdir"] > 0
    assert made["lookup"] < keys / 10, made


BIG_UID = "11111111-2222-4333-8444-777777777777"
