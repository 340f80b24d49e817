"""Manifests that take the whole agent down or stall it, dropped into a running agent.

Each gets its own agent: today each of them ends the agent (and with it every served volume: its
FUSE mount dies) or stops it answering for seconds, so they cannot share the module agent of
`test_bad_input_agent`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from tests.agent import LogTail, running_agent, wait_for
from tests.manifests import FILES, POD_UID
from tests.served import pod_set_snapshots, read_within

if TYPE_CHECKING:
    from pathlib import Path


CRASHING = [
    pytest.param("kind.yaml", b"kind: [ConfigMap]\nmetadata: {name: x}\n", id="unhashable-kind"),
    pytest.param(
        "stamp.yaml",
        b"kind: ConfigMap\nmetadata: {name: x}\nx: !!timestamp y\n",
        id="timestamp-tag",
    ),
    pytest.param(
        "digits.json", b'{"kind": "ConfigMap", "n": ' + b"7" * 5000 + b"}", id="json-5000-digits"
    ),
]


@pytest.mark.parametrize(("name", "content"), CRASHING)
def test_agent_survives_a_file_the_parser_chokes_on(
    manifests: Path, tmp_path: Path, name: str, content: bytes
) -> None:
    with running_agent(
        manifests, tmp_path / "root", expect_log=("manifest rejected, nothing served from it",)
    ) as agent:
        agent.wait_state(POD_UID, "config", "mounted")
        agent.wait_state(POD_UID, "creds", "mounted")
        before = pod_set_snapshots(agent)
        tail = LogTail(agent.log_path)
        (manifests / name).write_bytes(content)
        assert agent.process is not None

        def rejected_or_dead() -> str | None:
            tail.read_new()
            if agent.process is not None and agent.process.poll() is not None:
                return "dead"
            return (
                "rejected"
                if f"manifest rejected, nothing served from it: {manifests / name}" in tail.text
                else None
            )

        outcome = wait_for(rejected_or_dead, timeout_s=10)
        assert outcome == "rejected", tail.text[-2000:]
        assert pod_set_snapshots(agent) == before
        assert set(FILES) == set(before)
        os.unlink(manifests / name)
        agent.stop()


def test_long_quantity_does_not_stall_the_served_volumes(manifests: Path, tmp_path: Path) -> None:
    with running_agent(
        manifests, tmp_path / "root", expect_log=("manifest rejected, nothing served from it",)
    ) as agent:
        agent.wait_state(POD_UID, "config", "mounted")
        volume = agent.volume(POD_UID, "configmap", "config")
        tail = LogTail(agent.log_path)
        (manifests / "quantity.yaml").write_text(
            "kind: Pod\nmetadata: {name: q}\nspec:\n  containers:\n  - name: c\n"
            "    resources: {limits: {cpu: '" + "1" * 30_000 + "x'}}\n"
        )
        tail.wait_line("reading manifests", "quantity.yaml")  # it is being parsed now
        try:
            assert read_within(volume / "b", timeout_s=1.0) == b"beta"
        finally:
            line = tail.wait_line("manifest rejected", "quantity.yaml", timeout_s=60)
            assert "limits" in line
            agent.stop()
