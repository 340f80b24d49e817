"""The CSIDriver watch (`fusevol.webhook.cluster`) through the `kubernetes` client, against an API
server that serves storage.k8s.io/v1 csidrivers over HTTP/1.1 as kube-apiserver does: LIST with
`metadata.resourceVersion`, WATCH from a resourceVersion as chunked `{"type", "object"}` lines, an
ERROR event with a 410 Status for a version older than the compacted history, the stream ended
after `timeoutSeconds`, bearer tokens, and 500s when told to fail. (The suite's own test API server,
`tests/helpers/apiserver.py`, speaks only HTTP/2, which the `kubernetes` client does not.)"""

from __future__ import annotations

import http.server
import json
import threading
import time
import urllib.parse
from typing import TYPE_CHECKING, Any

import pytest

from fusevol.webhook import cluster
from fusevol.webhook.convert import Driver, TokenRequest

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

Obj = dict[str, Any]
TOKEN = "webhook-test-token"
PATH = "/apis/storage.k8s.io/v1/csidrivers"


class CsiDriverServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.cond = threading.Condition()
        self.version = 1
        self.objects: dict[str, Obj] = {}
        self.history: list[tuple[int, str, Obj]] = []
        self.compacted = 0
        self.fail = False
        self.watches = 0

    def put(self, name: str, spec: Obj | None) -> None:
        """Create, update (`spec`) or delete (None) a CSIDriver."""
        with self.cond:
            self.version += 1
            old = self.objects.get(name)
            if spec is None:
                kind, obj = "DELETED", old
                del self.objects[name]
            else:
                kind = "MODIFIED" if old else "ADDED"
                obj = {"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "spec": spec}
                self.objects[name] = obj
            assert obj is not None
            obj["metadata"] = {"name": name, "resourceVersion": str(self.version)}
            self.history.append((self.version, kind, json.loads(json.dumps(obj))))
            self.cond.notify_all()

    def compact(self) -> None:
        with self.cond:
            self.compacted = self.version + 1
            self.history.clear()
            self.cond.notify_all()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: CsiDriverServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self._json(401, _status(401, "Unauthorized"))
        if self.server.fail:
            return self._json(500, _status(500, "InternalError"))
        if url.path != PATH:
            return self._json(404, _status(404, "NotFound"))
        name = query.get("fieldSelector", "").removeprefix("metadata.name=")
        if query.get("watch") != "true":
            with self.server.cond:
                items = [o for n, o in self.server.objects.items() if n == name]
                version = str(self.server.version)
            return self._json(
                200,
                {"kind": "CSIDriverList", "metadata": {"resourceVersion": version}, "items": items},
            )
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        since = int(query["resourceVersion"])
        deadline = time.monotonic() + float(query.get("timeoutSeconds", 300))
        with self.server.cond:
            self.server.watches += 1
            while time.monotonic() < deadline and not self.server.fail:
                if since < self.server.compacted:
                    self._chunk({"type": "ERROR", "object": _status(410, "Expired")})
                    break
                events = [
                    e
                    for e in self.server.history
                    if e[0] > since and e[2]["metadata"]["name"] == name
                ]
                for _, kind, obj in events:
                    self._chunk({"type": kind, "object": obj})
                since = self.server.version
                self.server.cond.wait(0.1)
        self.wfile.write(b"0\r\n\r\n")

    def _chunk(self, event: Obj) -> None:
        line = json.dumps(event).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
        self.wfile.flush()

    def _json(self, code: int, obj: Obj) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _status(code: int, reason: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": reason,
        "code": code,
    }


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[CsiDriverServer, Path]]:
    server = CsiDriverServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}
                ],
                "users": [{"name": "u", "user": {"token": TOKEN}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    try:
        yield server, kubeconfig
    finally:
        server.fail = True
        server.shutdown()
        server.server_close()


@pytest.fixture
def watching(
    api: tuple[CsiDriverServer, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[CsiDriverServer, cluster.DriverWatch]]:
    server, kubeconfig = api
    monkeypatch.setattr(cluster, "BACKOFF_INITIAL_S", 0.05)
    monkeypatch.setattr(cluster, "WATCH_TIMEOUT_S", 1)  # how long a stop may wait for a watch
    watch = cluster.DriverWatch(cluster.api_client(kubeconfig))
    assert "is not known yet" in watch.driver().problem
    thread = threading.Thread(target=watch.run)
    thread.start()
    try:
        yield server, watch
    finally:
        watch.stop()
        thread.join(10)
        assert not thread.is_alive()


def until(condition: Callable[[], bool], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


SPEC = {"volumeLifecycleModes": ["Ephemeral"], "podInfoOnMount": True}


def test_the_driver_is_followed_as_it_comes_changes_and_goes(watching: Any) -> None:
    server, watch = watching
    until(watch.listed.is_set)
    assert watch.driver() == Driver.missing("the CSIDriver fusevol.io does not exist")
    server.put("other.csi.io", SPEC)  # not ours
    server.put("fusevol.io", SPEC)
    until(lambda: watch.driver() == Driver())
    tokens = {"tokenRequests": [{"audience": "vault"}, {"audience": "", "expirationSeconds": 3607}]}
    server.put("fusevol.io", {**SPEC, **tokens, "requiresRepublish": True})
    until(lambda: watch.driver().requires_republish)
    assert watch.driver().token_requests == {TokenRequest("vault", 3600), TokenRequest("", 3607)}
    server.put("fusevol.io", None)
    until(lambda: watch.driver().problem == "the CSIDriver fusevol.io does not exist")


def test_a_driver_present_before_the_start_is_listed(
    api: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, _ = api
    server.put("fusevol.io", {"volumeLifecycleModes": ["Persistent"], "podInfoOnMount": True})
    watch = cluster.DriverWatch(cluster.api_client(api[1]))
    thread = threading.Thread(target=watch.run)
    thread.start()
    try:
        until(watch.listed.is_set)
        assert watch.driver().problem == "the CSIDriver fusevol.io does not list Ephemeral volumes"
    finally:
        watch.stop()
        thread.join(10)


def test_a_watch_too_old_lists_again_and_misses_nothing(watching: Any) -> None:
    server, watch = watching
    until(lambda: server.watches == 1)
    server.compact()  # the open watch's version is gone: 410, then a list
    server.put("fusevol.io", SPEC)
    until(lambda: watch.driver() == Driver())
    until(lambda: server.watches >= 2)


def test_an_api_server_failing_keeps_what_was_known(
    watching: Any, caplog: pytest.LogCaptureFixture
) -> None:
    server, watch = watching
    server.put("fusevol.io", SPEC)
    until(lambda: watch.driver() == Driver())
    server.fail = True
    until(lambda: "csidriver list or watch failed" in caplog.text)
    assert watch.driver() == Driver()  # no flapping with the API server's availability
    server.fail = False
    server.put("fusevol.io", None)
    until(lambda: watch.driver().problem.endswith("does not exist"))
    caplog.clear()
