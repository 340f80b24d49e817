"""Small file-system helpers shared by the mount plugins, the served volumes and the CLI.

Imports nothing heavy: `fusevol run`'s launcher uses it before it forks the agent."""

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


def flock_held(st: os.stat_result, *, locks: str = "/proc/locks") -> bool:
    """Some process holds an flock on the file `st` describes, as /proc/locks shows it (never
    taking the lock, not even for a moment): `1: FLOCK  ADVISORY  WRITE 1234 fe:00:1565441 0 EOF`,
    device numbers in hex; a line with `->` is a waiter, not a holder."""
    wanted = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    with open(locks, encoding="ascii", errors="replace") as f:
        for line in f:
            fields = line.split()
            if len(fields) < 6 or fields[1] != "FLOCK":
                continue
            major, minor, inode = [*fields[5].split(":"), "", ""][:3]
            try:
                if (int(major, 16), int(minor, 16), int(inode)) == wanted:
                    return True
            except ValueError:
                continue
    return False
