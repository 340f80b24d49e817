"""A Kubernetes API server on loopback, speaking the real wire protocol, driven by the tests.

A real kube-apiserver cannot run on the test machines, and the agent must not know the difference:
it talks to this server exactly as it talks to a cluster: HTTP/2 over TLS (`tests.helpers.h2server`:
ALPN h2, kube-apiserver's limit of concurrent streams per connection, flow control), the server's
CA in the kubeconfig. What the agent uses is implemented as the API server does it:

- core/v1 pods, configmaps, secrets, persistentvolumeclaims (namespaced), persistentvolumes and
  storage.k8s.io/v1 storageclasses (cluster-scoped): GET one object (404 Status when absent),
  LIST (`metadata.resourceVersion`; from a `resourceVersion` not yet reached, kube-apiserver's 504
  "Too large resource version"; otherwise the current state, which is never older),
  WATCH (a stream of `{"type", "object"}` lines from a resourceVersion; BOOKMARK
  events when `allowWatchBookmarks`; an `ERROR` event carrying a 410 Status when the version is
  older than the compacted history; the stream ends after `timeoutSeconds`);
- a LIST of metadata alone (`Accept: application/json;as=PartialObjectMetadataList;
  g=meta.k8s.io;v=v1`, client-go's metadata client: each item's `metadata`; another `as=` is a
  406); a LIST's `limit` (its first page: `metadata.continue`, and `remainingItemCount` when no
  selector was given; a `continue` is not served, a 400);
- `fieldSelector` (`metadata.name`, `metadata.namespace`, `spec.nodeName`; `=`, `==`, `!=`;
  other fields are a 400) and `labelSelector` (`k=v`, `k==v`, `k!=v`, `k`, `!k`);
- TokenRequest (`POST .../serviceaccounts/NAME/token`): the service account must exist ("default"
  always does), the bound pod must exist with that uid, `expirationSeconds` >= 600; the token is a
  JWT-shaped string whose payload names audience, pod and expiry;
- core/v1 Events: POST (409 if the name exists) and PATCH (merge of the fields sent);
- PersistentVolumes: POST (409 AlreadyExists if the name exists) and DELETE (the object goes at
  once: the `kubernetes.io/pv-protection` finalizer, which keeps a Bound PV, is not modelled);
- objects stored as kube-apiserver v1.28 stores them: defaulted, quantities canonical
  (`tests/helpers/defaults.py`; admission plugins are not modelled); a pod created is Pending
  (`status.phase`, whatever status was sent; its `qosClass` is not modelled), and a graceful
  deletion of a pod (`delete(grace_period_s=...)`) sets its `deletionTimestamp` and keeps it;
- authentication as kube-apiserver's union of authenticators, the client certificate first (a
  connection that presented one is that user, whatever bearer token it sends, as with
  `--client-ca-file`: CN the user, O the groups), then bearer tokens: the agent's `TOKEN`, the
  tokens of `users`, and the tokens this server issued (a service account's, while unexpired, for
  the API server's audience, and while its bound pod exists); 401 otherwise;
- authorization as `--authorization-mode Node,RBAC` with NodeRestriction (`tests.helpers.authz`):
  the agent's `TOKEN` may do everything (the chart's ClusterRole, which tests/deploy checks
  against what the agent uses); a node (`system:node:<name>`, `system:nodes`) what kube's Node
  authorizer allows it over the graph of the pods bound to it; every user what `allow()` granted
  (RBAC). A denial is kube's 403 Forbidden Status and message;
- SelfSubjectReview (`POST /apis/authentication.k8s.io/v1/selfsubjectreviews`): who the caller is;
- immutable ConfigMaps/Secrets refuse data updates;
- TokenReview (`POST /apis/authentication.k8s.io/v1/tokenreviews`): the tokens of `users`
  (token -> username and groups) are authenticated, others are not; SubjectAccessReview
  (`POST /apis/authorization.k8s.io/v1/subjectaccessreviews`): allowed for what `allow()` granted
  (user or group, verb, resource, subresource, name, namespace), as RBAC would answer.

The tests change the world through Python methods (`create`, `update`, `delete`) which bump the
global resourceVersion and wake the watches, and steer faults: `cut_watches()` (a watch dies in
the middle of an event: half of it is sent, then its stream is reset), `compact()` (history gone:
resuming watches get 410), `stop()`/`start()` (a restart on the same port: connections reset,
history compacted, as a new API server's watch cache), `token_lifetime_s` (the server shortens
tokens, as `--service-account-max-token-expiration` may). `requests` records every request for
assertions; `connections()` counts the TCP connections accepted, `max_streams_seen` the most
streams one connection carried at once.

`set_fault(mode)` makes the server misbehave until `set_fault(None)`, each mode as a sick API
server or the network in front of it does, for new requests and for the watches already open:
`"500"` answers every request with a 500 InternalError Status (open watches end); `"410"` answers
every watch with an ERROR event carrying a 410 Expired Status (lists and gets still work; open
watches get it too); `"stall"` reads each request and sends nothing, not even headers, until the
fault is cleared, then answers it (open watches deliver nothing meanwhile; the connection itself
answers PINGs, as Go's server does while its handlers hang); `"drop"` closes every connection
right after accepting it (open ones are reset).

`PvController` stands in for kube-controller-manager's PV controller, which no test machine runs:
the binding of claims to PVs pre-bound by claimRef, and the release of PVs whose claim went. It
runs after every change, inside the server's lock (`pv_controller = False` turns it off).
"""

from __future__ import annotations

import base64
import bisect
import contextlib
import copy
import datetime
import json
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tests.helpers import defaults
from tests.helpers.authz import Attributes, User, forbidden, node_decision, node_restriction
from tests.helpers.h2server import DEFAULT_MAX_STREAMS, H2Server, certificates

if TYPE_CHECKING:
    from pathlib import Path

    from tests.helpers.h2server import ServerStream

Obj = dict[str, Any]

TOKEN = "fusevol-test-token"
AGENT = User("system:serviceaccount:fusevol:fusevol", ("system:serviceaccounts",))
"""Who `TOKEN` is: the agent's service account, allowed everything here."""
API_AUDIENCE = "https://kubernetes.default.svc"
"""The API server's own audience (`--api-audiences`): a token for another is not accepted."""
NAMESPACED = {"pods": "Pod", "configmaps": "ConfigMap", "secrets": "Secret"}
NAMESPACED["persistentvolumeclaims"] = "PersistentVolumeClaim"
CLUSTER = {"persistentvolumes": "PersistentVolume", "storageclasses": "StorageClass"}
GROUPS = {
    "storageclasses": "storage.k8s.io",
    "tokenreviews": "authentication.k8s.io",
    "selfsubjectreviews": "authentication.k8s.io",
    "subjectaccessreviews": "authorization.k8s.io",
}
"""API group of the resources not in core/v1."""
RESOURCE_OF = {kind: plural for plural, kind in {**NAMESPACED, **CLUSTER}.items()}
FIELDS = {"metadata.name", "metadata.namespace"}
POD_FIELDS = FIELDS | {"spec.nodeName"}


class ApiError(Exception):
    """What the server answers instead of an object: a Status."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> Obj:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }


FAULTS = ("500", "410", "stall", "drop")


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    at: float = field(default_factory=time.monotonic, compare=False)
    """When it came (`time.monotonic()`)."""
    accept: str = field(default="", compare=False)

    @property
    def metadata(self) -> bool:
        """A list of metadata alone was asked for."""
        return "as=PartialObjectMetadataList" in self.accept

    @property
    def watch(self) -> bool:
        return self.query.get("watch") in ("true", "1")


@dataclass
class _Watch:
    resource: str
    namespace: str | None
    query: dict[str, str]
    stream: ServerStream
    cut: bool = False


@dataclass
class _History:
    events: list[tuple[int, str, str, Obj]] = field(default_factory=list)
    """(resourceVersion, type, resource, object), in order."""
    compacted: int = 0
    """Watches from a resourceVersion below this get 410 Gone (etcd's compacted revision)."""


class ApiServer:
    def __init__(
        self, *, bookmark_interval_s: float = 60.0, max_streams: int = DEFAULT_MAX_STREAMS
    ) -> None:
        """`max_streams`: SETTINGS_MAX_CONCURRENT_STREAMS of each connection (kube-apiserver's
        `--http2-max-streams-per-connection`, 250 when unset)."""
        self.bookmark_interval_s = bookmark_interval_s
        self.max_streams = max_streams
        self.token_lifetime_s: int | None = None
        self.requests: list[Request] = []
        self.events: dict[tuple[str, str], Obj] = {}
        self.tokens_issued: list[Obj] = []
        self.service_accounts: set[tuple[str, str]] = set()
        self.users: dict[str, tuple[str, list[str]]] = {}
        """Bearer token -> (username, groups), for TokenReview."""
        self._grants: set[tuple[str, str, str, str, str, str]] = set()
        self.pv_controller = True
        self.fault: str | None = None
        """One of `FAULTS`, set with `set_fault`."""
        self.dropped = 0
        """Connections closed unread by the "drop" fault."""
        self._cond = threading.Condition()
        self._rv = 100
        self._objects: dict[tuple[str, str, str], Obj] = {}
        self._history = _History()
        self._watches: list[_Watch] = []
        self._server: H2Server | None = None
        self._accepted_before = 0
        self._max_streams_seen = 0
        self._protocol_errors: list[str] = []
        self.port = 0

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> ApiServer:
        """Listen (again) on loopback, on the same port after a `stop()`. A restarted server's
        watch cache starts at the current resourceVersion: older watches get 410."""
        with self._cond:
            self._history.compacted = self._rv
            self._history.events.clear()
        self._server = H2Server(
            self._handle, port=self.port, max_streams=self.max_streams, refuse=self._refuse
        )
        self._server.start()
        self.port = self._server.port
        return self

    def stop(self) -> None:
        """Go away as a killed process does: stop listening, close every connection."""
        server, self._server = self._server, None
        if server is None:
            return
        server.stop()
        self._accepted_before += server.accepted
        self._server_stopped(server)
        with self._cond:
            self._watches.clear()

    def connections(self) -> int:
        """TCP connections accepted since the first start (those "drop" closed included)."""
        return self._accepted_before + (self._server.accepted if self._server else 0)

    def open_connections(self) -> int:
        return self._server.open_connections if self._server else 0

    @property
    def max_streams_seen(self) -> int:
        """The most streams one connection carried at once, since the first start."""
        return max(self._max_streams_seen, self._server.max_streams_seen if self._server else 0)

    @property
    def protocol_errors(self) -> list[str]:
        """HTTP/2 protocol errors of clients (more streams than allowed, ...), since the first
        start: a connection with one is closed."""
        return self._protocol_errors + (self._server.protocol_errors if self._server else [])

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def write_kubeconfig(
        self,
        path: Path,
        *,
        token: str = TOKEN,
        client_certificate: Path | None = None,
        embedded: bool = False,
    ) -> Path:
        """A kubeconfig for this server: the bearer `token`, or, with `client_certificate` (a
        PEM file of certificate and key: `certificates().client(...)`), that certificate, as
        kubelet's kubeconfig names its `kubelet-client-current.pem`; `embedded`: as kubeadm's
        admin.conf holds it instead, certificate and key in the kubeconfig (`*-data`)."""
        cluster = {"server": self.url, "certificate-authority-data": certificates().ca_data}
        user: Obj = {"token": token}
        if client_certificate is not None and embedded:
            pem = client_certificate.read_bytes()
            key_at = pem.index(b"-----BEGIN PRIVATE KEY-----")
            user = {
                "client-certificate-data": base64.b64encode(pem[:key_at]).decode(),
                "client-key-data": base64.b64encode(pem[key_at:]).decode(),
            }
        elif client_certificate is not None:
            user = {"client-certificate": str(client_certificate)}
            user["client-key"] = str(client_certificate)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": cluster}],
            "users": [{"name": "fusevol", "user": user}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "fusevol"}}],
            "current-context": "test",
        }
        path.write_text(json.dumps(config))
        return path

    def _server_stopped(self, server: H2Server) -> None:
        self._max_streams_seen = max(self._max_streams_seen, server.max_streams_seen)
        self._protocol_errors += server.protocol_errors

    def _refuse(self) -> bool:
        if self.fault != "drop":
            return False
        self.dropped += 1
        return True

    def _notify(self) -> None:
        """Wake every watch and stalled request: the world or a fault changed."""
        if self._server is not None:
            self._server.notify()

    # -- the world, as the tests change it ---------------------------------------------------------

    def create(self, obj: Obj) -> Obj:
        obj = copy.deepcopy(obj)
        resource, namespace, name = self._identity(obj)
        meta = obj.setdefault("metadata", {})
        with self._cond:
            if (resource, namespace, name) in self._objects:
                raise ApiError(409, "AlreadyExists", f'{resource} "{name}" already exists')
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
            obj.setdefault("apiVersion", _api_version(resource))
            if resource == "pods":  # the pod strategy's PrepareForCreate: a status of its own
                obj["status"] = {"phase": "Pending"}
            created = self._commit("ADDED", resource, namespace, name, _normalize(obj))
            self._controllers()
            return created

    def update(self, obj: Obj) -> Obj:
        obj = copy.deepcopy(obj)
        resource, namespace, name = self._identity(obj)
        with self._cond:
            old = self._objects.get((resource, namespace, name))
            if old is None:
                raise ApiError(404, "NotFound", f'{resource} "{name}" not found')
            obj = _normalize(obj)
            if old.get("immutable") and any(
                obj.get(f) != old.get(f) for f in ("data", "binaryData", "immutable")
            ):
                raise ApiError(422, "Invalid", "field is immutable when `immutable` is set")
            obj["metadata"]["uid"] = old["metadata"]["uid"]
            obj["metadata"]["creationTimestamp"] = old["metadata"]["creationTimestamp"]
            updated = self._commit("MODIFIED", resource, namespace, name, obj)
            self._controllers()
            return updated

    def apply(self, obj: Obj) -> Obj:
        """Create or update."""
        resource, namespace, name = self._identity(obj)
        with self._cond:
            exists = (resource, namespace, name) in self._objects
        return self.update(obj) if exists else self.create(obj)

    def delete(self, kind: str, namespace: str, name: str, *, grace_period_s: int = 0) -> None:
        """The object goes at once, as with kubelet's last delete of a pod (or `--force`).
        `grace_period_s` > 0, for a pod bound to a node and not finished: a graceful deletion,
        as kube-apiserver makes it (`metadata.deletionTimestamp` and
        `deletionGracePeriodSeconds` set, a MODIFIED event); the pod stays until deleted again
        with none (kubelet's, once its containers have stopped)."""
        resource = RESOURCE_OF[kind]
        namespace = "" if resource in CLUSTER else namespace
        with self._cond:
            old = self._objects.get((resource, namespace, name))
            if old is None:
                raise ApiError(404, "NotFound", f'{resource} "{name}" not found')
            if grace_period_s > 0 and resource == "pods" and _graceful(old):
                meta = copy.deepcopy(old["metadata"])
                if "deletionTimestamp" not in meta:  # a second one shortens it: not modelled
                    moment = datetime.datetime.now(datetime.UTC)
                    moment += datetime.timedelta(seconds=grace_period_s)
                    meta["deletionTimestamp"] = _rfc3339(moment)
                    meta["deletionGracePeriodSeconds"] = grace_period_s
                    self._commit("MODIFIED", resource, namespace, name, {**old, "metadata": meta})
                return
            del self._objects[(resource, namespace, name)]
            self._commit("DELETED", resource, namespace, name, old)
            self._controllers()

    def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        resource = RESOURCE_OF[kind]
        with self._cond:
            obj = self._objects.get((resource, "" if resource in CLUSTER else namespace, name))
            return copy.deepcopy(obj)

    # -- faults ------------------------------------------------------------------------------------

    def cut_watches(self) -> int:
        """Every open watch dies with its next event half written. Returns how many."""
        with self._cond:
            for watch in self._watches:
                watch.cut = True
            self._notify()
            return len(self._watches)

    def compact(self) -> None:
        """Forget the history: a watch resuming from an older resourceVersion gets 410 Gone."""
        with self._cond:
            self._history.compacted = self._rv
            self._history.events.clear()

    def set_fault(self, mode: str | None) -> None:
        """Start misbehaving as `mode` (one of `FAULTS`), or stop (None); see the docstring."""
        assert mode is None or mode in FAULTS, mode
        with self._cond:
            self.fault = mode
            if mode == "500":  # open watches end cleanly; re-watching meets the 500s
                self._watches.clear()
            elif mode == "drop" and self._server is not None:
                self._server.drop_connections()
            self._notify()

    def open_watches(self, resource: str | None = None) -> list[tuple[str, str | None, str]]:
        """(resource, namespace, fieldSelector) of every watch being served now."""
        with self._cond:
            return [
                (w.resource, w.namespace, w.query.get("fieldSelector", ""))
                for w in self._watches
                if resource is None or w.resource == resource
            ]

    def count(self, method: str, resource: str, *, watch: bool | None = None) -> int:
        return sum(
            1
            for r in list(self.requests)
            if r.method == method
            and _resource_of_path(r.path) == resource
            and (watch is None or r.watch == watch)
        )

    # -- internals (under the lock) ----------------------------------------------------------------

    def allow(
        self,
        subject: str,
        verb: str,
        resource: str,
        subresource: str = "",
        name: str = "",
        namespace: str = "",
    ) -> None:
        """Grant `subject` (a username or a group) `verb` on `resource`/`subresource` (of the
        object `name`, in `namespace`; "" any), as an RBAC rule would: for its requests and in
        SubjectAccessReview answers."""
        self._grants.add((subject, verb, resource, subresource, name, namespace))

    def issue_token(self, namespace: str, account: str, pod_name: str, audience: str = "") -> str:
        """A token for `account` bound to the pod, as kubelet gets it for a CSIDriver's
        tokenRequests entry of `audience` ("": the API server's own)."""
        with self._cond:
            uid = self._objects[("pods", namespace, pod_name)]["metadata"]["uid"]
            spec: Obj = {
                "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod_name, "uid": uid}
            }
            if audience:
                spec["audiences"] = [audience]
            return str(self._issue_token(namespace, account, {"spec": spec})["status"]["token"])

    def revoke(self, subject: str) -> None:
        """Take back every grant of `subject`."""
        self._grants = {grant for grant in self._grants if grant[0] != subject}

    def _granted(self, user: User, attrs: Attributes) -> bool:
        return any(
            subject in (user.name, *user.groups)
            and (verb, resource, subresource) == (attrs.verb, attrs.resource, attrs.subresource)
            and name in ("", attrs.name)
            and namespace in ("", attrs.namespace)
            for subject, verb, resource, subresource, name, namespace in self._grants
        )

    def _authenticate(self, stream: ServerStream) -> User:
        if (subject := stream.client_subject) is not None:
            return User(*subject)
        header = stream.headers.get("authorization", "")
        token = header.removeprefix("Bearer ") if header.startswith("Bearer ") else None
        if token == TOKEN:
            return AGENT
        if token in self.users:
            name, groups = self.users[token]
            return User(name, tuple(groups))
        if token is not None and (user := self._issued_user(token)) is not None:
            return user
        raise ApiError(401, "Unauthorized", "Unauthorized")

    def _issued_user(self, token: str) -> User | None:
        """The service account of a token this server issued, if it is valid here."""
        try:
            claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
        except (ValueError, IndexError):
            return None
        if claims not in self.tokens_issued or claims["exp"] <= time.time():
            return None
        if API_AUDIENCE not in claims["aud"]:
            return None
        namespace = claims["sub"].split(":")[2]
        bound = claims["kubernetes.io"]["pod"]
        with self._cond:
            pod = self._objects.get(("pods", namespace, bound.get("name") or ""))
        if bound.get("name") and (pod is None or pod["metadata"]["uid"] != bound.get("uid")):
            return None
        groups = ("system:serviceaccounts", f"system:serviceaccounts:{namespace}")
        return User(claims["sub"], groups)

    def _authorize(self, user: User, attrs: Attributes | None) -> None:
        """Node, then RBAC (the `allow()` grants), as `--authorization-mode Node,RBAC`."""
        if user == AGENT or attrs is None:
            return
        reasons = []
        if (node := user.node) is not None:
            with self._cond:
                allowed, reason = node_decision(self._objects, node, attrs)
            if allowed:
                return
            reasons.append(reason)
        if attrs.resource == "selfsubjectreviews" or self._granted(user, attrs):
            return  # (every authenticated user may ask who it is: system:basic-user)
        raise ApiError(403, "Forbidden", forbidden(user, attrs, "\n".join(filter(None, reasons))))

    def _review_token(self, body: Obj) -> Obj:
        user = self.users.get((body.get("spec") or {}).get("token", ""))
        status: Obj = {"authenticated": False, "error": "invalid bearer token"}
        if user is not None:
            username, groups = user
            status = {
                "authenticated": True,
                "user": {"username": username, "uid": f"uid-{username}", "groups": groups},
                "audiences": ["https://kubernetes.default.svc"],
            }
        return {**body, "status": status}

    def _review_access(self, body: Obj) -> Obj:
        spec = body.get("spec") or {}
        attributes = spec.get("resourceAttributes") or {}
        wanted = [attributes.get(k, "") for k in ("verb", "resource", "subresource", "name")]
        allowed = any(
            subject in (spec.get("user"), *spec.get("groups", []))
            and [verb, resource, subresource] == wanted[:3]
            and name in ("", wanted[3])
            and namespace in ("", attributes.get("namespace", ""))
            for subject, verb, resource, subresource, name, namespace in self._grants
        )
        return {**body, "status": {"allowed": allowed}}

    def _identity(self, obj: Obj) -> tuple[str, str, str]:
        resource = RESOURCE_OF[obj["kind"]]
        meta = obj.setdefault("metadata", {})
        if resource in CLUSTER:
            return resource, "", meta["name"]
        namespace = meta.setdefault("namespace", "default")
        return resource, namespace, meta["name"]

    def _commit(self, kind: str, resource: str, namespace: str, name: str, obj: Obj) -> Obj:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        if kind != "DELETED":
            self._objects[(resource, namespace, name)] = obj
        self._history.events.append((self._rv, kind, resource, copy.deepcopy(obj)))
        self._notify()
        return copy.deepcopy(obj)

    def _controllers(self) -> None:
        if self.pv_controller:
            PvController(self._objects, self._commit).sync()

    def _list(self, resource: str, namespace: str | None, query: dict[str, str]) -> Obj:
        selector = _selector(resource, query)
        since = query.get("resourceVersion", "")
        with self._cond:
            if since not in ("", "0") and int(since) > self._rv:  # the watch cache is behind
                message = f"Too large resource version: {since}, current: {self._rv}"
                raise ApiError(504, "Timeout", message)
            items = [
                copy.deepcopy(obj)
                for (res, ns, _), obj in sorted(self._objects.items())
                if res == resource and namespace in (None, ns) and selector(obj)
            ]
            rv = self._rv
        kind = {**NAMESPACED, **CLUSTER}[resource]
        metadata: Obj = {"resourceVersion": str(rv)}
        if query.get("continue"):
            raise ApiError(400, "BadRequest", "continue: not served by this test server")
        limit = int(query.get("limit") or 0)
        if 0 < limit < len(items):  # a page, and where the next would start
            last = items[limit - 1]["metadata"]
            token = json.dumps({"rv": rv, "start": f"{last.get('namespace', '')}/{last['name']}"})
            metadata["continue"] = base64.urlsafe_b64encode(token.encode()).decode()
            if not query.get("fieldSelector") and not query.get("labelSelector"):
                metadata["remainingItemCount"] = len(items) - limit  # exact: no selector
            items = items[:limit]
        return {
            "kind": f"{kind}List",
            "apiVersion": _api_version(resource),
            "metadata": metadata,
            "items": items,
        }

    def _get_one(self, resource: str, namespace: str, name: str) -> Obj:
        with self._cond:
            obj = self._objects.get((resource, namespace, name))
        if obj is None:
            raise ApiError(404, "NotFound", f'{resource} "{name}" not found')
        return copy.deepcopy(obj)

    def _issue_token(self, namespace: str, account: str, body: Obj) -> Obj:
        spec = body.get("spec") or {}
        seconds = spec.get("expirationSeconds") or 3600
        if seconds < 600:
            raise ApiError(422, "Invalid", "may not specify a duration less than 10 minutes")
        if account != "default" and (namespace, account) not in self.service_accounts:
            raise ApiError(404, "NotFound", f'serviceaccounts "{account}" not found')
        ref = spec.get("boundObjectRef") or {}
        if ref:
            pod = self._objects.get(("pods", namespace, ref.get("name", "")))
            if ref.get("kind") != "Pod" or pod is None:
                raise ApiError(404, "NotFound", f'pods "{ref.get("name")}" not found')
            if ref.get("uid") and ref["uid"] != pod["metadata"]["uid"]:
                message = f"the UID in the bound object reference ({ref['uid']}) does not match"
                raise ApiError(409, "Conflict", message)
        lifetime = self.token_lifetime_s or seconds
        now = time.time()
        claims = {
            "aud": spec.get("audiences") or ["https://kubernetes.default.svc"],
            "iat": int(now),
            "exp": int(now + lifetime),
            "sub": f"system:serviceaccount:{namespace}:{account}",
            "kubernetes.io": {"pod": {"name": ref.get("name"), "uid": ref.get("uid")}},
            "n": len(self.tokens_issued),
        }
        token = ".".join(
            base64.urlsafe_b64encode(json.dumps(part).encode()).decode().rstrip("=")
            for part in ({"alg": "RS256"}, claims, {"sig": "test"})
        )
        self.tokens_issued.append(claims)
        expiry = datetime.datetime.fromtimestamp(now + lifetime, datetime.UTC)
        return {
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": account, "namespace": namespace},
            "spec": {**spec, "expirationSeconds": lifetime},
            "status": {"token": token, "expirationTimestamp": _rfc3339(expiry)},
        }

    def _record_event(self, method: str, namespace: str, name: str | None, body: Obj) -> Obj:
        with self._cond:
            if method == "POST":
                name = body.get("metadata", {}).get("name", "")
                if (namespace, name) in self.events:
                    raise ApiError(409, "AlreadyExists", f'events "{name}" already exists')
                self._rv += 1
                body.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
                self.events[(namespace, name)] = body
                return body
            assert name is not None
            old = self.events.get((namespace, name))
            if old is None:
                raise ApiError(404, "NotFound", f'events "{name}" not found')
            merged = _merge(old, body)
            self.events[(namespace, name)] = merged
            return merged

    # -- serving (on the HTTP/2 server's trio thread) ----------------------------------------------

    async def _handle(self, stream: ServerStream) -> None:
        url = urllib.parse.urlsplit(stream.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        method = stream.method
        self.requests.append(
            Request(method, url.path, query, accept=stream.headers.get("accept", ""))
        )
        body = json.loads(stream.body) if stream.body else {}
        try:
            if await self._stalled(stream):
                return
            if self.fault == "500":
                raise ApiError(500, "InternalError", "Internal error occurred (fault injected)")
            user = self._authenticate(stream)
            self._authorize(user, _attributes(method, url.path, query))
            await self._route(stream, user, method, url.path, query, body)
        except ApiError as exc:
            await _send_json(stream, exc.code, exc.status())

    async def _route(
        self,
        stream: ServerStream,
        user: User,
        method: str,
        path: str,
        query: dict[str, str],
        body: Obj,
    ) -> None:
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "v1"]:
            rest = parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 4 and GROUPS.get(parts[3]) == parts[1]:
            if parts[2] != "v1":
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            rest = parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if rest and GROUPS.get(rest[0], "") != (parts[1] if parts[0] == "apis" else ""):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        namespace: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if rest == ["events"] and method == "POST" and namespace:
            await _send_json(stream, 201, self._record_event("POST", namespace, None, body))
        elif len(rest) == 2 and rest[0] == "events" and method == "PATCH" and namespace:
            await _send_json(stream, 200, self._record_event("PATCH", namespace, rest[1], body))
        elif len(rest) == 3 and rest[0] == "serviceaccounts" and rest[2] == "token":
            if method != "POST" or namespace is None:
                raise ApiError(405, "MethodNotAllowed", "method not allowed")
            with self._cond:
                if user.node is not None and (
                    refusal := node_restriction(
                        self._objects, user.node, body.get("spec") or {}, namespace
                    )
                ):
                    raise ApiError(
                        403, "Forbidden", f'serviceaccounts "{rest[1]}" is forbidden: {refusal}'
                    )
                response = self._issue_token(namespace, rest[1], body)
            await _send_json(stream, 201, response)
        elif rest == ["selfsubjectreviews"] and method == "POST" and namespace is None:
            info = {"username": user.name, "groups": [*user.groups, "system:authenticated"]}
            await _send_json(stream, 201, {**body, "status": {"userInfo": info}})
        elif rest == ["tokenreviews"] and method == "POST" and namespace is None:
            await _send_json(stream, 201, self._review_token(body))
        elif rest == ["subjectaccessreviews"] and method == "POST" and namespace is None:
            await _send_json(stream, 201, self._review_access(body))
        elif rest == ["persistentvolumes"] and method == "POST" and namespace is None:
            body.setdefault("kind", "PersistentVolume")
            await _send_json(stream, 201, self.create(body))
        elif len(rest) == 2 and rest[0] == "persistentvolumes" and method == "DELETE":
            with self._cond:
                old = self._get_one(rest[0], "", rest[1])
                self.delete("PersistentVolume", "", rest[1])
            await _send_json(stream, 200, old)
        elif (
            method != "GET"
            or not rest
            or rest[0] not in {**NAMESPACED, **CLUSTER}
            or len(rest) > 2
            or (rest[0] in CLUSTER and namespace is not None)
            or (rest[0] in NAMESPACED and len(rest) == 2 and namespace is None)
        ):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        elif len(rest) == 2:
            await _send_json(stream, 200, self._get_one(rest[0], namespace or "", rest[1]))
        elif query.get("watch") in ("true", "1"):
            _selector(rest[0], query)  # a bad selector is a 400 before the stream starts
            await stream.respond(200, {"content-type": "application/json"})
            if await self._serve_watch(_Watch(rest[0], namespace, query, stream)):
                await stream.send(b"", end=True)
        else:
            listing = self._list(rest[0], namespace, query)
            if _metadata_asked(stream.headers.get("accept", "")):
                listing = _metadata_list(listing)
            await _send_json(stream, 200, listing)

    async def _stalled(self, stream: ServerStream) -> bool:
        """While the fault is "stall", hold a request unanswered. True if its client left."""
        assert self._server is not None
        server = self._server
        while True:
            if stream.closed:
                return True
            if self.fault != "stall":
                return False
            await server.wait_change(1.0)

    async def _serve_watch(self, watch: _Watch) -> bool:
        """Stream events until the timeout, a cut, or the server goes away. True: end the
        stream cleanly (False: it is reset or gone)."""
        server = self._server
        if server is None:  # stopped while this request was read: gone with it
            return False
        stream = watch.stream
        selector = _selector(watch.resource, watch.query)
        deadline = time.monotonic() + float(watch.query.get("timeoutSeconds") or 1800)
        bookmarks = watch.query.get("allowWatchBookmarks") == "true"
        since = watch.query.get("resourceVersion", "")
        with self._cond:
            if self.fault == "410" or (
                since not in ("", "0") and int(since) < self._history.compacted
            ):
                message = f"too old resource version: {since} ({self._history.compacted})"
                status = ApiError(410, "Expired", message).status()
                event: Obj = {"type": "ERROR", "object": status}
                pending: list[Obj] = [event]
                cursor = -1
            else:
                if since in ("", "0"):  # the current state as ADDED events, then what follows
                    pending = [
                        {"type": "ADDED", "object": copy.deepcopy(o)}
                        for (res, ns, _), o in sorted(self._objects.items())
                        if res == watch.resource and watch.namespace in (None, ns) and selector(o)
                    ]
                    cursor = self._rv
                else:
                    pending, cursor = [], int(since)
                self._watches.append(watch)
        if cursor < 0:
            await _send_event(stream, pending[0])
            return True
        next_bookmark = time.monotonic() + self.bookmark_interval_s
        try:
            while True:
                for item in pending:
                    if not await _send_event(stream, item, cut=watch.cut):
                        return False
                pending = []
                while not pending:
                    if stream.closed:
                        return False
                    with self._cond:
                        if watch.cut:
                            await _send_event(stream, {"type": "MODIFIED", "object": {}}, cut=True)
                            return False
                        if watch not in self._watches:
                            return True
                        if self.fault == "410":
                            message = "too old resource version (fault injected)"
                            status = ApiError(410, "Expired", message).status()
                            pending = [{"type": "ERROR", "object": status}]
                            break
                        events = [] if self.fault == "stall" else self._events_after(cursor)
                        cursor = max([cursor, *(e[0] for e in events)])
                        rv = self._rv
                    pending = [
                        {"type": kind, "object": obj}
                        for _, kind, resource, obj in events
                        if resource == watch.resource
                        and watch.namespace in (None, obj["metadata"].get("namespace"))
                        and selector(obj)
                    ]
                    now = time.monotonic()
                    if pending:
                        break
                    if now >= deadline:
                        return True
                    if bookmarks and now >= next_bookmark and self.fault != "stall":
                        next_bookmark = now + self.bookmark_interval_s
                        kind = {**NAMESPACED, **CLUSTER}[watch.resource]
                        cursor = max(cursor, rv)
                        bookmark = {
                            "kind": kind,
                            "apiVersion": _api_version(watch.resource),
                            "metadata": {"resourceVersion": str(rv)},
                        }
                        pending = [{"type": "BOOKMARK", "object": bookmark}]
                        break
                    await server.wait_change(min(deadline, next_bookmark) - now)
                if pending and pending[-1]["type"] == "ERROR":
                    await _send_event(stream, pending[0])
                    return True
        finally:
            with self._cond:
                if watch in self._watches:
                    self._watches.remove(watch)

    def _events_after(self, cursor: int) -> list[tuple[int, str, str, Obj]]:
        """The history after resourceVersion `cursor` (under the lock)."""
        events = self._history.events
        return events[bisect.bisect_right(events, cursor, key=lambda e: e[0]) :]


async def _send_json(stream: ServerStream, code: int, obj: Obj) -> None:
    data = json.dumps(obj).encode()
    await stream.respond(code, {"content-type": "application/json"})
    await stream.send(data, end=True)


async def _send_event(stream: ServerStream, event: Obj, *, cut: bool = False) -> bool:
    """One event as one line; with `cut`, half of it, then the stream is reset. False: gone."""
    line = json.dumps(event).encode() + b"\n"
    if cut:
        await stream.send(line[: len(line) // 2])
        await stream.reset()
        return False
    await stream.send(line)
    return not stream.closed


# -- helpers -------------------------------------------------------------------------------------


def _metadata_asked(accept: str) -> bool:
    """Whether `accept` asks for a list of metadata (client-go's metadata client), as
    kube-apiserver reads it: `application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1`.
    Any other `as=` is kube-apiserver's 406."""
    media, *params = (part.strip() for part in accept.split(";"))
    asked = dict(param.partition("=")[::2] for param in params)
    if "as" not in asked:
        return False
    if media == "application/json" and asked == {
        "as": "PartialObjectMetadataList",
        "g": "meta.k8s.io",
        "v": "v1",
    }:
        return True
    raise ApiError(406, "NotAcceptable", f"only the following media types are accepted: {accept}")


def _metadata_list(listing: Obj) -> Obj:
    """A list as kube-apiserver answers a metadata client: each item's metadata alone."""
    return {
        "kind": "PartialObjectMetadataList",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": listing["metadata"],
        "items": [
            {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": item["metadata"],
            }
            for item in listing["items"]
        ],
    }


def _selector(resource: str, query: dict[str, str]) -> Any:
    allowed = POD_FIELDS if resource == "pods" else FIELDS
    fields = _parse_selector(query.get("fieldSelector", ""))
    for name, _, _ in fields:
        if name not in allowed:
            raise ApiError(400, "BadRequest", f'field label not supported: "{name}"')
    labels = _parse_selector(query.get("labelSelector", ""))

    def matches(obj: Obj) -> bool:
        meta = obj.get("metadata", {})
        for name, op, value in fields:
            actual = meta.get("name") if name == "metadata.name" else None
            if name == "metadata.namespace":
                actual = meta.get("namespace", "")
            elif name == "spec.nodeName":
                actual = (obj.get("spec") or {}).get("nodeName", "")
            if (actual == value) != (op == "="):
                return False
        have = meta.get("labels") or {}
        for name, op, value in labels:
            if op == "exists" and name not in have:
                return False
            if op == "!exists" and name in have:
                return False
            if op in ("=", "!=") and (have.get(name) == value) != (op == "="):
                return False
        return True

    return matches


def _parse_selector(text: str) -> list[tuple[str, str, str]]:
    terms = []
    for term in filter(None, (t.strip() for t in text.split(","))):
        if "!=" in term:
            name, value = term.split("!=", 1)
            terms.append((name.strip(), "!=", value.strip()))
        elif "=" in term:
            name, value = term.replace("==", "=").split("=", 1)
            terms.append((name.strip(), "=", value.strip()))
        elif term.startswith("!"):
            terms.append((term[1:].strip(), "!exists", ""))
        else:
            terms.append((term, "exists", ""))
    return terms


def _attributes(method: str, path: str, query: dict[str, str]) -> Attributes | None:
    """The request as kube's RequestInfoResolver reads it; None for a non-resource path. A list
    or watch whose fieldSelector is `metadata.name=X` names X."""
    parts = path.strip("/").split("/")
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest:
        return None
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method)
    if verb is None:
        verb = "get" if name else "watch" if query.get("watch") in ("true", "1") else "list"
    if not name and verb in ("list", "watch"):
        for term in filter(None, query.get("fieldSelector", "").split(",")):
            field, _, value = term.replace("==", "=").partition("=")
            if field == "metadata.name" and not field.endswith("!"):
                name = value
    return Attributes(verb, group, rest[0], subresource, namespace, name)


def _resource_of_path(path: str) -> str:
    parts = path.strip("/").split("/")
    parts = parts[3:] if parts[0] == "apis" else parts[2:]
    if len(parts) >= 3 and parts[0] == "namespaces":
        parts = parts[2:]
    return "/".join(p for p in parts[:1] + parts[2:3])


def _api_version(resource: str) -> str:
    group = GROUPS.get(resource)
    return f"{group}/v1" if group else "v1"


def _normalize(obj: Obj) -> Obj:
    """What the API server stores: `stringData` merged into `data` (base64), every defaulted
    field filled in and quantities in canonical form (`tests/helpers/defaults.py`)."""
    if obj.get("kind") == "Secret" and obj.get("stringData"):
        data = obj.setdefault("data", {})
        for key, value in obj.pop("stringData").items():
            data[key] = base64.b64encode(value.encode()).decode()
    return defaults.as_stored(obj)


def _merge(old: Obj, patch: Obj) -> Obj:
    merged = copy.deepcopy(old)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _graceful(pod: Obj) -> bool:
    """kube-apiserver's pod strategy (`CheckGracefulDelete`): a pod not bound to a node, or
    finished, goes at once."""
    phase = (pod.get("status") or {}).get("phase")
    return bool(pod["spec"].get("nodeName")) and phase not in ("Succeeded", "Failed")


def _rfc3339(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _now() -> str:
    return _rfc3339(datetime.datetime.now(datetime.UTC))


@contextlib.contextmanager
def running_apiserver(**kwargs: Any) -> Any:
    server = ApiServer(**kwargs).start()
    try:
        yield server
    finally:
        server.stop()


# -- the PV controller's stand-in ------------------------------------------------------------------


class PvController:
    """kube-controller-manager's PV controller (pkg/controller/volume/persistentvolume), the part a
    node-local provisioner relies on, applied to the server's objects after every change:

    - a PV whose `spec.claimRef` names an existing claim (and its uid, if the ref has one) that is
      unbound, or bound to it: the claim gets `spec.volumeName`, the annotations
      `pv.kubernetes.io/bind-completed` and `pv.kubernetes.io/bound-by-controller`, `status.phase:
      Bound` with the PV's capacity and access modes; the PV gets `status.phase: Bound` and the
      claim's uid in its claimRef (`syncVolume`, `bind`);
    - a PV whose claimRef has a uid and whose claim is gone (or is another claim of that name):
      `status.phase: Released` (`syncVolume`, "volume is released"). Its reclaim is then the
      provisioner's: the controller deletes only what in-tree plugins provisioned;
    - a PV without claimRef: `Available`.
    Matching unbound claims to available PVs by size and class, and the scheduler's delayed
    binding, are not modelled. Runs under the server's lock; writes through `commit`.
    """

    def __init__(self, objects: dict[tuple[str, str, str], Obj], commit: Any) -> None:
        self._objects = objects
        self._commit = commit

    def sync(self) -> None:
        for (resource, _, name), pv in sorted(self._objects.items()):
            if resource == "persistentvolumes":
                self._sync_volume(name, pv)

    def _sync_volume(self, name: str, pv: Obj) -> None:
        ref = (pv.get("spec") or {}).get("claimRef")
        if not ref:
            self._set_phase("persistentvolumes", "", name, pv, "Available")
            return
        namespace = ref.get("namespace") or "default"
        claim = self._objects.get(("persistentvolumeclaims", namespace, ref.get("name", "")))
        uid = ref.get("uid", "")
        if claim is None or (uid and uid != claim["metadata"]["uid"]):
            if uid:
                self._set_phase("persistentvolumes", "", name, pv, "Released")
            else:
                self._set_phase("persistentvolumes", "", name, pv, "Available")
            return
        bound_to = (claim.get("spec") or {}).get("volumeName", "")
        if bound_to not in ("", name):
            return  # the claim is bound to another volume: the PV stays pre-bound, pending
        if not uid:
            pv = copy.deepcopy(pv)
            pv["spec"]["claimRef"]["uid"] = claim["metadata"]["uid"]
            pv = self._commit("MODIFIED", "persistentvolumes", "", name, pv)
        self._set_phase("persistentvolumes", "", name, pv, "Bound")
        if bound_to == name and (claim.get("status") or {}).get("phase") == "Bound":
            return
        claim = copy.deepcopy(claim)
        claim.setdefault("spec", {})["volumeName"] = name
        annotations = claim["metadata"].setdefault("annotations", {})
        annotations["pv.kubernetes.io/bind-completed"] = "yes"
        annotations["pv.kubernetes.io/bound-by-controller"] = "yes"
        claim["status"] = {
            "phase": "Bound",
            "accessModes": pv["spec"].get("accessModes", []),
            "capacity": pv["spec"].get("capacity", {}),
        }
        self._commit(
            "MODIFIED", "persistentvolumeclaims", namespace, claim["metadata"]["name"], claim
        )

    def _set_phase(self, resource: str, namespace: str, name: str, obj: Obj, phase: str) -> None:
        if (obj.get("status") or {}).get("phase") == phase:
            return
        obj = copy.deepcopy(obj)
        obj["status"] = {**(obj.get("status") or {}), "phase": phase}
        self._commit("MODIFIED", resource, namespace, name, obj)
