"""The image's tests run last in a session: `.ci/test` builds the image in the background while
the rest of the suite runs (their fixture waits for that build, then finds it done)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name == "test_image.py")  # stable: the rest keep order
