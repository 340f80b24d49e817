"""Small file-system helpers shared by the mount plugins, the served volumes and the CLI.

Imports nothing heavy: `fusevol run`'s launcher uses it before it forks the agent."""

from __future__ import annotations

import contextlib
import os
import random
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path


def replace_file(path: Path, data: bytes, *, mode: int = 0o600, fsync: bool = False) -> None:
    """Write `data` to `path` atomically: a temporary file beside it (`write_aside`), then a
    rename over `path`; a reader sees the old file or the new one, never part of either. With
    `fsync` the data is on disk before the rename (state that must survive a crash of the node,
    not only of the agent). Creates `path`'s directory if missing.

    Each call has a temporary file of its own, so that writers at once (threads, or two
    generations of the agent) never take each other's: the last rename wins. Which state that is
    is the callers' to order (`fusevol.csi.node` has one writer at a time).

    Four system calls when the directory exists (open, write, close, rename)."""
    tmp = write_aside(path, data, mode=mode, fsync=fsync)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def write_aside(path: Path, data: bytes, *, mode: int = 0o600, fsync: bool = False) -> Path:
    """`data` in a new file beside `path`, `.<name>.<random>.tmp` (created with `mode`, less the
    umask; `path`'s directory made if missing, mode 0700): what `replace_file` renames over
    `path`, or its caller later (`fusevol.csi.state.stage`). Removed again if it cannot be
    written whole."""
    tmp = path.with_name(f".{path.name}.{random.getrandbits(64):016x}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, mode)
    except FileNotFoundError:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(tmp, flags, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    return tmp


def unlink_if_same(path: str | os.PathLike[str], inode: int) -> None:
    """Remove `path` if it is still the file `inode` (a socket we bound there), not one a
    successor has put there since; no-op if it is gone."""
    with contextlib.suppress(FileNotFoundError):
        if os.lstat(path).st_ino == inode:
            os.unlink(path)


def mkdir_all(path: str | os.PathLike[str], mode: int) -> list[str]:
    """Go's `os.MkdirAll(path, mode)`: every directory it creates gets `mode` (less the umask),
    intermediate ones included (Python's `os.makedirs` applies `mode` to the last one only).

    In as few system calls as it can: mkdir from the leaf up until one is made or exists, then
    the missing ones down again; one mkdir(2) when the parent exists. Binds run it in batches of
    thousands, in a worker thread whose every Python step may wait for the GIL.

    Returns the directories it made, the uppermost first."""
    current = os.fspath(path)
    missing = []
    made: list[str] = []
    while True:
        try:
            os.mkdir(current, mode)
            made.append(current)
            break
        except FileNotFoundError:
            missing.append(current)
            parent = os.path.dirname(current)
            if parent == current:
                raise
            current = parent
        except FileExistsError:
            if not os.path.isdir(current):
                raise
            break
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode)
            made.append(directory)
        except FileExistsError:  # made meanwhile by someone else
            if not os.path.isdir(directory):
                raise
    return made


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
