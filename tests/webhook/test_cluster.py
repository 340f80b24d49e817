"""The CSIDriver and namespace watches (`fusevol.webhook.cluster`) through the `kubernetes` client,
against an API server that serves storage.k8s.io/v1 csidrivers and v1 namespaces over HTTP/1.1 as
kube-apiserver does: LIST with `metadata.resourceVersion`, WATCH from a resourceVersion as chunked
`{"type", "object"}` lines, an ERROR event with a 410 Status for a version older than the
compacted history, the stream ended after `timeoutSeconds`, GET of one namespace, bearer tokens,
500s when told to fail, and 403s for a resource RBAC denies. (The suite's own test API server,
`tests/helpers/apiserver.py`, speaks only HTTP/2, which the `kubernetes` client does not.)"""

from __future__ import annotations

import http.server
import json
import threading
import time
import urllib.parse
from typing import TYPE_CHECKING, Any

import pytest

from fusevol.model.audit import ANNOTATION as AUDIT, AuditLevel
from fusevol.webhook import cluster
from fusevol.webhook.convert import Driver, TokenRequest
from tests.webhook.test_admission import admission_review, answer, patched
from tests.webhook.test_audit import SECRET, audit_pod
from tests.webhook.test_convert import CONFIG

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

Obj = dict[str, Any]
TOKEN = "webhook-test-token"
PATH = "/apis/storage.k8s.io/v1/csidrivers"
NAMESPACES = "/api/v1/namespaces"


class ApiServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.cond = threading.Condition()
        self.version = 1
        self.objects: dict[tuple[str, str], Obj] = {}
        """(collection path, name) -> object."""
        self.history: list[tuple[int, str, str, Obj]] = []
        self.compacted = 0
        self.fail = False
        self.forbidden: set[str] = set()
        """Collection paths answered with 403, as RBAC denies them."""
        self.watches = 0
        self.gets = 0

    def put(self, name: str, spec: Obj | None) -> None:
        """Create, update (`spec`) or delete (None) a CSIDriver."""
        obj = {"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "spec": spec}
        self.store(PATH, name, None if spec is None else obj)

    def put_namespace(self, name: str, annotations: dict[str, str] | None = None) -> None:
        """Create or update a namespace (its annotations replaced)."""
        metadata = {"annotations": annotations} if annotations is not None else {}
        self.store(NAMESPACES, name, {"apiVersion": "v1", "kind": "Namespace", "meta": metadata})

    def store(self, path: str, name: str, obj: Obj | None) -> None:
        """Create, update or delete (None) the object `name` of the collection `path`;
        `obj["meta"]`: metadata fields besides the name and version."""
        with self.cond:
            self.version += 1
            old = self.objects.get((path, name))
            if obj is None:
                kind, obj = "DELETED", old
                del self.objects[path, name]
            else:
                kind = "MODIFIED" if old else "ADDED"
                self.objects[path, name] = obj
            assert obj is not None
            meta = obj.pop("meta", {})
            obj["metadata"] = {**meta, "name": name, "resourceVersion": str(self.version)}
            self.history.append((self.version, path, kind, json.loads(json.dumps(obj))))
            self.cond.notify_all()

    def compact(self) -> None:
        with self.cond:
            self.compacted = self.version + 1
            self.history.clear()
            self.cond.notify_all()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: ApiServer
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
        path, _, one = url.path.partition(f"{NAMESPACES}/")
        path = path or NAMESPACES
        if path not in (PATH, NAMESPACES):
            return self._json(404, _status(404, "NotFound"))
        if path in self.server.forbidden:
            return self._json(403, _status(403, "Forbidden"))
        if one:
            with self.server.cond:
                self.server.gets += 1
                obj = self.server.objects.get((path, one))
            return self._json(200, obj) if obj else self._json(404, _status(404, "NotFound"))
        name = query.get("fieldSelector", "").removeprefix("metadata.name=")

        def selected(collection: str, each: str) -> bool:
            return collection == path and (not name or each == name)

        if query.get("watch") != "true":
            with self.server.cond:
                items = [o for (c, n), o in self.server.objects.items() if selected(c, n)]
                version = str(self.server.version)
            return self._json(
                200,
                {"kind": "List", "metadata": {"resourceVersion": version}, "items": items},
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
                    if e[0] > since and selected(e[1], e[3]["metadata"]["name"])
                ]
                for _, _, kind, obj in events:
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
def api(tmp_path: Path) -> Iterator[tuple[ApiServer, Path]]:
    server = ApiServer()
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
    api: tuple[ApiServer, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ApiServer, cluster.DriverWatch]]:
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


# -- the namespaces' audit levels ------------------------------------------------------------------


def _started(watch: cluster.NamespaceWatch, monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """`watch` run in a thread; the function that stops it."""
    monkeypatch.setattr(cluster, "BACKOFF_INITIAL_S", 0.05)
    monkeypatch.setattr(cluster, "WATCH_TIMEOUT_S", 1)
    thread = threading.Thread(target=watch.run)
    thread.start()

    def stop() -> None:
        watch.stop()
        thread.join(10)
        assert not thread.is_alive()

    return stop


def _warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and text in r.msg]


def test_namespace_levels_follow_their_annotation_from_memory(
    api: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    server, kubeconfig = api
    server.put_namespace("team", {AUDIT: "secrets"})
    server.put_namespace("open")
    watch = cluster.NamespaceWatch(cluster.api_client(kubeconfig))
    stop = _started(watch, monkeypatch)
    try:
        until(watch.listed.is_set)
        assert watch.level("team") is AuditLevel.SECRETS
        assert watch.level("open") is AuditLevel.OFF
        server.put_namespace("open", {AUDIT: "all", "other": "x"})
        until(lambda: watch.level("open") is AuditLevel.ALL)
        server.put_namespace("open", {})  # the annotation removed
        until(lambda: watch.level("open") is AuditLevel.OFF)
        assert server.gets == 0  # all answered from memory
        server.put_namespace("typo", {AUDIT: "secret"})  # audited as all, as a pod's
        until(lambda: bool(_warnings(caplog, "is not one of")))
        assert watch.level("typo") is AuditLevel.ALL
        assert _warnings(caplog, "is not one of") == [
            "namespace annotation fusevol.io/audit='secret' is not one of off, secrets, all: "
            "audited as all namespace=typo"
        ]
    finally:
        stop()
    caplog.clear()


def test_a_namespace_not_seen_yet_is_read(api: Any) -> None:
    """Created since the last event, or before the first list: one GET, in the admission."""
    server, kubeconfig = api
    server.put_namespace("new", {AUDIT: "all"})
    watch = cluster.NamespaceWatch(cluster.api_client(kubeconfig))  # not run: nothing listed
    assert watch.level("new") is AuditLevel.ALL
    assert server.gets == 1


@pytest.mark.parametrize("failure", ["forbidden", "failing", "unreachable"])
def test_an_unreadable_namespace_is_off_with_one_warning_naming_it(
    api: Any, failure: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    server, kubeconfig = api
    server.put_namespace("team", {AUDIT: "all"})
    if failure == "forbidden":
        server.forbidden.add(NAMESPACES)  # RBAC: no namespaces for the webhook
    elif failure == "failing":
        server.fail = True
    else:
        config = json.loads(kubeconfig.read_text())
        config["clusters"][0]["cluster"]["server"] = "http://127.0.0.1:1"
        kubeconfig.write_text(json.dumps(config))
    watch = cluster.NamespaceWatch(cluster.api_client(kubeconfig))
    stop = _started(watch, monkeypatch)
    try:
        until(lambda: bool(_warnings(caplog, "list or watch failed")))
        assert not watch.listed.is_set()
        caplog.clear()
        started = time.monotonic()
        assert watch.level("team") is AuditLevel.OFF
        assert time.monotonic() - started < cluster.NAMESPACE_GET_TIMEOUT_S + 1
        [warning] = _warnings(caplog, "namespace not read")
        assert warning.startswith(
            "namespace not read, its audit level is not applied namespace=team error="
        )
        assert "\n" not in warning
        if failure == "forbidden":
            assert warning.endswith("error=403 Forbidden")
    finally:
        stop()
    caplog.clear()


def test_an_unreadable_namespace_does_not_fail_the_admission(
    api: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The pod is converted without the namespace's level (the pod's own still applies)."""
    server, kubeconfig = api
    server.put_namespace("team", {AUDIT: "all"})
    server.forbidden.add(NAMESPACES)
    watch = cluster.NamespaceWatch(cluster.api_client(kubeconfig))
    pod = audit_pod(CONFIG, SECRET)
    body = admission_review(pod, namespace="team")
    response = answer(body, namespace_audit=watch.level)
    assert "warnings" not in response
    volumes = {v["name"]: v for v in patched(pod, response)["spec"]["volumes"]}
    assert AUDIT not in volumes["config"]["csi"]["volumeAttributes"]
    assert AUDIT not in volumes["creds"]["csi"]["volumeAttributes"]
    assert len(_warnings(caplog, "namespace not read")) == 1
    # Once readable, the same pod is audited as its namespace asks.
    server.forbidden.clear()
    response = answer(body, namespace_audit=watch.level)
    volumes = {v["name"]: v for v in patched(pod, response)["spec"]["volumes"]}
    assert volumes["config"]["csi"]["volumeAttributes"][AUDIT] == "true"
    assert volumes["creds"]["csi"]["volumeAttributes"][AUDIT] == "true"
    caplog.clear()
