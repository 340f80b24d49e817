"""EventRecorder: Warning events on a pod when one of its volumes cannot be set up, as kubelet.

The event is kubelet's (docs/kubelet.md fact 9): reason `FailedMount`, type Warning, message
`MountVolume.SetUp failed for volume "<spec name>" : <error>`, on the Pod (`involvedObject` with
its uid), a core/v1 Event named `<pod>.<hex nanoseconds>`. The source is `fusevol` on this node,
so `kubectl describe pod` shows who wrote it.

client-go's EventCorrelator, in its two parts fusevol needs:
- deduplication: an event identical to one already written (same object, reason, type, message,
  source) is not created again; the existing one is PATCHed with `count + 1` and a new
  `lastTimestamp`, so a volume retried every backoff step is one line with a count;
- spam filter: a token bucket per pod, 25 events at once, then one every 5 minutes; events beyond
  it are dropped (logged at DEBUG).
(The aggregation of >10 similar events with different messages is not done.)

Recording never blocks the caller: events are queued and written by `run()`;
a failed write is logged and dropped, as client-go does after its retries.

Excludes: when a failure happens (the reconciler calls `failed_mount`).
"""

from __future__ import annotations

import datetime
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from fusevol.base.errors import FusevolError

if TYPE_CHECKING:
    from fusevol.kube.client import KubeClient, Obj
    from fusevol.model import Pod

log = logging.getLogger(__name__)

COMPONENT = "fusevol"
BURST = 25
REFILL_S = 300.0
QUEUE = 1000


@dataclass(slots=True)
class _Bucket:
    tokens: float = BURST
    at: float = 0.0

    def take(self, now: float) -> bool:
        self.tokens = min(BURST, self.tokens + (now - self.at) / REFILL_S)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


@dataclass(frozen=True, slots=True)
class _Event:
    pod: Pod
    reason: str
    message: str


@dataclass(slots=True)
class _Written:
    name: str
    count: int


class EventRecorder:
    def __init__(self, *, client: KubeClient, node_name: str) -> None:
        self._client = client
        self._node_name = node_name
        self._send, self._receive = trio.open_memory_channel[_Event](QUEUE)
        self._buckets: dict[str, _Bucket] = {}
        self._written: dict[tuple[str, ...], _Written] = {}
        self.recorded = 0
        self.dropped = 0

    def failed_mount(self, pod: Pod, spec_name: str, error: str) -> None:
        """Record kubelet's FailedMount event for volume `spec_name` of `pod`. Never blocks."""
        self.warning(
            pod, "FailedMount", f'MountVolume.SetUp failed for volume "{spec_name}" : {error}'
        )

    def warning(self, pod: Pod, reason: str, message: str) -> None:
        """Record a Warning event on `pod` (rate-limited per pod). Never blocks."""
        bucket = self._buckets.setdefault(pod.uid, _Bucket(at=time.monotonic()))
        if not bucket.take(time.monotonic()):
            self.dropped += 1
            log.debug("event dropped (rate limit) pod=%s/%s", pod.namespace, pod.name)
            return
        try:
            self._send.send_nowait(_Event(pod, reason, message))
        except trio.WouldBlock:
            self.dropped += 1

    def forget(self, pod_uids: set[str]) -> None:
        """Drop the state kept for pods that are gone."""
        for uid in self._buckets.keys() - pod_uids:
            del self._buckets[uid]
        for key in [k for k in self._written if k[0] not in pod_uids]:
            del self._written[key]

    async def run(self) -> None:
        async for event in self._receive:
            try:
                await self._write(event)
                self.recorded += 1
            except FusevolError as exc:
                log.error(
                    "event not recorded pod=%s/%s reason=%s error=%s",
                    event.pod.namespace,
                    event.pod.name,
                    event.reason,
                    exc,
                )

    async def _write(self, event: _Event) -> None:
        """Create the event, or count one more of an identical one."""
        pod = event.pod
        key = (pod.uid, event.reason, event.message)
        now = _rfc3339(datetime.datetime.now(datetime.UTC))
        written = self._written.get(key)
        if written is not None:
            patch = {"count": written.count + 1, "lastTimestamp": now}
            await self._client.patch_event(namespace=pod.namespace, name=written.name, patch=patch)
            written.count += 1
            return
        name = f"{pod.name}.{time.time_ns():x}"
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": pod.namespace},
            "involvedObject": {
                "kind": "Pod",
                "apiVersion": "v1",
                "namespace": pod.namespace,
                "name": pod.name,
                "uid": pod.uid,
                "resourceVersion": pod.resource_version,
            },
            "reason": event.reason,
            "message": event.message,
            "type": "Warning",
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": {"component": COMPONENT, "host": self._node_name},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._node_name,
        }
        await self._client.create_event(namespace=pod.namespace, event=body)
        self._written[key] = _Written(name, 1)


def _rfc3339(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
