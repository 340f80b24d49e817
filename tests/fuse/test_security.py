"""Security: secret bytes never on disk nor in the log, no symlink out of a volume, modes enforced
for other uids, and nobody but the agent can change a volume, through the pod's bind or the
agent's own mount.
"""

from __future__ import annotations

import base64
import errno
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.agent import running_agent, wait_for, write_atomically
from tests.manifests import POD_UID, write_pod_set

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.agent import AgentProcess


POD_A = "a0000000-0000-4000-8000-00000000000a"
POD_B = "b0000000-0000-4000-8000-00000000000b"

SECRET = """\
kind: Secret
metadata: {{name: vault, namespace: default}}
stringData:
  plain: "{plain}"
data:
  encoded: {encoded}
"""

POD = """\
kind: Pod
metadata: {{name: {name}, namespace: default, uid: {uid}}}
spec:
  securityContext: {{fsGroup: 3000}}
  containers: [{{name: c}}]
  volumes:
    - name: vault
      secret:
        secretName: vault
        items: [{{key: plain, path: dir/plain, mode: 0400}}, {{key: encoded, path: encoded}}]
    - name: all
      projected:
        sources:
          - secret: {{name: vault, items: [{{key: encoded, path: nested/deeper/e}}]}}
          - configMap: {{name: app}}
          - downwardAPI: {{items: [{{path: meta/name, fieldRef: {{fieldPath: metadata.name}}}}]}}
    - name: config
      configMap: {{name: app, items: [{{key: a, path: x/y/a}}]}}
    - name: bad
      secret: {{secretName: vault, items: [{{key: missing, path: m}}]}}
"""


def _secret(plain: str, encoded: str) -> str:
    return SECRET.format(plain=plain, encoded=encoded)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _marker() -> str:
    return "m" + base64.b32encode(os.urandom(15)).decode().lower()


def _files_containing(marker: str, roots: list[Path], newer: Path, exclude: set[Path]) -> list[str]:
    """Regular files below `roots` changed since `newer`, on the roots' own file systems only
    (never through a mount: the FUSE mount is memory, and /proc and /sys are not scanned), that
    contain `marker` (grep -r --binary-files=text)."""
    found: set[str] = set()
    for root in roots:
        listing = subprocess.run(
            ["find", str(root), "-xdev", "-type", "f", "-newer", str(newer), "-print0"],
            capture_output=True,
            check=False,
        ).stdout
        files = [f for f in listing.split(b"\0") if f and os.fsdecode(f) not in map(str, exclude)]
        if not files:
            continue
        grep = subprocess.run(
            ["xargs", "-0", "grep", "-l", "--binary-files=text", "-F", "-e", marker, "--"],
            input=b"\0".join(files),
            capture_output=True,
            check=False,
        )
        found.update(grep.stdout.decode(errors="replace").split())
    return sorted(found)


@dataclass
class SecretRun:
    agent: AgentProcess
    markers: dict[str, str]
    """Secret values, each a random string found nowhere else."""
    stamp: Path
    """Touched before anything of the run was written."""


@pytest.fixture
def secret_run(manifests: Path, tmp_path: Path) -> Iterator[SecretRun]:
    stamp = tmp_path / "stamp"
    stamp.touch()
    time.sleep(0.01)  # coarse file system timestamps: later files are strictly newer
    markers = {"plain": _marker(), "encoded": _marker()}
    (manifests / "vault.yaml").write_text(_secret(markers["plain"], _b64(markers["encoded"])))
    (manifests / "pod-a.yaml").write_text(POD.format(name="pod-a", uid=POD_A))
    (manifests / "pod-b.yaml").write_text(POD.format(name="pod-b", uid=POD_B))
    with running_agent(
        manifests,
        tmp_path / "root",
        expect_log=("mount failed .*references non-existent secret key: missing",),
    ) as agent:
        for uid in (POD_A, POD_B):
            for volume in ("vault", "all", "config"):
                agent.wait_state(uid, volume, "mounted")
            agent.wait_state(uid, "bad", "failed")
        yield SecretRun(agent, markers, stamp)


def test_secret_bytes_are_never_on_disk_nor_in_the_log(
    secret_run: SecretRun, tmp_path: Path
) -> None:
    agent, markers, stamp = secret_run.agent, secret_run.markers, secret_run.stamp
    # The bytes are served (from memory) ...
    vault = agent.volume(POD_A, "secret", "vault")
    assert (vault / "dir" / "plain").read_text() == markers["plain"]
    projected = agent.volume(POD_B, "projected", "all")
    assert (projected / "nested/deeper/e").read_text() == markers["encoded"]
    # ... across an update, a rejected edit and the missing-key failure of volume "bad".
    markers["updated"] = _marker()
    write_atomically(
        agent.manifests / "vault.yaml", _secret(markers["plain"], _b64(markers["updated"]))
    )
    wait_for(lambda: (vault / "encoded").read_text() == markers["updated"], timeout_s=5)
    agent.expect_log("manifest rejected, keeping its previous objects: .*illegal base64 data")
    write_atomically(agent.manifests / "vault.yaml", _secret(markers["plain"], "'not base64!'"))
    wait_for(lambda: "vault.yaml: secret default/vault" in agent.log_text())
    roots = [agent.root, tmp_path.parent, Path("/tmp"), Path.cwd()]
    manifest = agent.manifests / "vault.yaml"
    # The scan finds what is there: a canary written after the stamp, in binary.
    canary = _marker()
    (tmp_path / "canary.bin").write_bytes(b"\0\xff" + canary.encode() + b"\0")
    assert _files_containing(canary, roots, stamp, exclude=set()) == [str(tmp_path / "canary.bin")]
    while_running = {
        name: _files_containing(marker, roots, stamp, exclude={manifest})
        for name, marker in markers.items()
    }
    agent.stop()
    after_stop = {
        name: _files_containing(marker, roots, stamp, exclude={manifest})
        for name, marker in markers.items()
    }
    assert while_running == after_stop == {name: [] for name in markers}
    log = agent.log_text()
    assert "manifest rejected" in log  # the log was written, at debug level
    assert "DEBUG" in log
    for marker in markers.values():
        assert marker not in log


def _symlinks(top: Path) -> Iterator[Path]:
    for directory, dirs, files in os.walk(top):
        for name in dirs + files:
            if os.path.islink(os.path.join(directory, name)):
                yield Path(directory, name)


def test_every_symlink_stays_inside_its_volume(secret_run: SecretRun) -> None:
    agent = secret_run.agent
    checked = 0
    for uid in (POD_A, POD_B):
        for plugin, name in (("secret", "vault"), ("projected", "all"), ("configmap", "config")):
            volume = agent.volume(uid, plugin, name)
            fuse_subtree = agent.fuse_subtree(volume)
            for top in (volume, fuse_subtree):
                real_top = os.path.realpath(top)
                for link in _symlinks(top):
                    target = os.readlink(link)
                    assert not target.startswith("/"), (link, target)
                    resolved = os.path.realpath(link)
                    assert resolved.startswith(real_top + "/"), (link, target, resolved)
                    assert os.path.exists(resolved), link
                    checked += 1
    assert checked >= 2 * 2 * (3 + 3 + 2)  # top-level links and ..data of every volume


# Like a container that has the volume bound: the directory is reached as root, the file opened
# as another uid (the test's temporary directories above the volume are 0700).
AS_USER = """
import os, sys
uid, groups, path = int(sys.argv[1]), [int(g) for g in sys.argv[2].split(",") if g], sys.argv[3]
directory = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
os.setgroups(groups); os.setgid(uid); os.setuid(uid)
try:
    os.close(os.open(os.path.basename(path), os.O_RDONLY, dir_fd=directory))
except OSError as exc:
    print(exc.errno)
else:
    print(0)
"""


def _open_as(uid: int, groups: list[int], path: Path) -> int:
    out = subprocess.run(
        [sys.executable, "-c", AS_USER, str(uid), ",".join(map(str, groups)), str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out)


def test_modes_deny_other_uids(secret_run: SecretRun) -> None:
    agent = secret_run.agent
    plain = agent.volume(POD_A, "secret", "vault") / "dir" / "plain"
    status = plain.stat()
    # mode 0400 with fsGroup 3000: kubelet's ownership walk makes it 0440, group 3000.
    assert (oct(status.st_mode & 0o7777), status.st_gid) == (oct(0o440), 3000)
    assert _open_as(1000, [], plain) == errno.EACCES
    assert _open_as(1000, [2999], plain) == errno.EACCES
    assert _open_as(1000, [3000], plain) == 0
    # The healthy pod's secret, 0400 without fsGroup: only its owner (root) may read it.
    token = agent.volume(POD_UID, "secret", "creds") / "token"
    assert oct(token.stat().st_mode & 0o777) == oct(0o400)
    assert _open_as(1000, [0], token) == errno.EACCES
    assert _open_as(1000, [], agent.volume(POD_UID, "configmap", "config") / "a") == 0


def _renameat2(old: Path, new: Path, flags: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(-100, os.fsencode(old), -100, os.fsencode(new), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2

ATTEMPTS = [
    pytest.param(lambda v, n: (v / "a").write_text("x"), id="write-existing"),
    pytest.param(lambda v, n: (v / n).write_text("x"), id="create"),
    pytest.param(lambda v, n: (v / "a").unlink(), id="unlink"),
    pytest.param(lambda v, n: (v / "a").rename(v / "z"), id="rename"),
    pytest.param(lambda v, n: os.chmod(v / "..data" / "a", 0o777), id="chmod"),
    pytest.param(lambda v, n: os.mkdir(v / n), id="mkdir-version"),
    pytest.param(lambda v, n: os.mkdir(v.parent / f"{n}-volume"), id="mkdir-at-mount-root"),
    pytest.param(lambda v, n: os.symlink(n, v / "..data_tmp"), id="symlink-data-tmp"),
    pytest.param(lambda v, n: os.symlink("/etc", v / "evil"), id="symlink-out"),
    pytest.param(lambda v, n: os.rename(v / "..data", v / "..data_old"), id="rename-data"),
    pytest.param(lambda v, n: os.rename(v / "a", v / "..data"), id="rename-over-data"),
    pytest.param(lambda v, n: os.rename(v / os.readlink(v / "..data"), v / n), id="rename-version"),
    pytest.param(
        lambda v, n: _renameat2(v / "a", v / "..data", RENAME_EXCHANGE), id="renameat2-exchange"
    ),
    pytest.param(
        lambda v, n: _renameat2(v / "a", v / n, RENAME_NOREPLACE), id="renameat2-noreplace"
    ),
    pytest.param(lambda v, n: os.unlink(v / "..data"), id="unlink-data"),
    pytest.param(lambda v, n: os.rmdir(v / os.readlink(v / "..data")), id="rmdir-version"),
    pytest.param(lambda v, n: os.link(v / "..data" / "a", v / n), id="hardlink"),
    pytest.param(lambda v, n: os.mkfifo(v / n), id="mkfifo"),
    pytest.param(lambda v, n: os.truncate(v / "..data" / "a", 0), id="truncate"),
    pytest.param(lambda v, n: os.chown(v / "..data" / "a", 1000, 1000), id="chown"),
    pytest.param(lambda v, n: os.utime(v / "..data" / "a", (0, 0)), id="utime"),
    pytest.param(lambda v, n: os.setxattr(v / "..data" / "a", "user.x", b"1"), id="setxattr"),
]


@pytest.fixture(scope="module")
def shared_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    base = tmp_path_factory.mktemp("publish")
    manifests = base / "manifests"
    manifests.mkdir()
    write_pod_set(manifests)
    with running_agent(manifests, base / "root") as agent:
        agent.wait_state(POD_UID, "config", "mounted")
        yield agent
        agent.stop()


# The pod's volume directory is a read-only bind of the volume's subtree; its parent is the node's
# disk, so an attempt at the mount's root is only one on the agent's own mount.
WAYS = [
    pytest.param(via, *attempt.values, id=f"{via}-{attempt.id}")
    for via in ("pod-volume-dir", "fuse-mount")
    for attempt in ATTEMPTS
    if via == "fuse-mount" or attempt.id != "mkdir-at-mount-root"
]


@pytest.mark.parametrize(("via", "attempt"), WAYS)
def test_no_other_process_can_change_a_volume(
    shared_agent: AgentProcess, attempt: object, via: str
) -> None:
    """A root process other than the agent tries each step of the agent's publishing sequence
    and its neighbours, through the pod's read-only bind and on the agent's own FUSE mount
    (where the agent itself publishes): EROFS, and the volume is unchanged."""
    volume = shared_agent.volume(POD_UID, "configmap", "config")
    if via == "fuse-mount":
        volume = shared_agent.fuse_subtree(volume)
    before = os.readlink(volume / "..data")
    with pytest.raises(OSError, match="Read-only file system") as raised:
        attempt(volume, "..2099_01_01_00_00_00.1")  # type: ignore[operator]
    assert raised.value.errno == errno.EROFS, raised.value
    assert os.readlink(volume / "..data") == before
    assert (volume / "a").read_bytes() == b"alpha"
    assert sorted(os.listdir(volume)) == sorted(["..data", before, "a", "b"])
