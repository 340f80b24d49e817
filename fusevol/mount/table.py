"""The mount table as the agent knows it: read from /proc/self/mountinfo once, then kept up to
date by the agent's own mounts and unmounts.

Reading mountinfo costs time in proportion to the number of mounts (the kernel formats every
line), and a node with thousands of pods has thousands of binds: asking it before every bind and
unmount made the set-up of N volumes cost O(N²). The table answers `is_mount_point` and `top`
from a dict instead. It is read again (`load`) only when it cannot be right:
    (1) at the first question, and whenever a caller asks for the whole table (`LinuxMountBackend.
        mount_points`: reconstruction at start, the last sweep at stop);
    (2) when the source of a bind lies on a mount it does not know (the device the kernel gives
        for the source is not the one of the mount the table says holds it: the agent's FUSE
        mount, say, is made by pyfuse3, not through the backend);
    (3) when the kernel says the table was wrong (an unmount of what is not a mount point) or may
        have changed more than the operation itself (a lazy detach of a mount with submounts).
A bind is recorded as the kernel would list it: the device of the mount holding its source, the
source's path inside that mount as its root, on top of whatever was mounted at the target.

The table belongs to the trio thread: every call, `load` included, is made there (a load in a
worker thread would replace the table with a read that misses the binds recorded meanwhile; a
tear-down of 200 pods then found a bind missing from the table, skipped its unmount and failed
to remove its directory, EBUSY). The mount syscalls themselves run in worker threads; their
results are recorded when they return.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
from typing import TYPE_CHECKING

from fusevol.mount.mountinfo import PATH, MountPoint, parse_line

if TYPE_CHECKING:
    from collections.abc import Iterable


class MountTable:
    def __init__(self, mountinfo: str = PATH) -> None:
        self._mountinfo = mountinfo
        self._at: dict[str, tuple[MountPoint, ...]] = {}
        """Mount point path -> the mounts there, in mount order: a tuple, 48 bytes for the one
        mount of nearly every path where a list of one is 88, on thousands of volumes."""
        self._children: dict[int, int] = {}
        """Mount id -> how many mounts in the table have it as parent."""
        self._loaded = False
        self._parsed: dict[str, MountPoint] = {}
        """mountinfo lines seen at the last read: a line already parsed is not parsed again."""
        self._synthetic = itertools.count(-1, -1)
        """Ids of the mounts recorded from our own binds (the kernel's ids are not read back)."""
        self.loads = 0
        """How many times mountinfo was read (for tests and benchmarks)."""
        self._thread = threading.get_ident()
        """The thread that may use the table: the one that made it (the trio thread)."""

    def load(self) -> tuple[MountPoint, ...]:
        """Read mountinfo again; the table becomes what it says."""
        if threading.get_ident() != self._thread:
            raise RuntimeError("the mount table is used from another thread than its own")
        with open(self._mountinfo, encoding="utf-8", errors="surrogateescape") as f:
            lines = [line for line in f if line.strip()]
        previous = self._parsed
        self._parsed = {line: previous.get(line) or parse_line(line) for line in lines}
        self._replace(self._parsed.values())
        self.loads += 1
        return tuple(self._parsed.values())

    def mounts(self) -> tuple[MountPoint, ...]:
        """Every mount in the table (for tests: the table against a fresh read)."""
        self._ensure()
        return tuple(mp for stack in self._at.values() for mp in stack)

    def is_mount_point(self, path: str) -> bool:
        self._ensure()
        return path in self._at

    def depth(self, path: str) -> int:
        """How many mounts are stacked at `path`."""
        self._ensure()
        return len(self._at.get(path, ()))

    def top(self, path: str) -> MountPoint | None:
        """The mount that hides the others mounted at `path`: none of them is mounted on it."""
        self._ensure()
        stack = self._at.get(path)
        if not stack:
            return None
        if len(stack) == 1:
            return stack[0]
        covered = {mp.parent_id for mp in stack}
        return next((mp for mp in reversed(stack) if mp.mount_id not in covered), stack[-1])

    def holder(self, path: str) -> MountPoint | None:
        """The top mount of the deepest mount point at or above `path`."""
        return self._holder(path)

    def bound(self, source: str, target: str, *, read_only: bool, device: str) -> None:
        """Record a bind of `source` at `target`, as the kernel lists it; `device` is the
        source's `major:minor` (its stat, made before the bind)."""
        holder = self._holder(source)
        if holder is None or holder.device != device:  # a mount the table does not know: (2)
            self.load()
            return
        relative = os.path.relpath(source, holder.path)
        parent = self.top(target) or self._holder(os.path.dirname(target))
        self._add(
            MountPoint(
                mount_id=next(self._synthetic),
                parent_id=parent.mount_id if parent is not None else 0,
                device=holder.device,
                root=os.path.normpath(os.path.join(holder.root, relative)),
                path=sys.intern(target),  # the volume's path: one copy, its record's too
                options=("ro",) if read_only else ("rw",),
                fstype=holder.fstype,
                source=holder.source,
            )
        )

    def mounted(self) -> None:
        """A mount made by a helper (mount(8)): what it did is read back from the kernel."""
        self.load()

    def unmounted(self, path: str, *, detached: bool) -> None:
        """Record that the top mount at `path` is gone. A lazy detach of a mount that others are
        mounted on takes them too: the table is read again then."""
        top = self.top(path)
        if top is None:
            return
        if detached and self._children.get(top.mount_id):
            self.load()
            return
        stack = tuple(mp for mp in self._at[path] if mp is not top)
        if stack:
            self._at[path] = stack
        else:
            del self._at[path]
        self._uncount(top)

    def _ensure(self) -> None:
        if not self._loaded:
            self.load()

    def _holder(self, path: str) -> MountPoint | None:
        self._ensure()
        while True:
            top = self.top(path)
            if top is not None:
                return top
            parent = os.path.dirname(path)
            if parent == path:
                return None
            path = parent

    def _replace(self, mounts: Iterable[MountPoint]) -> None:
        at: dict[str, tuple[MountPoint, ...]] = {}
        children: dict[int, int] = {}
        for mp in mounts:
            _add(at, children, mp)
        self._at, self._children, self._loaded = at, children, True  # never seen half built

    def _add(self, mp: MountPoint) -> None:
        _add(self._at, self._children, mp)

    def _uncount(self, mp: MountPoint) -> None:
        left = self._children.get(mp.parent_id, 0) - 1
        if left > 0:
            self._children[mp.parent_id] = left
        else:
            self._children.pop(mp.parent_id, None)


def _add(at: dict[str, tuple[MountPoint, ...]], children: dict[int, int], mp: MountPoint) -> None:
    at[mp.path] = (*at.get(mp.path, ()), mp)
    children[mp.parent_id] = children.get(mp.parent_id, 0) + 1
