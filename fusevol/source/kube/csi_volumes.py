"""CsiVolumes: what the CSI volumes the source tracks (`KubeSource.track`) reference, and as whom
their objects are read.

With `pod_volumes` False (CSI: kubelet serves the pods' own volumes) only what CSI volumes
reference is tracked, and no token is requested for the pods' own projections. With `read_as_pod`
(CSI, `--csi-read-as pod`) a CSI volume's ConfigMaps and Secrets are read with its pod's own
token, the one kubelet passes for the API server's audience (""): `track` GETs each as the pod
at every publish and republish (a refusal is the publish's PERMISSION_DENIED, naming the object
and the service account, as the API server's message does), and a watch per object, one however
many pods use it, runs with the freshest token of a pod allowed to read it (`client_for`). A
watch outlives its token (the API server authenticates a request when it starts), and is
reopened every 5-10 min (the reflector's timeout) with the token of the latest republish; if none
is valid then, or the pod lost its permission (a refused republish changes nothing already
tracked), the watch is refused and retried with backoff, and the volume keeps its last content.

Excludes: which objects a volume references (`references`), keeping them current (`objects`),
requesting tokens (`tokens`).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from typing import TYPE_CHECKING

from fusevol.kube.errors import ApiError, ApiUnavailable

if TYPE_CHECKING:
    from collections.abc import Mapping

    from fusevol.kube.client import KubeClient
    from fusevol.model import ObjectKey, Pod, Volume

log = logging.getLogger(__name__)

POD_AUDIENCE = ""
"""The audience of the pod token a CSI volume is read with (`read_as_pod`): the API server's own
(a CSIDriver `tokenRequests` entry `{audience: ""}`)."""


class CsiVolumes:
    def __init__(self, *, client: KubeClient, read_as_pod: bool) -> None:
        """`read_as_pod`: CSI volumes' objects are read with their pods' tokens."""
        self._client = client
        self._read_as_pod = read_as_pod
        self._as_pod: dict[str, frozenset[ObjectKey]] = {}
        """CSI volume -> the objects read with its pod's token."""
        self._pod_tokens: dict[ObjectKey, str] = {}
        """An object read as a pod -> the token of the latest pod allowed to read it."""
        self._extra: dict[str, set[ObjectKey]] = {}
        """What CSI volumes reference (`track`), by volume."""
        self._referenced: collections.Counter[ObjectKey] = collections.Counter()
        """How many of `_extra`'s volumes reference each object: `referenced()` at every
        publish, without a walk over every CSI volume of the node."""
        self._token_pods: dict[str, Pod] = {}
        """A pod with just its CSI volume, for each CSI volume whose tokens are requested here."""

    async def track(
        self,
        owner: str,
        pod: Pod,
        volume: Volume | None,
        keys: set[ObjectKey],
        *,
        tokens: bool,
        pod_tokens: Mapping[str, bytes] | None,
    ) -> str:
        """`volume` (a CSI volume of `pod`, None: stop) references `keys` for `owner`; with
        `tokens`, its tokens are requested by TokenRequest. Read as the pod, each of `keys` is
        first read with the pod's token (`pod_tokens`, kubelet's by audience). Returns why the
        pod may not, and then nothing changes ("" if it may). `ApiUnavailable` if the read had
        no answer."""
        if self._read_as_pod and volume is not None and keys:
            token = (pod_tokens or {}).get(POD_AUDIENCE)
            if refusal := await self._read_as(pod, keys, token):
                return refusal  # what it tracked (a republish refused), it keeps tracking
            self._as_pod[owner] = frozenset(keys)
        if not keys:
            self._as_pod.pop(owner, None)
        self._pod_tokens = {
            key: token for key, token in self._pod_tokens.items() if self._read_by_pod(key)
        }
        self.expect(owner, keys)
        if tokens and volume is not None:
            self._token_pods[owner] = dataclasses.replace(pod, volumes=(volume,))
        else:
            self._token_pods.pop(owner, None)
        return ""

    @property
    def read_as_pod(self) -> bool:
        return self._read_as_pod

    def expect(self, owner: str, keys: set[ObjectKey]) -> None:
        """`owner` references `keys` from now on (none: no more): a CSI volume (`track`), or a
        pod of this node whose CSI volumes kubelet will publish (`KubeSource`)."""
        for key in self._extra.pop(owner, ()):
            self._referenced[key] -= 1
            if not self._referenced[key]:
                del self._referenced[key]
        if keys:
            self._extra[owner] = keys
            self._referenced.update(keys)

    def referenced(self) -> set[ObjectKey]:
        """What the CSI volumes reference, all of them."""
        return set(self._referenced)

    def token_pods(self) -> list[Pod]:
        """A pod with just its CSI volume for each CSI volume whose tokens are requested here."""
        return list(self._token_pods.values())

    def token_pod(self, owner: str) -> Pod | None:
        return self._token_pods.get(owner)

    def reads_as_pod(self, key: ObjectKey) -> bool:
        """`key` is read with a pod's token."""
        return key in self._pod_tokens

    def client_for(self, key: ObjectKey) -> KubeClient:
        """The client that reads `key` as a pod: the freshest token of a pod allowed to."""
        return self._client.with_authorization(lambda: f"Bearer {self._pod_tokens.get(key, '')}")

    async def _read_as(self, pod: Pod, keys: set[ObjectKey], token: bytes | None) -> str:
        """GET each of `keys` as `pod` (its `token`): "" if it may read them all (the token then
        reads them from now on), else why not."""
        account = f"system:serviceaccount:{pod.namespace}:{pod.service_account_name}"
        if token is None:
            return (
                f"read as the pod ({account}): kubelet passed no token for the API server's "
                f"audience in csi.storage.k8s.io/serviceAccount.tokens: the CSIDriver's "
                f'tokenRequests must list {{audience: ""}}'
            )
        reader = self._client.with_token(token.decode())
        for key in sorted(keys, key=str):
            try:
                await reader.get(key.kind, namespace=key.namespace, name=key.name)
            except ApiError as exc:
                if exc.code in (401, 403):
                    log.info(
                        "read as pod refused object=%s pod=%s/%s error=%s",
                        key,
                        pod.namespace,
                        pod.name,
                        exc,
                    )
                    return f"read as the pod ({account}): {exc}"
                raise ApiUnavailable(f"read {key} as the pod ({account}): {exc}") from None
        for key in keys:
            self._pod_tokens[key] = token.decode()
        return ""

    def _read_by_pod(self, key: ObjectKey) -> bool:
        return any(key in keys for keys in self._as_pod.values())
