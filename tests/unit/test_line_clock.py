"""`LineClock.settled`, which the containerd tests hold every edit to: it must fail when a reader
that looked after the deadline saw the old version, and only then."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from tests.containerd.runtime import LineClock

if TYPE_CHECKING:
    from pathlib import Path


def _stamp(at: float) -> str:
    """`at` (monotonic) as the container writes it: /proc/uptime's first field."""
    boot = at + time.clock_gettime(time.CLOCK_BOOTTIME) - time.monotonic()
    return f"{boot:.2f}"


def _clock(path: Path, lines: list[tuple[float, str]]) -> LineClock:
    path.write_text("".join(f"{_stamp(at)} {text}\n" for at, text in lines))
    return LineClock(path, stamped=True)


def test_a_reader_held_up_by_the_scheduler_is_not_a_late_change(tmp_path: Path) -> None:
    edited = time.monotonic() - 5
    # A round begun before the edit finished late with the old value; the next one, begun
    # 0.3 s after the edit, saw the new one, and every later one too.
    clock = _clock(
        tmp_path / "reads",
        [(edited - 0.1, "ok v1 v1"), (edited + 0.3, "ok v2 v2"), (edited + 1.5, "ok v2 v2")],
    )
    try:
        assert clock.settled("ok v2 v2", after=edited, within_s=1) == pytest.approx(
            edited + 0.3, abs=0.02
        )
    finally:
        clock.close()


def test_a_reader_that_looked_after_the_deadline_and_saw_the_old_version_fails(
    tmp_path: Path,
) -> None:
    edited = time.monotonic() - 5
    clock = _clock(
        tmp_path / "reads",
        [(edited + 0.5, "ok v1 v1"), (edited + 1.2, "ok v1 v1"), (edited + 1.3, "ok v2 v2")],
    )
    try:
        with pytest.raises(TimeoutError, match="still not 'ok v2 v2' 1s after the change"):
            clock.settled("ok v2 v2", after=edited, within_s=1)
    finally:
        clock.close()


def test_no_round_begun_after_the_deadline_is_a_failure_in_time(tmp_path: Path) -> None:
    edited = time.monotonic()
    clock = _clock(tmp_path / "reads", [(edited + 0.1, "ok v2 v2")])
    try:
        with pytest.raises(TimeoutError, match="no line begun"):
            clock.settled("ok v2 v2", after=edited, within_s=1, patience_s=1.5)
    finally:
        clock.close()
