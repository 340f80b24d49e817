"""The audit of reads on a real agent: audited volumes bound from the audit file system, every open
of their files recorded with who opened which version, unaudited volumes left on the fast path.

Readers are real processes on the host (`cat`, a program that maps the file, one that sends it
with sendfile, one that holds it open across an update); containers are tests/containerd's.
Every test ends by searching every file the agent and the audit server wrote, and what the agent
serves over HTTP, for the Secret's value.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING, Any

import pytest

from fusevol.fuse.audit_records import records_path
from fusevol.fuse.servers import AUDIT
from fusevol.fuse.vfs_helper import PUBLISHER_GID
from tests.agent import running_agent, wait_for, write_atomically

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.agent import AgentProcess
    from tests.inotify import Watcher

UID = "aaaaaaaa-0000-4000-8000-000000000057"
VALUE = "hunter2-the-audited-secret-value"
NEW_VALUE = "hunter3-the-audited-secret-value"


def secret(value: str = VALUE) -> str:
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Secret
        metadata: {{name: db, namespace: default}}
        stringData: {{password: "{value}", user: admin}}
        """)


def pod(annotations: str = "{}") -> str:
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Pod
        metadata: {{name: app, namespace: default, uid: {UID}, annotations: {annotations}}}
        spec:
          containers: [{{name: c}}]
          volumes:
            - {{name: creds, secret: {{secretName: db}}}}
            - {{name: conf, configMap: {{name: cfg}}}}
        """)


CONFIGMAP = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: cfg, namespace: default}
data: {a: "1"}
"""


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    directory = tmp_path / "manifests"
    directory.mkdir()
    (directory / "secret.yaml").write_text(secret())
    (directory / "configmap.yaml").write_text(CONFIGMAP)
    (directory / "pod.yaml").write_text(pod())
    return directory


@pytest.fixture
def audited(manifests: Path, tmp_path: Path) -> Iterator[AgentProcess]:
    with running_agent(manifests, tmp_path / "root", "--audit", "secrets") as agent:
        agent.wait_state(UID, "creds", "mounted")
        agent.wait_state(UID, "conf", "mounted")
        yield agent
        agent.stop()
    assert not AUDIT.is_serving(tmp_path / "root"), "a clean stop stops the audit server"


def records(agent: AgentProcess) -> list[dict[str, Any]]:
    path = records_path(agent.root)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=True, capture_output=True, text=True)


def mount_types(agent: AgentProcess) -> dict[str, str]:
    """Pod volume name -> the file system type of what is mounted there."""
    found = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            path, fstype = fields[4], fields[fields.index("-") + 1]
            if path.startswith(str(agent.root / "pods")):
                found[path.rsplit("/", 1)[1]] = fstype
    return found


def test_every_open_of_an_audited_file_is_recorded_with_its_reader_and_version(
    audited: AgentProcess, manifests: Path
) -> None:
    agent = audited
    creds = agent.volume(UID, "secret", "creds")
    assert mount_types(agent) == {"creds": AUDIT.fstype, "conf": "fuse.fusevol"}

    # cat, then a program that maps the file, then one that sends it with sendfile.
    assert run("cat", str(creds / "password")).stdout == VALUE
    mapped = f"""
import mmap, os
fd = os.open({str(creds / "password")!r}, os.O_RDONLY)
with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as m:
    print(m[:].decode(), end="")
"""
    assert run(sys.executable, "-c", mapped).stdout == VALUE
    sent = f"""
import os
src = os.open({str(creds / "password")!r}, os.O_RDONLY)
r, w = os.pipe()
n = os.sendfile(w, src, 0, 4096)
print(os.read(r, n).decode(), end="")
"""
    assert run(sys.executable, "-c", sent).stdout == VALUE
    wait_for(lambda: len(records(agent)) == 3)
    first = records(agent)
    python = os.path.basename(sys.executable)[:15]
    assert [r["reader"]["command"] for r in first] == ["cat", python, python]
    assert first[0]["reader"]["executable"] == os.path.realpath("/bin/cat")
    for event in first:
        assert event["kind"] == "Event"
        assert event["verb"] == "open"
        assert event["node"] == "test-node"
        assert event["reader"]["where"] == "host"
        assert event["reader"]["uid"] == 0
        assert event["pod"] == {"namespace": "default", "name": "app", "uid": UID}
        assert event["volume"]["name"] == "creds"
        assert event["volume"]["path"] == "password"
        assert event["objectRef"]["kind"] == "Secret"
        assert event["objectRef"]["name"] == "db"
        assert event["objectRef"]["key"] == "password"
    version_1 = first[0]["objectRef"]["resourceVersion"]
    assert {e["objectRef"]["resourceVersion"] for e in first} == {version_1}

    # A reader holding the file open across an update reads its version, and was recorded
    # with it; the next open is of the new version, recorded with the new resourceVersion.
    with subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"""
import os, sys
fd = os.open({str(creds / "password")!r}, os.O_RDONLY)
print(os.pread(fd, 4096, 0).decode(), flush=True)
sys.stdin.readline()
print(os.pread(fd, 4096, 0).decode(), flush=True)
""",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        assert holder.stdout is not None
        assert holder.stdin is not None
        assert holder.stdout.readline().strip() == VALUE
        write_atomically(manifests / "secret.yaml", secret(NEW_VALUE))
        wait_for(lambda: (creds / "password").read_text() == NEW_VALUE)
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == VALUE  # its open pinned the old version
        assert holder.wait(timeout=10) == 0
    wait_for(lambda: len(records(agent)) >= 5)
    events = records(agent)
    held = [e for e in events if e["reader"]["pid"] == holder.pid]
    assert len(held) == 1
    assert held[0]["objectRef"]["resourceVersion"] == version_1
    later = events[-1]  # the read_text() that saw the new value
    assert later["objectRef"]["resourceVersion"] != version_1
    assert later["volume"]["version"] != held[0]["volume"]["version"]

    # Nothing of the unaudited volume is recorded; the status lists what was read and not.
    assert (agent.volume(UID, "configmap", "conf") / "a").read_text() == "1"
    status = wait_for(lambda: _audit_line(agent.status()))
    assert "volume creds" in status
    assert "read password" in status
    assert "never read: user" in status
    assert all(e["volume"]["name"] == "creds" for e in records(agent))

    opens = len(records(agent))
    wait_for(lambda: audit_counts(agent) == {("Secret", "db", "password"): opens})
    assert_no_secret_value(agent)


def test_an_audited_volume_updates_as_any_other_with_kubelets_inotify_events(
    audited: AgentProcess, manifests: Path, watch: Callable[[Path], Watcher]
) -> None:
    """The publisher's steps go through the audit mount (passed on to the agent's), so that a
    watcher of the audited volume (configmap-reload, a certificate reloader) sees them; reading
    the links and listing the volume record nothing (no file is opened)."""
    creds = audited.volume(UID, "secret", "creds")
    watcher = watch(creds)
    old = (creds / "..data").readlink()
    write_atomically(manifests / "secret.yaml", secret(NEW_VALUE))
    events = watcher.events_until("MOVED_TO ..data")
    new = (creds / "..data").readlink()
    assert new != old
    assert "CREATE,ISDIR " + str(new) in events
    assert "CREATE ..data_tmp" in events
    assert "MOVED_FROM ..data_tmp" in events
    assert "MOVED_TO ..data" in events
    listed = set(os.listdir(creds)) - {str(old)}  # the old version goes after a grace period
    assert listed == {"..data", str(new), "password", "user"}
    assert records(audited) == []
    assert (creds / "password").read_text() == NEW_VALUE
    wait_for(lambda: "DELETE,ISDIR " + str(old) in watcher.events_until("DELETE,ISDIR " + str(old)))
    (event,) = records(audited)
    assert event["volume"]["version"] == str(new)


def test_the_records_and_the_audit_mount_are_roots_alone(audited: AgentProcess) -> None:
    """A host user other than root reaches neither the records nor the audit server's mount, and
    the volume only as its mode allows (kubelet's 0644 under a 0750 pod directory: not at all)."""
    agent = audited
    creds = agent.volume(UID, "secret", "creds")
    assert oct(records_path(agent.root).parent.stat().st_mode & 0o777) == "0o700"
    for path in (records_path(agent.root), AUDIT.mountpoint(agent.root), creds / "password"):
        refused = subprocess.run(
            ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "cat", str(path)],
            capture_output=True,
            text=True,
        )
        assert refused.returncode != 0, path
        assert "Permission denied" in refused.stderr, path
    assert records(agent) == [], "a refused open reaches no server: nothing was read"


def test_only_the_publisher_changes_an_audited_volume(audited: AgentProcess) -> None:
    """A pod's bind is read-only, whoever asks (root, root with the publisher's group); on the
    audit mount itself the server refuses anyone but the publisher."""
    creds = audited.volume(UID, "secret", "creds")
    with open("/proc/self/mountinfo") as f:  # the bind's root on the audit mount: its subtree
        (root,) = [line.split()[3] for line in f if line.split()[4] == str(creds)]
    subtree = AUDIT.mountpoint(audited.root) / root.lstrip("/")
    assert (subtree / "password").read_text() == VALUE
    for argv in (
        ["mkdir", str(creds / "x")],
        ["setpriv", "--regid", str(PUBLISHER_GID), "--clear-groups", "mkdir", str(creds / "x")],
        ["mv", str(creds / "password"), str(creds / "stolen")],
        ["mkdir", str(subtree / "x")],
        ["rm", str(subtree / "password")],
    ):
        refused = subprocess.run(argv, capture_output=True, text=True)
        assert refused.returncode != 0, argv
        assert "Read-only file system" in refused.stderr, argv
    assert (creds / "password").read_text() == VALUE


def test_a_pod_may_ask_for_more_audit_never_less(manifests: Path, tmp_path: Path) -> None:
    (manifests / "pod.yaml").write_text(pod('{"fusevol.io/audit": "off"}'))
    with running_agent(manifests, tmp_path / "root", "--audit", "secrets") as agent:
        agent.wait_state(UID, "creds", "mounted")
        agent.wait_state(UID, "conf", "mounted")
        assert mount_types(agent) == {"creds": AUDIT.fstype, "conf": "fuse.fusevol"}
        write_atomically(manifests / "pod.yaml", pod('{"fusevol.io/audit": "all"}'))
        wait_for(lambda: mount_types(agent).get("conf") == AUDIT.fstype)
        assert (agent.volume(UID, "configmap", "conf") / "a").read_text() == "1"
        wait_for(lambda: any(e["volume"]["name"] == "conf" for e in records(agent)))
        (event,) = [e for e in records(agent) if e["volume"]["name"] == "conf"]
        assert event["objectRef"]["kind"] == "ConfigMap"
        assert event["objectRef"]["key"] == "a"
        agent.stop()


def test_records_are_copied_to_the_agents_standard_output(manifests: Path, tmp_path: Path) -> None:
    """`--audit-stdout true`: for the node's log collector, each record as a line of its own."""
    with running_agent(
        manifests, tmp_path / "root", "--audit", "secrets", "--audit-stdout", "true"
    ) as agent:
        agent.wait_state(UID, "creds", "mounted")
        assert (agent.volume(UID, "secret", "creds") / "user").read_text() == "admin"
        (line,) = wait_for(
            lambda: [line for line in agent.log_text().splitlines() if '"kind":"Event"' in line]
        )
        assert json.loads(line) == records(agent)[0]
        agent.stop()


def test_without_any_audit_no_audit_server_runs(manifests: Path, tmp_path: Path) -> None:
    with running_agent(manifests, tmp_path / "root") as agent:
        agent.wait_state(UID, "creds", "mounted")
        assert set(mount_types(agent).values()) == {"fuse.fusevol"}
        assert not AUDIT.is_serving(agent.root)
        agent.stop()


def audit_counts(agent: AgentProcess) -> dict[tuple[str, str, str], float]:
    """`fusevol_audit_reads_total` by (kind, object, key), from the agent's /metrics."""
    return {
        (labels["kind"], labels["object"], labels["key"]): value
        for labels, value in agent.samples("fusevol_audit_reads_total")
    }


def _audit_line(status: str) -> str | None:
    """`fusevol status`'s line of the audited volume, once it lists a read."""
    return next((line for line in status.splitlines() if "AUDIT" in line and "(" in line), None)


def assert_no_secret_value(agent: AgentProcess) -> None:
    """Neither value of the Secret in anything the agent or the audit server wrote on disk, nor
    in what the agent serves over HTTP."""
    texts = {path: path.read_bytes() for path in agent.root.rglob("*") if _plain_file(path)}
    texts[agent.log_path] = agent.log_path.read_bytes()
    for endpoint in ("/metrics", "/status"):
        texts[agent.root / endpoint] = agent.http_get(endpoint)[1].encode()
    assert records_path(agent.root) in texts
    assert AUDIT.log_path(agent.root) in texts
    for path, data in texts.items():
        for value in (VALUE, NEW_VALUE):
            assert value.encode() not in data, f"{path} holds the secret"


def _plain_file(path: Path) -> bool:
    """A regular file on disk below the root, not one the agent's or the audit server's mounts
    serve (those hold the secret by design)."""
    parts = path.parts
    if "pods" in parts or "mnt" in parts or "audit" in parts:
        return False
    try:
        return path.is_file() and os.stat(path).st_dev == os.stat(path.parent).st_dev
    except OSError:
        return False
