"""kubelet's own annotations in a downward API file of a pod from the API server: byte for byte
with kubelet's format (`config.source="api"`, no `config.hash`), the first-seen time kept through
an update of the pod and a restart of the agent, and nothing written back to the pod."""

from __future__ import annotations

import copy
import time
from typing import TYPE_CHECKING, Any

from tests.agent import running_agent, wait_for
from tests.helpers.seen import check_seen, seen_in
from tests.kube.conftest import UID, pod

if TYPE_CHECKING:
    from pathlib import Path

    from tests.agent import AgentProcess
    from tests.helpers.apiserver import ApiServer

ANNOTATIONS = {
    "a.example.com/note": 'say "hi"',
    "kubernetes.io/config.source": "mine",
    "zz.example.com/last": "z",
}
VOLUMES = [
    {
        "name": "info",
        "downwardAPI": {
            "items": [
                {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
                {
                    "path": "source",
                    "fieldRef": {
                        "fieldPath": "metadata.annotations['kubernetes.io/config.source']"
                    },
                },
            ]
        },
    }
]


def expected_annotations(seen: str, note: str = 'say \\"hi\\"') -> bytes:
    """kubelet's file for a pod from the API: its annotations and kubelet's (config.source
    replacing the pod's), keys in byte order, values Go-quoted, no trailing newline."""
    return (
        f'a.example.com/note="{note}"\n'
        f'kubernetes.io/config.seen="{seen}"\n'
        'kubernetes.io/config.source="api"\n'
        'zz.example.com/last="z"'
    ).encode()


def annotations_of(agent: AgentProcess) -> bytes:
    return (agent.volume(UID, "downward-api", "info") / "annotations").read_bytes()


def test_annotations_file_is_kubelets_and_survives_an_update_and_a_restart(
    api: ApiServer, tmp_path: Path
) -> None:
    web: dict[str, Any] = pod(volumes=VOLUMES)
    web["metadata"]["annotations"] = dict(ANNOTATIONS)
    created = api.create(web)
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    root = tmp_path / "root"
    args = ("--kubeconfig", str(kubeconfig))
    started = time.time_ns()
    with running_agent(None, root, *args) as first:
        first.wait_state(UID, "info", "mounted")
        served = annotations_of(first)
        seen = seen_in(served)
        check_seen(seen, after_ns=started, before_ns=time.time_ns())
        assert served == expected_annotations(seen)
        info = first.volume(UID, "downward-api", "info")
        assert (info / "source").read_bytes() == b"api"

        # An update of the pod: its own annotations change, kubelet's first-seen time stays.
        updated = copy.deepcopy(created)
        updated["metadata"]["annotations"]["a.example.com/note"] = "edited"
        api.update(updated)
        wait_for(lambda: annotations_of(first) == expected_annotations(seen, "edited"))

        # Nothing was written back: the pod in the API is as the test left it.
        in_api = api.get("Pod", "default", "web")
        assert in_api is not None
        assert in_api["metadata"]["annotations"] == {**ANNOTATIONS, "a.example.com/note": "edited"}
        assert api.count("PATCH", "pods") == api.count("POST", "pods") == 0

        first.hand_over()
        with running_agent(None, root, *args) as second:
            first.wait_agent_gone(10)  # released: what we read now is the second agent's
            second.wait_state(UID, "info", "mounted")
            assert annotations_of(second) == expected_annotations(seen, "edited")
            second.stop()
