"""TokenManager: service account tokens for serviceAccountToken projections, kubelet's way.

For each projection of each pod, a TokenRequest for the pod's service account with the
projection's audience and `expirationSeconds`, bound to the pod (`boundObjectRef` Pod name+uid),
as kubelet's token manager does (docs/kubelet.md facts 3, 7). The token goes to the object store as
a `ServiceAccountToken` (memory only, never logged, hidden from `repr`); the volumes that project it
are refreshed when it changes, like for any other object.

Refresh: kubelet's `requiresRefresh`, from the answer's `expirationTimestamp` and
`expirationSeconds` (the server may grant another lifetime than asked): once 80 % of the lifetime
has passed, or 24 h after issue, minus a jitter. kubelet's jitter is uniform in [0, 10 s); here it
is also at most a tenth of the lifetime, so that a short-lived token is not refreshed at once.
Where kubelet checks at its next pod sync, fusevol schedules the refresh at that time. A failed
refresh keeps the old token while it is valid and is retried with backoff (1 s doubling to 1 min;
one ERROR line, the retries at DEBUG until one succeeds);
an expired token is dropped, and the volume keeps its last content, failing until a new one comes.

Excludes: the payload and its modes (`fusevol.projection.projected`).
"""

from __future__ import annotations

import datetime
import logging
import math
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from fusevol.base.errors import FusevolError
from fusevol.model import (
    ProjectedVolumeSource,
    ResourceVersion,
    ServiceAccountToken,
    ServiceAccountTokenProjection,
    token_key,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from fusevol.kube.client import KubeClient, Obj
    from fusevol.model import ObjectKey, Pod
    from fusevol.volumemanager.cache.store import ObjectStore

log = logging.getLogger(__name__)

MAX_TTL_S = 24 * 3600.0
MAX_JITTER_S = 10.0
REFRESH_FRACTION = 0.2
RETRY_S = (1.0, 60.0)


@dataclass(slots=True)
class _Token:
    pod: Pod
    projection: ServiceAccountTokenProjection
    refresh_at: float = -math.inf
    """`time.time()` after which a new token is wanted."""
    expires_at: float = -math.inf
    failures: int = 0


@dataclass(frozen=True, slots=True)
class TokenStatistics:
    tokens: int
    requests: int
    failures: int


class TokenManager:
    def __init__(self, *, client: KubeClient, store: ObjectStore) -> None:
        self._client = client
        self._store = store
        self._tokens: dict[ObjectKey, _Token] = {}
        self._issued = 0
        self._requests = 0
        self._failures = 0
        self._wakeup = trio.Event()

    async def ensure(self, pods: Iterable[Pod]) -> None:
        """Obtain the tokens of `pods` that have none yet, concurrently; failures are logged and
        retried by `run()`."""
        missing: list[_Token] = []
        for pod in pods:
            for key, projection in _projections(pod):
                token = self._tokens.get(key)
                if token is None:
                    token = self._tokens[key] = _Token(pod, projection)
                    missing.append(token)
                token.pod = pod
        async with trio.open_nursery() as nursery:
            for token in missing:
                nursery.start_soon(self._request, token)
        self._wakeup.set()

    def retain(self, pods: Iterable[Pod]) -> None:
        """Forget the tokens no pod of `pods` projects any more (kubelet's deleteServiceAccountToken
        on TearDown)."""
        wanted = {key for pod in pods for key, _ in _projections(pod)}
        for key in self._tokens.keys() - wanted:
            del self._tokens[key]
            self._store.delete(key)

    async def run(self) -> None:
        """Refresh tokens when they are due, until cancelled."""
        while True:
            self._wakeup = trio.Event()
            now = time.time()
            for token in [t for t in self._tokens.values() if t.refresh_at <= now]:
                await self._request(token)
            next_at = min((t.refresh_at for t in self._tokens.values()), default=math.inf)
            with trio.move_on_after(max(0.0, next_at - time.time())):
                await self._wakeup.wait()

    def statistics(self) -> TokenStatistics:
        return TokenStatistics(len(self._tokens), self._requests, self._failures)

    async def _request(self, token: _Token) -> None:
        pod, projection = token.pod, token.projection
        key = token_key(pod, projection)
        spec: Obj = {
            "expirationSeconds": projection.expiration_seconds,
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod.name, "uid": pod.uid},
        }
        if projection.audience:
            spec["audiences"] = [projection.audience]
        self._requests += 1
        token.refresh_at = math.inf  # in flight: run() must not ask again meanwhile
        try:
            answer = await self._client.request_token(
                namespace=pod.namespace, service_account=pod.service_account_name, spec=spec
            )
            value = str(answer["status"]["token"]).encode()
            expires_at = _parse_time(str(answer["status"]["expirationTimestamp"]))
            lifetime = float(answer.get("spec", {}).get("expirationSeconds") or 0)
        except (FusevolError, KeyError, TypeError, ValueError) as exc:
            self._failed(token, key, exc)
            return
        if key not in self._tokens:
            return  # the pod went away while we asked
        issued_at = expires_at - lifetime
        jitter = random.uniform(0, min(MAX_JITTER_S, lifetime / 10))
        token.refresh_at = min(
            issued_at + MAX_TTL_S - jitter, expires_at - REFRESH_FRACTION * lifetime - jitter
        )
        token.expires_at = expires_at
        token.failures = 0
        self._issued += 1
        self._store.upsert(
            ServiceAccountToken(key.namespace, key.name, ResourceVersion(str(self._issued)), value)
        )
        log.info(
            "token obtained pod=%s/%s serviceaccount=%s audience=%r expires_in=%.0fs",
            pod.namespace,
            pod.name,
            pod.service_account_name,
            projection.audience,
            expires_at - time.time(),
        )

    def _failed(self, token: _Token, key: ObjectKey, exc: Exception) -> None:
        self._failures += 1
        delay = min(RETRY_S[0] * 2**token.failures, RETRY_S[1])
        token.failures += 1
        token.refresh_at = time.time() + delay
        pod = token.pod
        log.log(
            logging.ERROR if token.failures == 1 else logging.DEBUG,  # then quiet, till it works
            "TokenRequest failed pod=%s/%s serviceaccount=%s retry_in=%gs error=%s",
            pod.namespace,
            pod.name,
            pod.service_account_name,
            delay,
            exc,
        )
        if time.time() >= token.expires_at:
            self._store.delete(key)


def _projections(pod: Pod) -> Iterator[tuple[ObjectKey, ServiceAccountTokenProjection]]:
    for volume in pod.volumes:
        if isinstance(volume.source, ProjectedVolumeSource):
            for projection in volume.source.sources:
                if isinstance(projection, ServiceAccountTokenProjection):
                    yield token_key(pod, projection), projection


def _parse_time(text: str) -> float:
    """RFC 3339 (`2024-01-31T12:34:56Z`) -> seconds since the epoch."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
