"""Who may read `/status` and `/metrics` (`fusevol.observe.auth`): callers the API server
authenticates (TokenReview) and authorizes (SubjectAccessReview: get `nodes/proxy` for /status,
`nodes/metrics` for /metrics, of this node), as kubelet's own API, and root on the node (a
caller on the node whose socket is root's: these tests run as root); the probes, everyone. A
host user on the node: tests/security/test_http_and_names.py."""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest

from tests.agent import NODE

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from tests.agent import AgentProcess
    from tests.helpers.apiserver import ApiServer

ADDRESS = "198.18.0.1"
"""The agent's side of a veth pair to another network namespace, made for the test (the
benchmarking range): a caller in that namespace is another host to the agent, its socket nowhere
in the agent's namespace. (A second address on the agent's own `lo` would not do: a caller there
is on the node, and root's socket is root's.)"""
OTHER = "198.18.0.2"
NAMESPACE = "fusevol-other-host"
SCRAPER, VIEWER, STRANGER = "scraper-token", "viewer-token", "stranger-token"


@pytest.fixture
def other_host() -> Iterator[str]:
    """Another host: a network namespace of its own, reached over a veth pair; yields the
    address of the agent's side, which the other host connects to."""
    subprocess.run(["ip", "netns", "del", NAMESPACE], capture_output=True, check=False)
    for command in (
        ["ip", "netns", "add", NAMESPACE],
        ["ip", "link", "add", "fv-node", "type", "veth", "peer", "name", "fv-other"],
        ["ip", "link", "set", "fv-other", "netns", NAMESPACE],
        ["ip", "addr", "add", f"{ADDRESS}/30", "dev", "fv-node"],
        ["ip", "link", "set", "fv-node", "up"],
        ["ip", "-n", NAMESPACE, "addr", "add", f"{OTHER}/30", "dev", "fv-other"],
        ["ip", "-n", NAMESPACE, "link", "set", "fv-other", "up"],
    ):
        subprocess.run(command, check=True)
    try:
        yield ADDRESS
    finally:
        subprocess.run(["ip", "link", "del", "fv-node"], check=False)
        subprocess.run(["ip", "netns", "del", NAMESPACE], check=False)


_GET = """
import http.client, json, sys
host, port, path, token = sys.argv[1:5]
connection = http.client.HTTPConnection(host, int(port), timeout=10)
connection.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
response = connection.getresponse()
print(json.dumps([response.status, response.read().decode()]))
"""


def get(agent: AgentProcess, host: str, path: str, token: str | None = None) -> tuple[int, str]:
    """GET `path` from the agent at `host`: from this node at 127.0.0.1, else from the other
    host's network namespace."""
    port = re.findall(r"http listening address=\S*:(\d+)", agent.log_text())[-1]
    if host != "127.0.0.1":
        done = subprocess.run(
            [
                *("ip", "netns", "exec", NAMESPACE, sys.executable, "-c", _GET),
                *(host, port, path, token or ""),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        status, body = json.loads(done.stdout)
        return int(status), str(body)
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    with contextlib.closing(connection):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        return response.status, response.read().decode()


def reviews(api: ApiServer, kind: str) -> int:
    return sum(1 for r in api.requests if r.method == "POST" and r.path.endswith(kind))


def test_status_and_metrics_answer_another_host_as_the_api_server_says(
    api: ApiServer, kube_agent: Callable[..., Any], other_host: str
) -> None:
    api.users[SCRAPER] = ("system:serviceaccount:monitoring:prometheus", ["system:serviceaccounts"])
    api.users[VIEWER] = ("alice", ["ops"])
    api.users[STRANGER] = ("mallory", [])
    api.allow("system:serviceaccount:monitoring:prometheus", "get", "nodes", "metrics")
    api.allow("ops", "get", "nodes", "proxy", NODE)  # by group, for this node only
    with kube_agent("--http-host", "0.0.0.0") as agent:
        # Probes need nothing, and root on the node (loopback) no token.
        for path in ("/healthz", "/readyz"):
            assert get(agent, other_host, path)[0] == 200
        assert get(agent, "127.0.0.1", "/status")[0] == 200
        assert get(agent, "127.0.0.1", "/metrics")[0] == 200

        status, body = get(agent, other_host, "/status")
        assert (status, body) == (401, "/status: send a bearer token (Authorization: Bearer ...)\n")
        status, body = get(agent, other_host, "/metrics", "forged")
        assert (status, body) == (401, "/metrics: the API server does not know this token\n")
        status, body = get(agent, other_host, "/status", STRANGER)
        assert status == 403
        assert body == f'/status: user "mallory" may not get nodes/proxy of node "{NODE}"\n'
        assert get(agent, other_host, "/status", SCRAPER)[0] == 403  # metrics only
        assert get(agent, other_host, "/metrics", VIEWER)[0] == 403  # status only

        status, body = get(agent, other_host, "/metrics", SCRAPER)
        assert status == 200
        assert "fusevol_fuse_requests_total" in body
        status, body = get(agent, other_host, "/status", VIEWER)
        assert status == 200
        assert f'"node": "{NODE}"' in body

        # Answers are kept a while, as kubelet's caches keep them: no review per scrape.
        before = reviews(api, "tokenreviews"), reviews(api, "subjectaccessreviews")
        for _ in range(5):
            assert get(agent, other_host, "/metrics", SCRAPER)[0] == 200
            assert get(agent, other_host, "/status", STRANGER)[0] == 403
        assert (reviews(api, "tokenreviews"), reviews(api, "subjectaccessreviews")) == before
        assert STRANGER not in agent.log_text()  # tokens are never logged


def test_without_the_api_another_host_is_refused_and_none_opens_it(
    manifests: Any, tmp_path: Any, other_host: str
) -> None:
    """The manifests source has no API server to ask: only root on the node is answered, until
    the operator says `--http-auth none`."""
    from tests.agent import running_agent

    with running_agent(manifests, tmp_path / "root", "--http-host", "0.0.0.0") as agent:
        status, body = get(agent, other_host, "/status")
        assert status == 403
        assert body.startswith("/status answers root on this node")
        assert get(agent, other_host, "/healthz")[0] == 200
        assert get(agent, "127.0.0.1", "/status")[0] == 200
        agent.stop()
    with running_agent(
        manifests, tmp_path / "root2", "--http-host", "0.0.0.0", "--http-auth", "none"
    ) as agent:
        assert get(agent, other_host, "/status")[0] == 200
        agent.stop()
