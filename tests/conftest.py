"""Shared test configuration.

- Tests under tests/fuse and tests/kube need root and /dev/fuse; without them they are skipped
  with that reason, never silently passed.
- Any log record at WARNING or above fails the test unless the test consumed it (asserted on it
  and called `caplog.clear()`), as s3ql's pytest_checklogs does: an unexpected error log is a bug.
  An agent run as a process is checked the same way (`_check_agent_logs`, tests/agent.py).
- `manifests` and `agent`: the one agent harness (tests/agent.py) on the one pod set
  (tests/manifests.py). A module that needs other objects adds files to `manifests`.
- `watch`: inotify watchers on a volume (tests/inotify.py), stopped whatever the test's outcome.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.agent import HAS_FUSE, STARTED, AgentProcess, fail_on_unexpected_log_lines, running_agent
from tests.inotify import Watcher
from tests.manifests import POD_UID, write_pod_set

if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Iterator


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs root and /dev/fuse")
    for item in items:
        parts = Path(str(item.fspath)).parts
        if "fuse" in parts or "kube" in parts:
            item.add_marker(pytest.mark.fuse)
            if not HAS_FUSE:
                item.add_marker(skip)


_CALL_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[_CALL_FAILED] = report.failed
    return report


@pytest.fixture(autouse=True)
def _check_agent_logs(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every agent process's unexpected log lines fail the test during which they were logged
    (tests/agent.py), unless the test has failed already."""
    yield
    agents = list(STARTED)
    STARTED[:] = [a for a in agents if a.agent_alive()]  # the ones later tests may still use
    if not request.node.stash.get(_CALL_FAILED, True):
        fail_on_unexpected_log_lines(agents)


@pytest.fixture(autouse=True)
def _check_logs(caplog: pytest.LogCaptureFixture) -> object:
    yield
    unexpected = [r for r in caplog.get_records("call") if r.levelno >= logging.WARNING]
    if unexpected:
        lines = "\n".join(f"{r.levelname} {r.name}: {r.getMessage()}" for r in unexpected)
        pytest.fail(f"unexpected log records at WARNING or above:\n{lines}", pytrace=False)


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    """A manifest directory holding tests/manifests.py's pod, its ConfigMap and its Secret."""
    directory = tmp_path / "manifests"
    directory.mkdir()
    write_pod_set(directory)
    return directory


@pytest.fixture
def agent(manifests: Path, tmp_path: Path) -> Iterator[AgentProcess]:
    """The agent serving `manifests`, both volumes mounted; the test ends with a clean tear-down
    (SIGINT, exit 0, nothing left mounted: checked)."""
    with running_agent(manifests, tmp_path / "root") as running:
        running.wait_state(POD_UID, "config", "mounted")
        running.wait_state(POD_UID, "creds", "mounted")
        yield running
        running.stop()


@pytest.fixture
def watch() -> Iterator[Callable[[Path], Watcher]]:
    """Start `inotifywait` watchers, all stopped when the test ends, whatever its outcome."""
    watchers: list[Watcher] = []

    def start(directory: Path) -> Watcher:
        watchers.append(Watcher(directory))
        return watchers[-1]

    yield start
    for watcher in watchers:
        watcher.stop()
