"""Small file-system helpers shared by the mount plugins and the served volumes."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path


def mkdir_all(path: Path, mode: int) -> None:
    """Go's `os.MkdirAll(path, mode)`: every directory it creates gets `mode` (less the umask),
    intermediate ones included (Python's `os.makedirs` applies `mode` to the last one only)."""
    missing = []
    current = path
    while not os.path.isdir(current):
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise
