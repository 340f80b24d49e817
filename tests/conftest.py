"""Shared test configuration.

- Tests under tests/fuse, tests/kube and tests/privileged need root and /dev/fuse; without them
  they are skipped with that reason, never silently passed.
- Any log record at WARNING or above fails the test unless the test consumed it (asserted on it
  and called `caplog.clear()`), as s3ql's pytest_checklogs does: an unexpected error log is a bug.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.agent import HAS_FUSE


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs root and /dev/fuse")
    for item in items:
        parts = Path(str(item.fspath)).parts
        if "fuse" in parts or "kube" in parts or "privileged" in parts:
            item.add_marker(pytest.mark.privileged if "privileged" in parts else pytest.mark.fuse)
            if not HAS_FUSE:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _check_logs(caplog: pytest.LogCaptureFixture) -> object:
    yield
    unexpected = [r for r in caplog.get_records("call") if r.levelno >= logging.WARNING]
    if unexpected:
        lines = "\n".join(f"{r.levelname} {r.name}: {r.getMessage()}" for r in unexpected)
        pytest.fail(f"unexpected log records at WARNING or above:\n{lines}", pytrace=False)
