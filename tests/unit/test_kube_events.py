"""EventRecorder's spam filter: client-go's per-object token bucket (burst 25, one per 5 min)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fusevol.kube.events import EventRecorder
from fusevol.model import Pod, PodUID, ResourceVersion

if TYPE_CHECKING:
    import pytest


def pod(uid: str) -> Pod:
    return Pod(PodUID(uid), "default", uid, ResourceVersion("1"))


def test_a_pod_gets_25_events_then_one_per_five_minutes(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    recorder = EventRecorder(client=Any, node_name="n")  # type: ignore[arg-type]
    for _ in range(30):
        recorder.failed_mount(pod("a"), "v", "boom")
    assert recorder.dropped == 5
    recorder.failed_mount(pod("b"), "v", "boom")  # another pod has its own bucket
    assert recorder.dropped == 5
    now[0] += 299
    recorder.failed_mount(pod("a"), "v", "boom")
    assert recorder.dropped == 6
    now[0] += 2
    recorder.failed_mount(pod("a"), "v", "boom")
    assert recorder.dropped == 6
