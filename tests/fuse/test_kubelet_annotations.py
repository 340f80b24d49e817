"""kubelet's own annotations in a downward API file, from the real agent on a manifest directory
(kubelet's `file` source): byte for byte with kubelet's format, and the same file after the agent
restarts (a hand-over, then a crash); the first-seen record goes with the pod."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from tests.agent import AgentProcess, running_agent, wait_for
from tests.helpers.seen import check_seen, seen_in

if TYPE_CHECKING:
    from pathlib import Path

UID = "dddddddd-0000-4000-8000-000000000001"
POD = f"""
kind: Pod
metadata:
  name: web
  uid: {UID}
  annotations:
    a.example.com/note: 'say "hi"'
    kubernetes.io/config.source: mine
    zz.example.com/last: z
spec:
  containers: [{{name: c}}]
  volumes:
    - name: info
      downwardAPI:
        items:
          - {{path: annotations, fieldRef: {{fieldPath: metadata.annotations}}}}
          - path: source
            fieldRef: {{fieldPath: "metadata.annotations['kubernetes.io/config.source']"}}
    - name: all-in-one
      projected:
        sources:
          - downwardAPI:
              items: [{{path: meta/annotations, fieldRef: {{fieldPath: metadata.annotations}}}}]
"""


def expected_annotations(seen: str) -> bytes:
    """What kubelet writes for this pod from its file source: `FormatMap` of the pod's
    annotations and its own (config.source replacing the pod's), keys in byte order, each value
    Go-quoted, no trailing newline."""
    return (
        b'a.example.com/note="say \\"hi\\""\n'
        b'kubernetes.io/config.hash="' + UID.encode() + b'"\n'
        b'kubernetes.io/config.seen="' + seen.encode() + b'"\n'
        b'kubernetes.io/config.source="file"\n'
        b'zz.example.com/last="z"'
    )


def files(agent: AgentProcess) -> dict[str, bytes]:
    info = agent.volume(UID, "downward-api", "info")
    projected = agent.volume(UID, "projected", "all-in-one")
    return {
        "annotations": (info / "annotations").read_bytes(),
        "source": (info / "source").read_bytes(),
        "projected": (projected / "meta" / "annotations").read_bytes(),
    }


def test_annotations_file_is_kubelets_and_survives_restarts(tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "pod.yaml").write_text(POD)
    root = tmp_path / "root"
    started = time.time_ns()
    with running_agent(manifests, root) as first:
        first.wait_state(UID, "info", "mounted")
        first.wait_state(UID, "all-in-one", "mounted")
        served = files(first)
        seen = seen_in(served["annotations"])
        check_seen(seen, after_ns=started, before_ns=time.time_ns())
        assert served == {
            "annotations": expected_annotations(seen),
            "source": b"file",
            "projected": expected_annotations(seen),
        }
        # Kept in the agent's state: pod uids and times, nothing else.
        record = root / "fusevol" / "seen.json"
        assert json.loads(record.read_text()) == {"seen": {UID: seen}}
        # The pod in its manifest is left as it was.
        assert (manifests / "pod.yaml").read_text() == POD

        first.hand_over()  # (1) an upgrade-restart: the next agent serves the same file
        with running_agent(manifests, root) as second:
            first.wait_agent_gone(10)  # released: what we read now is the second agent's
            second.wait_state(UID, "info", "mounted")
            assert files(second) == served

            second.kill()  # (2) a crash
            with running_agent(manifests, root) as third:
                wait_for(lambda: files(third) == served, timeout_s=10)

                # The pod goes: its time goes from the record.
                (manifests / "pod.yaml").unlink()
                wait_for(lambda: not (root / "pods" / UID).exists(), timeout_s=10)
                wait_for(lambda: json.loads(record.read_text()) == {"seen": {}})
                third.stop()
