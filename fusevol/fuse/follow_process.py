"""The follow server's process (`fusevol.fuse.follow`): started, found and stopped. No pyfuse3.

One server per root, at `<root>/fusevol/follow`, holding an flock on `<root>/fusevol/follow.lock`
(its pid written in it). The agent starts it when a pod first needs a subPath view
(`ensure_running`); it runs in its own session, so it outlives agent restarts (a hand-over, a
crash and the launcher's takeover) and the views bound from it keep working through them. A clean
stop of the agent (SIGINT, `fusevol teardown`) unmounts the views and then stops it (`stop`); a
server left alone (no view bound and no agent on the root for a few seconds: `in_use`) unmounts
itself and exits, so nothing outlives a root that no agent serves any more.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING

from fusevol.base.errors import VolumeSetupError
from fusevol.base.fsutil import flock_held
from fusevol.mount import mountinfo
from fusevol.node import layout

if TYPE_CHECKING:
    from pathlib import Path

log = logging.getLogger(__name__)

FSTYPE_SUBTYPE = "fusevol-follow"
FSTYPE = f"fuse.{FSTYPE_SUBTYPE}"
"""The follow file system's type (and every view's) in mountinfo."""
START_TIMEOUT_S = 10.0


def mountpoint(root: Path) -> Path:
    return layout.agent_dir(root) / "follow"


def _resolved_mountpoint(root: Path) -> str:
    """`mountpoint(root)` as mountinfo lists it, resolved without a stat of the mount itself
    (a request to the follow server, which may be the caller, or hung)."""
    return os.path.join(os.path.realpath(layout.agent_dir(root)), "follow")


def _lock_path(root: Path) -> Path:
    return layout.agent_dir(root) / "follow.lock"


def take_lock(root: Path) -> int | None:
    """The server's lock (an open fd, pid written), or None if another server holds it."""
    fd = os.open(_lock_path(root), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def running_pid(root: Path) -> int | None:
    """The pid of the server that holds the lock, or None if none does."""
    try:
        st = os.stat(_lock_path(root))
        if not flock_held(st):
            return None
        text = _lock_path(root).read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def follow_mounts(root: Path) -> list[str]:
    """Mount points of the follow file system at or below `root` (the server's own and views)."""
    prefix = os.path.join(os.path.realpath(root), "")
    return [
        mp.path for mp in mountinfo.read() if mp.fstype == FSTYPE and mp.path.startswith(prefix)
    ]


def in_use(root: Path) -> bool:
    """A view of the server is bound below the root, or an agent runs on it."""
    own = _resolved_mountpoint(root)
    if any(path != own for path in follow_mounts(root)):
        return True
    try:
        return flock_held(os.stat(layout.agent_dir(root) / "lock"))
    except OSError:
        return False


def is_serving(root: Path) -> bool:
    return running_pid(root) is not None and _resolved_mountpoint(root) in follow_mounts(root)


def ensure_running(root: Path) -> None:
    """Start the root's follow server unless it serves already; wait until it is mounted.
    Blocking (up to `START_TIMEOUT_S`): call it from a worker thread."""
    if is_serving(root):
        return
    if running_pid(root) is None:
        own = _resolved_mountpoint(root)
        if own in follow_mounts(root):  # a dead server's mount: its views are stacked anew
            subprocess.run(["umount", "-l", own], check=False, capture_output=True)
        log_path = layout.agent_dir(root) / "follow.log"
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        with open(fd, "ab") as log_file:
            subprocess.Popen(
                [sys.executable, "-m", "fusevol.fuse.follow", "--root", str(root)],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                start_new_session=True,
                close_fds=True,
            )
        log.info("follow server started root=%s log=%s", root, log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not is_serving(root):
        if time.monotonic() > deadline:
            raise VolumeSetupError(
                f"the subPath follow server did not start in {START_TIMEOUT_S:g}s "
                f"(see {layout.agent_dir(root) / 'follow.log'})"
            )
        time.sleep(0.05)


def stop(root: Path, *, timeout_s: float = 5.0) -> None:
    """Stop the root's follow server (it unmounts itself); its views must be unmounted first.
    Blocking: call it from a worker thread."""
    pid = running_pid(root)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while running_pid(root) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
    for path in sorted(follow_mounts(root), key=len, reverse=True):
        subprocess.run(["umount", "-l", path], check=False, capture_output=True)
    with contextlib.suppress(OSError):
        os.rmdir(mountpoint(root))
