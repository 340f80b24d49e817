"""A host user against the HTTP endpoints, and manifests whose names would be paths outside the
root (fusevol/observe/auth.py, fusevol/observe/http.py, fusevol/decode/objects.py).

The host user is `nobody` (`setpriv`), asking with the system's Python and nothing else. It reads
neither `/status` nor `/metrics` on loopback (kubelet authenticates its loopback callers too),
unless the API server says its token may; the probes stay open, and root (a scraper on the node,
`fusevol status`) reads both. No request, however large, idle or answered by a broken API server,
ends the agent or holds its descriptors. A pod's or a claim's uid, or a container's name, that
would lead out of the root fails its object alone, naming it and the field.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import pytest

from fusevol.observe.http import MAX_CONNECTIONS
from tests.agent import HAS_FUSE, NODE, mounts_below, running_agent, wait_for
from tests.helpers.apiserver import running_apiserver
from tests.manifests import POD_UID

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tests.agent import AgentProcess

pytestmark = pytest.mark.skipif(not HAS_FUSE, reason="needs root and /dev/fuse")

NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
PYTHON = os.path.realpath(sys.executable)
"""The system's interpreter (the venv's is a link to it): run with -I, the standard library only."""

_GET = """
import http.client, json, sys
port, path, token = int(sys.argv[1]), sys.argv[2], sys.argv[3]
connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
connection.request("GET", path, headers={"Authorization": "Bearer " + token} if token else {})
answer = connection.getresponse()
print(json.dumps([answer.status, answer.read().decode()]))
"""

_RAW = """
import socket, sys
port, size = int(sys.argv[1]), int(sys.argv[2])
answer = b""
with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
    try:  # the agent answers (and closes) before it has read the whole of a huge request
        s.sendall(sys.stdin.buffer.read(size))
    except OSError:
        pass
    try:
        while chunk := s.recv(65536):
            answer += chunk
    except OSError:
        pass
print(answer.split(b"\\r\\n", 1)[0].decode())
"""

_IDLE = """
import socket, sys
port, count = int(sys.argv[1]), int(sys.argv[2])
held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(count)]
print("open", flush=True)
sys.stdin.read()
"""

VIEWER, STRANGER, BROKEN = "viewer-token", "stranger-token", "broken-token"


def port(agent: AgentProcess) -> int:
    return int(re.findall(r"http listening address=\S*:(\d+)", agent.log_text())[-1])


def as_nobody(script: str, *args: str, stdin: bytes = b"") -> str:
    result = subprocess.run(
        [*NOBODY, PYTHON, "-I", "-c", script, *args],
        input=stdin,
        capture_output=True,
        check=True,
        cwd="/",
        timeout=30,
    )
    return result.stdout.decode()


def get_as_nobody(agent: AgentProcess, path: str, token: str = "") -> tuple[int, str]:
    status, body = json.loads(as_nobody(_GET, str(port(agent)), path, token))
    return int(status), str(body)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[Path]:
    """Where the hostile names below would lead: beside the root. Whatever the agent mounted
    there (it must not) is unmounted at the end."""
    target = tmp_path / "escaped"
    yield target
    for path in reversed(mounts_below(tmp_path)):
        if path.startswith(str(target)):
            subprocess.run(["umount", "-l", path], check=False)


# -- the endpoints ---------------------------------------------------------------------------------


def test_a_host_user_reads_neither_status_nor_metrics_and_root_reads_both(
    manifests: Path, tmp_path: Path
) -> None:
    with running_agent(manifests, tmp_path / "root") as agent:
        for path in ("/status", "/metrics"):
            for token in ("", "made-up"):
                status, body = get_as_nobody(agent, path, token)
                assert status == 403, body
                assert body.startswith(f"{path} answers root on this node"), body
                assert POD_UID not in body
        for probe in ("/healthz", "/readyz"):
            assert get_as_nobody(agent, probe) == (200, "ok\n")

        status, body = agent.http_get("/status")  # root, on loopback
        assert status == 200
        assert [pod["uid"] for pod in json.loads(body)["pods"]] == [POD_UID]
        assert "fusevol_fuse_requests_total" in agent.http_get("/metrics")[1]
        assert f"uid={POD_UID}" in agent.status()  # `fusevol status`, from the status file
        agent.stop()


def test_with_the_api_a_host_user_needs_a_token_the_api_server_allows(tmp_path: Path) -> None:
    with running_apiserver() as api:
        api.users[VIEWER] = ("alice", ["ops"])
        api.users[STRANGER] = ("mallory", [])
        api.allow("ops", "get", "nodes", "proxy", NODE)
        config = ("--kubeconfig", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        with running_agent(None, tmp_path / "root", *config) as agent:
            status, body = get_as_nobody(agent, "/status")
            assert (status, body) == (
                401,
                "/status: send a bearer token (Authorization: Bearer ...)\n",
            )
            status, body = get_as_nobody(agent, "/status", STRANGER)
            assert status == 403
            assert body == f'/status: user "mallory" may not get nodes/proxy of node "{NODE}"\n'
            assert get_as_nobody(agent, "/metrics", VIEWER)[0] == 403  # nodes/proxy only
            status, body = get_as_nobody(agent, "/status", VIEWER)
            assert status == 200
            assert json.loads(body)["node"] == NODE
            assert agent.http_get("/status")[0] == 200  # root needs no token
            agent.stop()


def test_an_answer_that_raises_is_a_500_and_one_line_and_the_agent_serves_on(
    tmp_path: Path,
) -> None:
    """An API server whose TokenReview names groups that are no list: reading it raises inside
    the request's handler."""
    with running_apiserver() as api:
        api.users[VIEWER] = ("alice", ["ops"])
        api.users[BROKEN] = ("eve", 5)  # a TokenReview whose groups are no list
        api.allow("ops", "get", "nodes", "proxy", NODE)
        config = ("--kubeconfig", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        failed = r"ERROR fusevol\.observe\.http: http request failed path=/status error=TypeError"
        with running_agent(None, tmp_path / "root", *config, expect_log=(failed,)) as agent:
            for _ in range(3):
                assert get_as_nobody(agent, "/status", BROKEN) == (500, "internal error\n")
            assert len(re.findall(failed, agent.log_text())) == 3  # one line each
            assert "Traceback" not in agent.log_text()
            assert agent.agent_alive()
            assert get_as_nobody(agent, "/healthz") == (200, "ok\n")
            assert get_as_nobody(agent, "/status", VIEWER)[0] == 200
            agent.stop()


def test_idle_huge_and_malformed_requests_hold_nothing(manifests: Path, tmp_path: Path) -> None:
    with running_agent(manifests, tmp_path / "root") as agent:
        before = open_fds(agent.pid)
        idle = subprocess.Popen(
            [*NOBODY, PYTHON, "-I", "-c", _IDLE, str(port(agent)), str(5 * MAX_CONNECTIONS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd="/",
        )
        try:
            assert idle.stdout is not None
            assert idle.stdout.readline() == b"open\n"
            most, deadline = 0, time.monotonic() + 2.0
            while time.monotonic() < deadline:  # within READ_TIMEOUT_S: none timed out yet
                most = max(most, open_fds(agent.pid))
                assert agent.http_get("/healthz") == (200, "ok\n")  # the probes get through
            assert most <= before + MAX_CONNECTIONS + 8
        finally:
            idle.communicate(b"", timeout=30)

        head = b"GET /healthz HTTP/1.1\r\nX-Filler: " + b"a" * (1 << 20) + b"\r\n\r\n"
        assert as_nobody(_RAW, str(port(agent)), str(len(head)), stdin=head).startswith(
            "HTTP/1.1 400"
        )
        garbage = bytes(range(256)) * 4 + b"\r\n\r\n"
        answer = as_nobody(_RAW, str(port(agent)), str(len(garbage)), stdin=garbage)
        assert answer.startswith(("HTTP/1.1 400", "HTTP/1.1 405")), answer
        assert agent.agent_alive()
        assert get_as_nobody(agent, "/healthz") == (200, "ok\n")
        agent.stop()


# -- names that would be paths ---------------------------------------------------------------------

REJECTED = r"ERROR fusevol\.source\.local: manifest rejected, nothing served from it: "


def _pod(name: str, uid: str, container: str = "c", mounts: str = "") -> str:
    return f"""\
kind: Pod
metadata: {{name: {name}, namespace: default, uid: "{uid}"}}
spec:
  containers: [{{name: "{container}"{mounts}}}]
  volumes: [{{name: config, configMap: {{name: app}}}}]
"""


@pytest.mark.parametrize(
    ("uid", "container", "mounts", "field"),
    [
        pytest.param("../../escaped", "c", "", r"metadata\.uid: invalid value", id="uid"),
        pytest.param("{outside}", "c", "", r"metadata\.uid: invalid value", id="absolute-uid"),
        pytest.param(
            "eeeeeeee-0000-4000-8000-000000000009",
            "../../../../../escaped",
            ", volumeMounts: [{name: config, mountPath: /etc/a, subPath: a}]",
            r"spec\.containers\[0\]\.name: must be a lowercase RFC 1123 label",
            id="container-name",
        ),
    ],
)
def test_a_pod_whose_uid_or_container_name_is_no_name_fails_alone(
    manifests: Path,
    tmp_path: Path,
    outside: Path,
    uid: str,
    container: str,
    mounts: str,
    field: str,
) -> None:
    (manifests / "evil.yaml").write_text(
        _pod("evil", uid.format(outside=outside), container, mounts)
    )
    expected = REJECTED + rf".*evil\.yaml: pod default/evil: {field}"
    with running_agent(manifests, tmp_path / "root", expect_log=(expected,)) as agent:
        agent.wait_reconciled()
        assert len(re.findall(expected, agent.log_text())) == 1
        assert not outside.exists()
        assert [p["uid"] for p in agent.snapshot()["pods"]] == [POD_UID]  # the others' pods
        assert (agent.volume(POD_UID, "configmap", "config") / "a").read_bytes() == b"alpha"
        agent.stop()
    assert not outside.exists()


def test_a_claim_whose_uid_is_no_uid_is_not_provisioned(
    manifests: Path, tmp_path: Path, outside: Path
) -> None:
    """A claim's uid names the directory the provisioner makes (`pvc-<uid>`) and removes again
    (reclaim policy Delete)."""
    base = tmp_path / "base"
    (manifests / "class.yaml").write_text(f"""\
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: local}}
provisioner: fusevol.io/hostpath
reclaimPolicy: Delete
volumeBindingMode: WaitForFirstConsumer
parameters: {{basePath: {base}}}
""")
    (manifests / "claim.yaml").write_text("""\
kind: PersistentVolumeClaim
metadata: {name: data, namespace: default, uid: "x/../../escaped"}
spec:
  storageClassName: local
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
""")
    (manifests / "user.yaml").write_text("""\
kind: Pod
metadata: {name: user, namespace: default, uid: eeeeeeee-0000-4000-8000-000000000010}
spec:
  containers: [{name: c}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
""")
    expected = REJECTED + r".*claim\.yaml: persistentvolumeclaim default/data: metadata\.uid"
    waiting = 'mount failed .*persistentvolumeclaim "data" not found'
    with running_agent(manifests, tmp_path / "root", expect_log=(expected, waiting)) as agent:
        agent.wait_reconciled()
        wait_for(lambda: waiting.split(".*")[1] in agent.log_text())
        assert not outside.exists()
        assert not base.exists()
        assert (agent.volume(POD_UID, "configmap", "config") / "a").read_bytes() == b"alpha"
        agent.stop()
