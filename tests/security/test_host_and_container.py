"""A host user and a container as attackers: neither reaches a file of a pod it is not, nor
changes what any pod reads (docs/security.md).

Two tenants' pods on one agent. The host user is `nobody`, or a user of the fsGroup's group; the
container is a process in a mount namespace of its own that holds one pod's bind and nothing else
of the agent's (the other binds and the agent's own mount detached), as root with every
capability, as root with containerd's default set (no CAP_DAC_READ_SEARCH), and as uid 1000.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from fusevol.decode.manifest import parse_manifest
from fusevol.fuse.session import has_fast_read_path
from fusevol.model import Pod
from fusevol.node import layout
from fusevol.volumemanager.cache.desired import DesiredState
from fusevol.volumemanager.cache.store import ObjectStore
from fusevol.volumemanager.populator import Populator
from fusevol.volumemanager.reconciler.sharing import subtree_name
from tests.agent import mountinfo_below, running_agent, wait_for, write_atomically

if TYPE_CHECKING:
    from collections.abc import Iterator

UID_A = "aaaaaaaa-0000-4000-8000-00000000000a"
UID_B = "bbbbbbbb-0000-4000-8000-00000000000b"
SECRET_B = "b-secret-value-7f3a"

MANIFESTS = f"""\
apiVersion: v1
kind: ConfigMap
metadata: {{name: app, namespace: tenant-a}}
data: {{conf: "a-config"}}
---
apiVersion: v1
kind: Pod
metadata: {{name: a, namespace: tenant-a, uid: {UID_A}}}
spec:
  containers: [{{name: c}}]
  volumes:
    - name: config
      configMap: {{name: app, defaultMode: 0777}}
    - name: all
      projected:
        defaultMode: 0666
        sources:
          - configMap: {{name: app}}
          - downwardAPI: {{items: [{{path: name, fieldRef: {{fieldPath: metadata.name}}}}]}}
    - name: labels
      downwardAPI: {{items: [{{path: uid, fieldRef: {{fieldPath: metadata.uid}}}}]}}
---
apiVersion: v1
kind: Secret
metadata: {{name: vault, namespace: tenant-b}}
stringData: {{password: "{SECRET_B}"}}
---
apiVersion: v1
kind: Pod
metadata: {{name: b, namespace: tenant-b, uid: {UID_B}}}
spec:
  securityContext: {{fsGroup: 1000}}
  containers: [{{name: c}}]
  volumes:
    - name: vault
      secret: {{secretName: vault, defaultMode: 0400}}
"""


def _volume(root: Path, uid: str, plugin: str, name: str) -> Path:
    return root / "pods" / uid / "volumes" / f"kubernetes.io~{plugin}" / name


@pytest.fixture
def root() -> Iterator[Path]:
    """An agent root whose parents any user may traverse (pytest's base directory is 0700):
    only what the agent makes may stand between a host user and a pod's files."""
    parent = Path(tempfile.mkdtemp(prefix="fusevol-security-"))
    parent.chmod(0o755)
    yield parent / "root"
    shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture
def two_tenants(tmp_path: Path) -> Path:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "pods.yaml").write_text(MANIFESTS)
    return manifests


_TRY_OPEN = """
import errno, mmap, os, sys
for path in sys.argv[1:]:
    try:
        fd = os.open(path, os.O_RDONLY)
        print(path, "READ", os.read(fd, 100))
    except OSError as exc:
        print(path, errno.errorcode[exc.errno])
    try:
        fd = os.open(path, os.O_RDWR)
        m = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        m[:1] = b"X"
        print(path, "MAPPED-WRITABLE")
    except OSError as exc:
        print(path, errno.errorcode[exc.errno])
"""


def test_under_umask_000_nothing_under_the_root_is_open_to_others(
    two_tenants: Path, root: Path
) -> None:
    wrapper = ("sh", "-c", 'umask 000; exec "$@"', "sh")
    with running_agent(two_tenants, root, wrapper=wrapper) as agent:
        wait_for(_volume(root, UID_B, "secret", "vault").joinpath("password").exists)
        mounts = {line.split()[4] for line in mountinfo_below(root)}
        opened = []
        for directory, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if os.path.join(directory, d) not in mounts]
            for name in [*dirs, *files]:
                path = os.path.join(directory, name)
                mode = stat.S_IMODE(os.lstat(path).st_mode)
                if mode & 0o027 and not stat.S_ISLNK(os.lstat(path).st_mode):
                    opened.append(f"{path} {mode:o}")
        assert opened == []
        assert stat.S_IMODE(root.stat().st_mode) == 0o750
        assert stat.S_IMODE(layout.pods_dir(root).stat().st_mode) == 0o750
        assert stat.S_IMODE(layout.agent_dir(root).stat().st_mode) == 0o700
        for private in (layout.status_file(root), layout.fuse_key_file(root)):
            assert stat.S_IMODE(private.stat().st_mode) == 0o600, private
        assert agent.agent_alive()


def test_a_host_user_reaches_no_served_file_and_changes_none(two_tenants: Path, root: Path) -> None:
    with running_agent(two_tenants, root):
        password = _volume(root, UID_B, "secret", "vault") / "password"
        conf = _volume(root, UID_A, "configmap", "config") / "conf"
        wait_for(password.exists)
        subtrees = os.listdir(layout.fuse_mountpoint(root))
        others = [
            _volume(root, UID_A, "projected", "all") / "conf",
            _volume(root, UID_A, "projected", "all") / "name",
            _volume(root, UID_A, "downward-api", "labels") / "uid",
        ]
        targets = [str(password), str(conf), *map(str, others), str(layout.fuse_mountpoint(root))]
        targets += [str(layout.fuse_mountpoint(root) / s / "conf") for s in subtrees]
        for uid, gid, groups in ((65534, 65534, ""), (1000, 1000, "1000")):
            groups_args = ["--clear-groups"] if not groups else [f"--groups={groups}"]
            seen = subprocess.run(
                [
                    *("setpriv", f"--reuid={uid}", f"--regid={gid}", *groups_args),
                    *(sys.executable, "-c", _TRY_OPEN, *targets),
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            assert "READ" not in seen, seen
            assert "MAPPED-WRITABLE" not in seen, seen
            assert seen.count("EACCES") == 2 * len(targets), seen
        assert conf.read_bytes() == b"a-config"
        assert password.read_bytes() == SECRET_B.encode()


def _readable_subtree_names() -> list[str]:
    """The subtrees' names an attacker can compute from the pods' specs (`subtree_name`)."""
    store, objects = ObjectStore(), parse_manifest(MANIFESTS.encode(), origin="pods.yaml")
    for obj in objects:
        store.upsert(obj)
    populator = Populator(store=store, desired=DesiredState())
    pods = [obj for obj in objects if isinstance(obj, Pod)]
    return [subtree_name(populator.resolve(p, v)).decode() for p in pods for v in p.volumes]


def _probe(
    root: Path, keep: Path, key: str, *args: str, privileges: tuple[str, ...]
) -> dict[str, Any]:
    """Run handle_probe.py in a mount namespace that holds only a bind of `keep`, the pod's own
    volume, at a path any user reaches (as in a container), and none of the agent's mounts."""
    own = root.parent / "container-volume"
    own.mkdir(exist_ok=True)
    detach = "".join(f"umount -l '{line.split()[4]}'; " for line in reversed(mountinfo_below(root)))
    script = f"mount --bind '{keep}' '{own}' && {detach}exec \"$@\""
    # Given as text: a user without privileges may not read the checkout (a CI clone in a 0700
    # temporary directory), as a container reads none of the node's files.
    probe = Path(__file__).with_name("handle_probe.py").read_text()
    names = _readable_subtree_names()
    done = subprocess.run(
        [
            *("unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"),
            *privileges,
            *(sys.executable, "-c", probe, str(own), key, *names, *args),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _handle(path: Path) -> tuple[int, int]:
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        from handle_probe import name_to_handle  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    return name_to_handle(str(path))  # type: ignore[no-any-return]


def test_a_container_reaches_no_other_pods_file_by_handle_or_name(
    two_tenants: Path, root: Path
) -> None:
    with running_agent(two_tenants, root) as agent:
        vault = _volume(root, UID_B, "secret", "vault")
        own = _volume(root, UID_A, "configmap", "config")
        wait_for((vault / "password").exists)
        target, _ = _handle(vault / "..data" / "password")  # as root on the host: B's node id
        everything = ("setpriv", "--reuid=0")
        result = _probe(root, own, "conf", "--nodeid", str(target), privileges=everything)
        nodeid, generation = result["own"]
        assert nodeid >= 1 << 32  # random: no sequence to walk
        assert generation != 0
        # The root's handle is the kernel's (1, 0) whatever the server does; a kernel may refuse
        # it for a handle outside the bind's own subtree (as 6.18's does) or open it, and then
        # the root must list nothing and no name a container can know may open below it.
        assert result["decoded"] in ([], [1]), result
        if result["decoded"]:
            assert result["root_lists"] == "EACCES"
            assert set(result["names"].values()) == {"ENOENT"}, result
        assert result["guessed_generations_that_decode"] == 0
        listed = set(os.listdir(layout.fuse_mountpoint(root)))  # root, in the agent's namespace
        assert len(listed) == 4  # two shared, two a pod's own (its downward API)
        assert not listed & set(_readable_subtree_names())  # keyed: nobody computes them
        assert set(result["changes"].values()) <= {"EROFS", "EACCES", "EPERM"}, result["changes"]
        without = ("setpriv", "--bounding-set=-dac_read_search")  # containerd's default set
        for privileges in (without, ("setpriv", "--reuid=1000", "--regid=1000", "--clear-groups")):
            denied = _probe(root, own, "conf", privileges=privileges)
            assert denied["decoded"] == [], privileges
            assert denied["refusals"] == ["EPERM"], privileges
            assert set(denied["changes"].values()) <= {"EROFS", "EACCES", "EPERM"}, privileges
        # every other pod kept its files and gets its updates meanwhile
        assert (vault / "password").read_bytes() == SECRET_B.encode()
        write_atomically(two_tenants / "pods.yaml", MANIFESTS.replace(SECRET_B, "changed"))
        wait_for(lambda: (vault / "password").read_bytes() == b"changed")
        assert agent.agent_alive()


@pytest.mark.skipif(not has_fast_read_path(), reason="stock pyfuse3 cannot refuse locks")
def test_locks_on_served_files_are_refused_so_no_pod_blocks_another(
    two_tenants: Path, tmp_path: Path
) -> None:
    import errno
    import fcntl

    root = tmp_path / "root"
    with running_agent(two_tenants, root):
        conf = _volume(root, UID_A, "configmap", "config") / "conf"
        wait_for(conf.exists)
        with open(conf, "rb") as f:
            for lock in (
                lambda: fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB),
                lambda: fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB),
                lambda: fcntl.lockf(f, fcntl.LOCK_SH | fcntl.LOCK_NB),
            ):
                with pytest.raises(OSError, match="No locks available") as info:
                    lock()
                assert info.value.errno == errno.ENOLCK


def test_binds_are_read_only_in_every_mount_namespace_they_reach(
    two_tenants: Path, root: Path
) -> None:
    """The chart's agent makes its binds in a mount namespace of its own, below directories the
    host shares with it (kubelet's, Bidirectional): the host's copies of its binds, which kubelet
    and runc use, must be read-only too, not only the agent's (a remount afterwards would be)."""
    root.mkdir()
    subprocess.run(["mount", "--bind", str(root), str(root)], check=True)
    subprocess.run(["mount", "--make-rshared", str(root)], check=True)
    try:
        wrapper = ("unshare", "--mount", "--propagation", "unchanged")
        with running_agent(two_tenants, root, wrapper=wrapper):
            vault = _volume(root, UID_B, "secret", "vault")
            config = _volume(root, UID_A, "configmap", "config")

            def host_options() -> dict[str, list[str]]:  # this test's namespace is the host's
                lines = [line.split() for line in mountinfo_below(root)]
                return {f[4]: f[5].split(",") for f in lines if f[4] in (str(vault), str(config))}

            def both() -> dict[str, list[str]] | None:
                options = host_options()
                return options if len(options) == 2 else None

            seen = wait_for(both)
            assert {path: "ro" in options for path, options in seen.items()} == {
                str(vault): True,
                str(config): True,
            }
            with pytest.raises(OSError, match="Read-only file system"):
                os.open(vault / "password", os.O_RDWR)  # root on the host, through its copy
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)
