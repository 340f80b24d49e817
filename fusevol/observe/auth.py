"""Who may read `/status` and `/metrics`: root on this node, and whom the API server says, as for
kubelet's own API (docs/kubelet.md fact 12). Every caller counts, loopback included: kubelet
authenticates its loopback callers too.

1. A caller on this node (at a loopback address, or at one of the node's own, where the chart's
   agent listens) whose end of the connection is a socket of root (uid 0 in the agent's user
   namespace, as the kernel's sock_diag tells: `ss -e` shows the same) is answered:
   root reads `<root>/fusevol/status.json` anyway, and `fusevol status` does. The socket must
   still be open and connected (a closed socket's remains carry no owner a caller can vouch for).
2. Any other caller must send a bearer token that the API server authenticates (a TokenReview)
   and authorizes (a SubjectAccessReview) for the node's subresource kubelet uses for the same
   thing: `nodes/metrics` for `/metrics`, `nodes/proxy` for everything else it serves
   (`/status`), verb `get`, name the node. As kubelet's authenticator and authorizer caches do,
   answers are kept a while (`cachetools`): an authenticated token for AUTHN_TTL_S, an allowed
   decision for ALLOWED_TTL_S, a denied one for DENIED_TTL_S, so a scraper costs the API server
   one review every few minutes, not two per scrape.
3. Without an API server to ask (the manifests source), nobody but root is answered.

`/healthz` and `/readyz` stay open: probes carry no token. With `--http-auth none` every caller is
answered (no `Authorizer` at all): for a port no one else reaches, or on purpose.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cachetools import TTLCache

from fusevol.base.errors import FusevolError
from fusevol.observe import peer

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from fusevol.observe.peer import Connection

log = logging.getLogger(__name__)

PROTECTED = {"/metrics": "metrics", "/status": "proxy"}
"""Path -> the `nodes` subresource a caller needs (`get`), as kubelet maps its own paths."""
AUTHN_TTL_S = 120.0
ALLOWED_TTL_S = 300.0
DENIED_TTL_S = 30.0
"""kubelet's defaults (--authentication-token-webhook-cache-ttl, --authorization-webhook-cache-
authorized-ttl and -unauthorized-ttl)."""
CACHED = 1024


@dataclass(frozen=True, slots=True)
class Denied:
    status: int
    """401: no or an unknown token; 403: a known caller without the permission, or no API
    server to ask; 503: the API server did not answer."""
    message: str


@dataclass(frozen=True, slots=True)
class User:
    name: str
    uid: str
    groups: tuple[str, ...]
    extra: tuple[tuple[str, tuple[str, ...]], ...]


class Authorizer:
    def __init__(
        self,
        *,
        node_name: str,
        post: Callable[[str, dict[str, object]], Awaitable[dict[str, object]]] | None,
    ) -> None:
        """`post(path, object)`: the API client's POST (None: no API server to ask)."""
        self._node_name = node_name
        self._post = post
        self._users: TTLCache[str, User | None] = TTLCache(CACHED, AUTHN_TTL_S)
        self._allowed: TTLCache[tuple[User, str], bool] = TTLCache(CACHED, ALLOWED_TTL_S)
        self._denied: TTLCache[tuple[User, str], bool] = TTLCache(CACHED, DENIED_TTL_S)
        self._unknown_callers = False
        """The kernel could not say who a loopback caller is (once logged)."""

    async def check(self, path: str, caller: Connection, authorization: str) -> Denied | None:
        """None if `caller` may GET `path`, else why not (steps of the module docstring)."""
        subresource = PROTECTED.get(path)
        if subresource is None or self._root(caller):  # (1)
            return None
        if self._post is None:  # (3)
            return Denied(
                403,
                f"{path} answers root on this node, and other callers only with the Kubernetes "
                "API source (it asks the API server who they are); or start the agent with "
                "--http-auth none",
            )
        scheme, _, token = authorization.partition(" ")  # (2)
        if scheme.lower() != "bearer" or not token.strip():
            return Denied(401, f"{path}: send a bearer token (Authorization: Bearer ...)")
        try:
            user = await self._authenticate(token.strip())
            if user is None:
                return Denied(401, f"{path}: the API server does not know this token")
            allowed = await self._authorize(user, subresource)
        except _Unanswered as exc:
            return Denied(503, f"{path}: cannot ask the API server who you are: {exc}")
        if not allowed:
            return Denied(
                403,
                f'{path}: user "{user.name}" may not get nodes/{subresource} of node '
                f'"{self._node_name}"',
            )
        return None

    def _root(self, caller: Connection) -> bool:
        """(1) `caller` is root on this node: its socket, found in our network namespace, is
        root's."""
        try:
            return peer.caller_uid(caller) == 0
        except OSError as exc:  # nobody is root then; the others still authenticate
            if not self._unknown_callers:
                self._unknown_callers = True
                log.warning("http auth: cannot tell who a caller on this node is: %s", exc)
            return False

    async def _authenticate(self, token: str) -> User | None:
        key = hashlib.sha256(token.encode()).hexdigest()  # the token itself is never kept
        if key in self._users:
            return self._users[key]
        assert self._post is not None
        review = await self._ask(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
        )
        status = review.get("status") or {}
        user = None
        if isinstance(status, dict) and status.get("authenticated"):
            info = status.get("user") or {}
            assert isinstance(info, dict)
            extra = info.get("extra") or {}
            assert isinstance(extra, dict)
            user = User(
                name=str(info.get("username", "")),
                uid=str(info.get("uid", "")),
                groups=tuple(info.get("groups") or ()),
                extra=tuple(sorted((k, tuple(v)) for k, v in extra.items())),
            )
        self._users[key] = user
        return user

    async def _authorize(self, user: User, subresource: str) -> bool:
        key = (user, subresource)
        if key in self._allowed or key in self._denied:
            return key in self._allowed
        spec: dict[str, object] = {
            "user": user.name,
            "groups": list(user.groups),
            "resourceAttributes": {
                "verb": "get",
                "resource": "nodes",
                "subresource": subresource,
                "name": self._node_name,
            },
        }
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra}
        review = await self._ask(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": spec,
            },
        )
        status = review.get("status") or {}
        allowed = isinstance(status, dict) and bool(status.get("allowed"))
        (self._allowed if allowed else self._denied)[key] = True
        return allowed

    async def _ask(self, path: str, review: dict[str, object]) -> dict[str, object]:
        assert self._post is not None
        try:
            return await self._post(path, review)
        except FusevolError as exc:  # cannot ask: nobody gets in, nothing is remembered
            log.warning("http auth: %s failed: %s", review["kind"], exc)
            raise _Unanswered(str(exc)) from None


class _Unanswered(Exception):
    pass
