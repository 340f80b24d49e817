"""The pin holder (`fusevol.fuse.pin_helper`) on a plain directory, and the agent's side of it
(`fusevol.fuse.pins`) with the real helper process. What pins save on a FUSE mount is checked
in tests/fuse/test_read_path.py."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from fusevol.fuse.pin_helper import Holder
from fusevol.fuse.pins import Pins

if TYPE_CHECKING:
    import pytest


def volume(tmp_path: Path) -> str:
    """A volume as kubelet lays it out: `..v1/{a,d/b}`, `..v10/a`, `..data`, links `a` and `d`."""
    for version in ("..v1", "..v10"):
        (tmp_path / version).mkdir()
        (tmp_path / version / "a").write_text("a")
    (tmp_path / "..v1" / "d").mkdir()
    (tmp_path / "..v1" / "d" / "b").write_text("b")
    (tmp_path / "..data").symlink_to("..v1")
    (tmp_path / "a").symlink_to("..data/a")
    (tmp_path / "d").symlink_to("..data/d")
    return str(tmp_path)


def held_paths(holder: Holder) -> set[str]:
    """What the holder's descriptors are open on, by path (a link itself, not its target)."""
    fds = [
        fd
        for groups in holder._volumes.values()
        for names in groups.values()
        for fd in names.values()
    ]
    assert len(fds) == holder.held
    return {os.readlink(f"/proc/self/fd/{fd}") for fd in fds}


def test_a_name_is_held_once_and_a_version_is_let_go_of_whole(tmp_path: Path) -> None:
    root = volume(tmp_path)
    holder = Holder(100)
    holder.pin(root, ["..data", "a", "d", "..v1/a", "..v1/d/b", "..v10/a", "gone"])
    holder.pin(root, ["..data"])  # `..data` after a switch: held anew, not twice
    assert holder.held == 6
    assert held_paths(holder) == {
        f"{root}/{n}" for n in ("..data", "a", "d", "..v1/a", "..v1/d/b", "..v10/a")
    }

    holder.unpin(root, ["..v1/d"])  # a directory of a version, and what is below it
    assert held_paths(holder) == {f"{root}/{n}" for n in ("..data", "a", "d", "..v1/a", "..v10/a")}
    holder.pin(root, ["..v1/d/b"])
    holder.unpin(root, ["..v1"])  # not ..v10, whose name begins alike
    assert holder.held == 4
    assert held_paths(holder) == {f"{root}/{n}" for n in ("..data", "a", "d", "..v10/a")}

    holder.drop(root)
    assert holder.held == 0
    assert held_paths(holder) == set()


def test_a_link_is_held_itself_not_what_it_names(tmp_path: Path) -> None:
    root = volume(tmp_path)
    holder = Holder(10)
    holder.pin(root, ["a"])
    fd = holder._volumes[root]["a"]["a"]
    assert os.readlink(f"/proc/self/fd/{fd}") == f"{root}/a"
    assert os.readlink("", dir_fd=fd) == "..data/a"  # an O_PATH descriptor of the link
    holder.drop(root)


def test_the_holder_stops_at_its_bound_and_at_the_open_files_limit(tmp_path: Path) -> None:
    root = volume(tmp_path)
    holder = Holder(2)
    holder.pin(root, ["a", "d", "..data"])
    assert holder.held == 2
    holder.unpin(root, ["a"])
    holder.pin(root, ["..data"])  # room again
    assert holder.held == 2
    holder.drop(root)

    limited = subprocess.run(
        [
            sys.executable,
            "-c",
            "from fusevol.fuse.pin_helper import Holder; print(Holder(99).limit)",
        ],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100)),
        check=True,
        capture_output=True,
        text=True,
    )
    assert 0 < int(limited.stdout) <= 100 - 64  # what the process may open, less its own


def test_pins_are_applied_in_order_by_the_helper_process(tmp_path: Path) -> None:
    root = volume(tmp_path)
    pins = Pins(100)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(pins.run)
            pins.pin(root, ["..data", "a", "d", "..v1/a", "..v1/d/b"])
            pins.unpin(root, ["d"])
            await pins.released(root, ["..v1"])  # after the two before it
            assert pins.held == 2
            await pins.released(root)
            assert pins.held == 0
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_dead_holder_stops_pinning_and_keeps_no_one_waiting(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = volume(tmp_path)
    pins = Pins(100)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(pins.run)
            pins.pin(root, ["a"])
            await pins.released(root, [])
            assert pins.held == 1
            (holder,) = _holders()
            os.kill(holder, signal.SIGKILL)
            await pins.released(root)  # answered, though nobody could let go
            assert pins.held == 0
            pins.pin(root, ["a"])  # ignored from now on
            await pins.released(root)
            assert pins.held == 0
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert [r.getMessage().split(" error=")[0] for r in caplog.records] == [
        "pin holder failed, cold reads look names up again"
    ]
    caplog.clear()


def _holders() -> list[int]:
    """Our children that are pin holders."""
    with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children") as children:
        pids = [int(pid) for pid in children.read().split()]
    return [pid for pid in pids if b"pin_helper" in Path(f"/proc/{pid}/cmdline").read_bytes()]
