"""The containerd suite's shared fixtures: one containerd and one busybox rootfs per module, and
`report` for the measured figures. The image's tests run last in a session: `.ci/test` builds the
image in the background while the rest of the suite runs (their fixture waits for that build,
then finds it done)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.containerd.runtime import Containerd, build_rootfs

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name == "test_image.py")  # stable: the rest keep order


@pytest.fixture(scope="module")
def containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Containerd]:
    daemon = Containerd(tmp_path_factory.mktemp("containerd"))
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_rootfs(tmp_path_factory.mktemp("rootfs"))


@pytest.fixture
def report(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> Callable[[str], None]:
    """Show a measured figure on the terminal (even without -s) and append it to
    `<basetemp>/containerd-figures.txt`, where it stays after the run."""

    def show(line: str) -> None:
        with (tmp_path_factory.getbasetemp() / "containerd-figures.txt").open("a") as f:
            f.write(line + "\n")
        with capsys.disabled():
            print(f"\n[containerd] {line}")

    return show
