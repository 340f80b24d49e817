"""The processes of fusevol's two side file systems, each a FUSE server of its own: started, found
and stopped. No pyfuse3.

    FOLLOW   `fusevol.fuse.follow`: subPath views that follow a volume's current version
    AUDIT    `fusevol.fuse.audit`: the audited volumes, every open of their files recorded

One server of each per root, at `<root>/fusevol/<name>`, holding an flock on
`<root>/fusevol/<name>.lock` (its pid written in it), its log in `<root>/fusevol/<name>.log`.
The agent starts one when a pod first needs it (`ensure_running`); it runs in its own session, so
it outlives agent restarts (a hand-over, a crash and the launcher's takeover) and the binds made
from it keep working through them. A clean stop of the agent (SIGINT, `fusevol teardown`)
unmounts the binds and then stops it (`stop`); a server left alone (nothing of it bound and no
agent on the root for a few seconds: `in_use`) unmounts itself and exits, so nothing outlives a
root that no agent serves any more. Where another supervisor runs the server (the chart's audit
DaemonSet), `ensure_running(start=False)` only waits for it.
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
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fusevol.base.errors import VolumeSetupError
from fusevol.base.fsutil import flock_held
from fusevol.mount import mountinfo
from fusevol.node import layout

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

log = logging.getLogger(__name__)

START_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class SideServer:
    name: str
    """Its mountpoint's, lock's and log's name below `<root>/fusevol/`."""
    module: str
    """What `python -m` runs (`--root ROOT` and `extra_args` follow)."""

    @property
    def subtype(self) -> str:
        return f"fusevol-{self.name}"

    @property
    def fstype(self) -> str:
        """The file system's type in mountinfo, its own mount's and every bind's of it."""
        return f"fuse.{self.subtype}"

    def mountpoint(self, root: Path) -> Path:
        return layout.agent_dir(root) / self.name

    def log_path(self, root: Path) -> Path:
        return layout.agent_dir(root) / f"{self.name}.log"

    def _resolved_mountpoint(self, root: Path) -> str:
        """`mountpoint(root)` as mountinfo lists it, resolved without a stat of the mount itself
        (a request to the server, which may be the caller, or hung)."""
        return os.path.join(os.path.realpath(layout.agent_dir(root)), self.name)

    def _lock_path(self, root: Path) -> Path:
        return layout.agent_dir(root) / f"{self.name}.lock"

    def take_lock(self, root: Path, *, wait: bool = False) -> int | None:
        """The server's lock (an open fd, pid written), or None if another server holds it;
        with `wait`, once the other has let it go."""
        fd = os.open(self._lock_path(root), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return fd

    def running_pid(self, root: Path) -> int | None:
        """The pid of the server that holds the lock, or None if none does."""
        try:
            st = os.stat(self._lock_path(root))
            if not flock_held(st):
                return None
            text = self._lock_path(root).read_text(encoding="ascii", errors="replace").strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def mounts(self, root: Path) -> list[str]:
        """Mount points of the file system at or below `root` (the server's own and binds)."""
        prefix = os.path.join(os.path.realpath(root), "")
        return [
            mp.path
            for mp in mountinfo.read()
            if mp.fstype == self.fstype and mp.path.startswith(prefix)
        ]

    def in_use(self, root: Path) -> bool:
        """A bind of the server is below the root, or an agent runs on it."""
        own = self._resolved_mountpoint(root)
        if any(path != own for path in self.mounts(root)):
            return True
        try:
            return flock_held(os.stat(layout.agent_dir(root) / "lock"))
        except OSError:
            return False

    def is_serving(self, root: Path) -> bool:
        return self.running_pid(root) is not None and self._resolved_mountpoint(
            root
        ) in self.mounts(root)

    def ensure_running(
        self, root: Path, *, extra_args: Sequence[str] = (), start: bool = True
    ) -> None:
        """Start the root's server unless it serves already (with `start` False, only wait for
        one that another supervisor starts); wait until it is mounted. Blocking (up to
        `START_TIMEOUT_S`): call it from a worker thread."""
        if self.is_serving(root):
            return
        if start and self.running_pid(root) is None:
            own = self._resolved_mountpoint(root)
            if own in self.mounts(root):  # a dead server's mount: its binds are stacked anew
                subprocess.run(["umount", "-l", own], check=False, capture_output=True)
            log_path = self.log_path(root)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
            with open(os.open(log_path, flags, 0o600), "ab") as log_file:
                subprocess.Popen(
                    [sys.executable, "-m", self.module, "--root", str(root), *extra_args],
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=log_file,
                    start_new_session=True,
                    close_fds=True,
                )
            log.info("%s server started root=%s log=%s", self.name, root, log_path)
        deadline = time.monotonic() + START_TIMEOUT_S
        serving = self.is_serving if start else self._answers
        while not serving(root):
            if time.monotonic() > deadline:
                started = f"see {self.log_path(root)}" if start else "started by its supervisor"
                raise VolumeSetupError(
                    f"the {self.name} server did not start in {START_TIMEOUT_S:g}s ({started})"
                )
            time.sleep(0.05)

    def _answers(self, root: Path) -> bool:
        """Mounted, and its server answers: another supervisor's server, whose lock may be held
        from another PID namespace, which /proc/locks does not show (the chart's audit pods
        run in the host's, the agent in its own)."""
        if self._resolved_mountpoint(root) not in self.mounts(root):
            return False
        try:
            os.statvfs(self.mountpoint(root))
        except OSError:
            return False  # ENOTCONN: a server that died
        return True

    def stop(self, root: Path, *, timeout_s: float = 5.0) -> None:
        """Stop the root's server (it unmounts itself); its binds must be unmounted first.
        Blocking: call it from a worker thread."""
        pid = self.running_pid(root)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while self.running_pid(root) is not None and time.monotonic() < deadline:
                time.sleep(0.05)
        for path in sorted(self.mounts(root), key=len, reverse=True):
            subprocess.run(["umount", "-l", path], check=False, capture_output=True)
        with contextlib.suppress(OSError):
            os.rmdir(self.mountpoint(root))


FOLLOW = SideServer("follow", "fusevol.fuse.follow")
AUDIT = SideServer("audit", "fusevol.fuse.audit")
SERVERS = (FOLLOW, AUDIT)
