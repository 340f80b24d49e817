"""Watching a directory with inotify, as configmap-reload and friends do."""

from __future__ import annotations

import contextlib
import subprocess
import threading
from typing import IO, TYPE_CHECKING

from tests.agent import wait_for

if TYPE_CHECKING:
    from pathlib import Path


class Watcher:
    """`inotifywait -m` on a directory, as configmap-reload and friends do.

    Its events are read as they come: a watcher stopped as soon as the new content is readable
    may not have printed them yet (a loaded machine need not have scheduled it since)."""

    def __init__(self, directory: Path) -> None:
        self.process = subprocess.Popen(
            ["inotifywait", "-m", "--format", "%e %f", str(directory)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        assert self.process.stderr is not None
        for line in self.process.stderr:
            if "Watches established" in line:
                break
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._read, args=(self.process.stdout,))
        self._reader.start()

    def _read(self, stdout: IO[str]) -> None:
        for line in stdout:
            self._lines.append(line.rstrip("\n"))

    def events_until(self, last: str, timeout_s: float = 10.0) -> list[str]:
        """The events seen up to `last`; the whole list if `last` does not come in time."""
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: last in self._lines, timeout_s=timeout_s)
        return list(self._lines)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=5)
        self._reader.join(timeout=5)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
