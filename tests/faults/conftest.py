"""Fixtures of the fault suite: a manifest directory holding a healthy pod, and an agent on it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.faults.support import HEALTHY_UID, agent_on, write_healthy

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tests.agent import AgentProcess


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    directory = tmp_path / "manifests"
    directory.mkdir()
    write_healthy(directory)
    return directory


@pytest.fixture
def agent(manifests: Path, tmp_path: Path) -> Iterator[AgentProcess]:
    """The agent serving `manifests`, healthy pod mounted; ends with a clean, checked stop."""
    with agent_on(manifests, tmp_path / "root") as running:
        running.wait_state(HEALTHY_UID, "config", "mounted")
        running.wait_state(HEALTHY_UID, "creds", "mounted")
        yield running
        running.stop()
