"""The audit of reads with containers: two pods' containers, run by containerd with the CRI's
annotations, read the same audited Secret, and every read is recorded with who read it.

The agent runs with `--audit secrets --container-runtime-state <this containerd's state>`: the
audit server names a reader's container by the last element of its cgroup path (ctr's default
cgroup is `/<namespace>/<container id>`) and finds its pod and container names in that
container's bundle (`<state>/io.containerd.runtime.v2.task/default/<id>/config.json`), whose
annotations `ctr run --annotation` sets as containerd's CRI would.

Readers: busybox `cat` (as root and as uid 1000), and `peek`, a small static C program compiled
here into the busybox rootfs (busybox has no mmap and the rootfs no python): `peek hold` opens the
file, reads it, then waits for a file to appear and reads it again with pread (after an update of
the Secret: it reads the version its open pinned), `peek map` maps the file and prints it. Each
reader waits at a gate until the host has found its pid (`ctr task ps`): the pid the record must
carry is the host's, not the container's.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import textwrap
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest

from fusevol.fuse.audit_records import records_path
from fusevol.fuse.servers import AUDIT
from fusevol.node import layout
from tests.agent import running_agent, wait_for, write_atomically
from tests.containerd.runtime import Containerd, bind, needs_containerd

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.agent import AgentProcess

pytestmark = [needs_containerd, pytest.mark.containerd]

NAMESPACE = "shop"
WEB_UID = "aaaaaaaa-0000-4000-8000-000000000061"
WORKER_UID = "bbbbbbbb-0000-4000-8000-000000000061"
VALUE = "s3cr3t-audited-through-containers-1"
NEW_VALUE = "s3cr3t-audited-through-containers-2"


def secret(value: str) -> str:
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Secret
        metadata: {{name: db, namespace: {NAMESPACE}}}
        stringData: {{password: "{value}", user: admin}}
        """)


def pod(name: str, uid: str, container: str, mount_path: str) -> str:
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Pod
        metadata: {{name: {name}, namespace: {NAMESPACE}, uid: {uid}}}
        spec:
          containers:
            - name: {container}
              volumeMounts: [{{name: creds, mountPath: {mount_path}}}]
          volumes:
            - {{name: creds, secret: {{secretName: db, defaultMode: 0444}}}}
        """)


PEEK = r"""
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* peek hold FILE READY GO: open FILE, read it, print it; create READY; wait until GO exists;
   pread FILE again from the same open file, print it.
   peek map FILE: map FILE and print it. */
static void out(const char *data, size_t n) {
    fwrite(data, 1, n, stdout);
    fputc('\n', stdout);
    fflush(stdout);
}

int main(int argc, char **argv) {
    char buf[4096];
    if (argc == 5 && strcmp(argv[1], "hold") == 0) {
        int fd = open(argv[2], O_RDONLY);
        if (fd < 0) { perror("open"); return 2; }
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0) { perror("read"); return 2; }
        out(buf, (size_t)n);
        int ready = open(argv[3], O_WRONLY | O_CREAT, 0644);
        if (ready < 0) { perror("ready"); return 2; }
        close(ready);
        struct timespec pause = {0, 5 * 1000 * 1000};
        while (access(argv[4], F_OK) != 0) nanosleep(&pause, NULL);
        n = pread(fd, buf, sizeof buf, 0);
        if (n < 0) { perror("pread"); return 2; }
        out(buf, (size_t)n);
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "map") == 0) {
        int fd = open(argv[2], O_RDONLY);
        if (fd < 0) { perror("open"); return 2; }
        struct stat st;
        if (fstat(fd, &st) != 0 || st.st_size == 0) { perror("fstat"); return 2; }
        char *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) { perror("mmap"); return 2; }
        out(m, (size_t)st.st_size);
        munmap(m, (size_t)st.st_size);
        return 0;
    }
    fprintf(stderr, "usage: peek hold FILE READY GO | peek map FILE\n");
    return 64;
}
"""

GATE = 'touch "$1"; while [ ! -e "$2" ]; do usleep 5000; done; shift 2; exec "$@"'
"""Announce itself by creating $1, wait for $2, then become the reader (the same pid)."""


@pytest.fixture(scope="module")
def peek(rootfs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`/bin/peek` in the module's rootfs, compiled statically here."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("needs gcc to build the mmap/hold reader (.ci/setup installs it)")
    source = tmp_path_factory.mktemp("peek") / "peek.c"
    source.write_text(PEEK)
    built = subprocess.run(
        [gcc, "-static", "-O2", "-Wall", "-Werror", "-o", str(rootfs / "bin" / "peek"), source],
        capture_output=True,
        text=True,
        check=False,
    )
    if built.returncode != 0:
        pytest.skip(f"gcc -static cannot build here (needs libc6-dev's libc.a): {built.stderr}")
    return rootfs / "bin" / "peek"


@pytest.fixture
def agent(containerd: Containerd, tmp_path: Path) -> Iterator[AgentProcess]:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "secret.yaml").write_text(secret(VALUE))
    (manifests / "web.yaml").write_text(pod("web", WEB_UID, "app", "/etc/creds"))
    (manifests / "worker.yaml").write_text(pod("worker", WORKER_UID, "sidecar", "/run/creds"))
    with running_agent(
        manifests,
        tmp_path / "root",
        "--audit",
        "secrets",
        "--container-runtime-state",
        str(containerd.directory / "state"),
    ) as running:
        yield running
        running.stop()
    assert not AUDIT.is_serving(tmp_path / "root"), "a clean stop stops the audit server"


def fusevol(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fusevol", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@dataclass(frozen=True)
class Container:
    """A pod's container, run by ctr with the annotations containerd's CRI gives one."""

    containerd: Containerd
    id: str
    name: str
    pod: dict[str, str]
    out: Path
    """Bound at /out (rw, open to every uid): the readers' gates."""

    @classmethod
    def run(
        cls,
        containerd: Containerd,
        rootfs: Path,
        root: Path,
        *,
        container_id: str,
        name: str,
        pod_name: str,
        pod_uid: str,
        out: Path,
    ) -> Container:
        """`fusevol wait`, then `ctr run` with `fusevol mounts --format ctr`'s mounts."""
        pod_ref = f"{NAMESPACE}/{pod_name}"
        waited = fusevol("wait", "--root", str(root), pod_ref, "--timeout", "30s")
        assert waited.returncode == 0, waited.stderr
        listed = fusevol("mounts", "--root", str(root), pod_ref, "--container", name)
        assert listed.returncode == 0, listed.stderr
        words = shlex.split(listed.stdout)
        assert words[::2] == ["--mount"] * (len(words) // 2), words
        out.mkdir()
        out.chmod(0o777)
        annotations = {
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.container-name": name,
            "io.kubernetes.cri.sandbox-name": pod_name,
            "io.kubernetes.cri.sandbox-namespace": NAMESPACE,
            "io.kubernetes.cri.sandbox-uid": pod_uid,
        }
        containerd.run(
            container_id,
            rootfs,
            *words[1::2],
            bind(out, "/out", "rw"),
            command=("sleep", "3600"),
            annotations=annotations,
        )
        pod = {"namespace": NAMESPACE, "name": pod_name, "uid": pod_uid}
        return cls(containerd, container_id, name, pod, out)

    def start(self, name: str, *command: str, user: int = 0) -> Reader:
        return Reader(self, name, command, user)

    def read(self, name: str, *command: str, user: int = 0) -> tuple[str, int]:
        """Run a reader to its end: (its output, its host pid)."""
        reader = self.start(name, *command, user=user)
        result = reader.finish()
        assert result.returncode == 0, result
        return result.stdout, reader.pid


class Reader:
    """`command` run in a container by `ctr task exec` (as `user`), held at a gate until `go()`
    while its pid is found on the host: the gate's shell becomes the reader by `exec`."""

    def __init__(self, container: Container, name: str, command: tuple[str, ...], user: int):
        self.container = container
        self._ready, self._go = container.out / f"{name}.ready", container.out / f"{name}.go"
        argv = ("sh", "-c", GATE, "gate", f"/out/{name}.ready", f"/out/{name}.go", *command)
        self.result: subprocess.CompletedProcess[str] | None = None
        self._thread = threading.Thread(target=self._run, args=(argv, user), daemon=True)
        self._thread.start()
        wait_for(self._ready.exists, timeout_s=30)
        self.pid = wait_for(lambda: self._gate_pid(argv), timeout_s=10)

    def _run(self, argv: tuple[str, ...], user: int) -> None:
        self.result = self.container.containerd.exec(self.container.id, *argv, user=user)

    def _gate_pid(self, argv: tuple[str, ...]) -> int | None:
        for pid in self.container.containerd.pids(self.container.id):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
            except OSError:
                continue
            if [os.fsdecode(part) for part in cmdline] == list(argv):
                return pid
        return None

    def go(self) -> None:
        self._go.touch()

    def finish(self) -> subprocess.CompletedProcess[str]:
        self.go()
        self._thread.join(timeout=60)
        assert self.result is not None, "ctr task exec did not return"
        return self.result


class Read(NamedTuple):
    """What a read's record must say."""

    container: Container | None  # None: on the host
    pid: int
    command: str
    uid: int
    resource_version: str
    version_dir: str


def records(agent: AgentProcess) -> list[dict[str, Any]]:
    path = records_path(agent.root)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def resource_version(agent: AgentProcess, pod_uid: str) -> str:
    """The Secret's resourceVersion in the pod's volume, as the agent's status shows it."""
    objects = agent.volume_status(pod_uid, "creds")["objects"]
    assert isinstance(objects, dict), objects
    (version,) = objects.values()
    return str(version)


@pytest.mark.usefixtures("peek")
def test_reads_in_containers_are_recorded_with_their_pod_container_process_and_version(
    containerd: Containerd, rootfs: Path, agent: AgentProcess, tmp_path: Path
) -> None:
    running: list[Container] = []
    try:
        running.append(
            Container.run(
                containerd,
                rootfs,
                agent.root,
                container_id=secrets.token_hex(32),  # as a CRI's: 64 hex digits
                name="app",
                pod_name="web",
                pod_uid=WEB_UID,
                out=tmp_path / "out-web",
            )
        )
        running.append(
            Container.run(
                containerd,
                rootfs,
                agent.root,
                container_id="audit-worker-sidecar",  # a container's by its bundle alone
                name="sidecar",
                pod_name="worker",
                pod_uid=WORKER_UID,
                out=tmp_path / "out-worker",
            )
        )
        reads = read_before_and_after_an_update(agent, *running)
    finally:
        for container in running:
            containerd.remove(container.id)

    events = records(agent)
    assert len(events) == len(reads), json.dumps(events, indent=1)
    for event, read in zip(events, reads, strict=True):
        reader = event["reader"]
        assert (reader["pid"], reader["command"], reader["uid"]) == (
            read.pid,
            read.command,
            read.uid,
        ), event
        assert event["objectRef"] == {
            "kind": "Secret",
            "namespace": NAMESPACE,
            "name": "db",
            "resourceVersion": read.resource_version,
            "key": "password",
        }, event
        assert event["volume"]["name"] == "creds", event
        assert event["volume"]["path"] == "password", event
        assert event["volume"]["version"] == read.version_dir, event
        if read.container is None:
            assert reader["where"] == "host", event
            assert "container" not in reader, event
            assert "pod" not in reader, event
            assert event["pod"] == running[0].pod, event  # the pod whose volume it is: web
        else:
            assert reader["where"] == "container", event
            wanted = {"id": read.container.id, "name": read.container.name}
            assert reader["container"] == wanted, event
            assert reader["pod"] == read.container.pod, event
            assert event["pod"] == read.container.pod, event
    assert_no_secret_value(agent)


def read_before_and_after_an_update(
    agent: AgentProcess, web: Container, worker: Container
) -> list[Read]:
    """The reads, in order, each with what its record must say."""
    web_volume = agent.volume(WEB_UID, "secret", "creds")
    worker_volume = agent.volume(WORKER_UID, "secret", "creds")
    assert records(agent) == [], "nothing was opened yet"
    version_1 = resource_version(agent, WEB_UID)
    assert resource_version(agent, WORKER_UID) == version_1
    # A readlink is no open: not recorded. Each pod's audited volume is a subtree of its own, whose
    # version directories are named when each is published (the same name only if in one second).
    dir_1 = os.readlink(web_volume / "..data")
    worker_dir_1 = os.readlink(worker_volume / "..data")

    # Before the update: cat in web's container as root and as uid 1000, a map in worker's, and
    # worker's holder, which reads once and keeps the file open.
    reads: list[Read] = []
    text, pid = web.read("cat-root", "cat", "/etc/creds/password")
    assert text == VALUE
    reads.append(Read(web, pid, "cat", 0, version_1, dir_1))
    text, pid = web.read("cat-1000", "cat", "/etc/creds/password", user=1000)
    assert text == VALUE
    reads.append(Read(web, pid, "cat", 1000, version_1, dir_1))
    text, pid = worker.read("map", "/bin/peek", "map", "/run/creds/password")
    assert text == VALUE + "\n"
    reads.append(Read(worker, pid, "peek", 0, version_1, worker_dir_1))
    hold = ("/bin/peek", "hold", "/run/creds/password", "/out/held", "/out/reread")
    holder = worker.start("hold", *hold, user=1000)
    holder.go()
    wait_for((worker.out / "held").exists, timeout_s=30)
    reads.append(Read(worker, holder.pid, "peek", 1000, version_1, worker_dir_1))
    assert len(records(agent)) == len(reads), "each open is recorded before it is answered"

    # The update: both volumes switch to the new version.
    write_atomically(agent.manifests / "secret.yaml", secret(NEW_VALUE))
    dir_2 = wait_for(lambda: _other(os.readlink(web_volume / "..data"), dir_1), timeout_s=30)
    wait_for(lambda: _other(os.readlink(worker_volume / "..data"), worker_dir_1), timeout_s=30)
    version_2 = wait_for(lambda: _other(resource_version(agent, WEB_UID), version_1), timeout_s=30)

    # The holder reads again through its open: the old value (its open pinned the old version).
    # A fresh cat reads the new one, and so does a root cat on the host, of web's volume.
    (worker.out / "reread").touch()
    held = holder.finish()
    assert held.returncode == 0, held
    assert held.stdout == f"{VALUE}\n{VALUE}\n"
    text, pid = web.read("cat-after", "cat", "/etc/creds/password")
    assert text == NEW_VALUE
    reads.append(Read(web, pid, "cat", 0, version_2, dir_2))
    host_cat = subprocess.Popen(["cat", web_volume / "password"], stdout=subprocess.PIPE)
    assert host_cat.communicate(timeout=30)[0] == NEW_VALUE.encode()
    reads.append(Read(None, host_cat.pid, "cat", 0, version_2, dir_2))
    return reads


def _other(now: str, old: str) -> str | None:
    return now if now != old else None


def assert_no_secret_value(agent: AgentProcess) -> None:
    """Neither value of the Secret in any file below the agent's root outside its mounts (the
    records, the servers' logs, status.json, the audit index), nor in the agent's log."""
    files: dict[Path, bytes] = {agent.log_path: agent.log_path.read_bytes()}
    for directory, subdirs, names in os.walk(agent.root):
        device = os.stat(directory).st_dev
        subdirs[:] = [d for d in subdirs if os.lstat(os.path.join(directory, d)).st_dev == device]
        for name in names:
            path = Path(directory, name)
            if path.is_file() and not path.is_symlink():
                files[path] = path.read_bytes()
    index = layout.agent_dir(agent.root) / "audit-index"
    for wanted in (
        records_path(agent.root),
        AUDIT.log_path(agent.root),
        layout.status_file(agent.root),
    ):
        assert wanted in files, sorted(files)
    assert any(path.parent == index for path in files), sorted(files)
    for path, data in files.items():
        for value in (VALUE, NEW_VALUE):
            assert value.encode() not in data, f"{path} holds the secret"
