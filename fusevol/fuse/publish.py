"""Make a new version of a volume visible the way kubelet's AtomicWriter does.

The new version is built in memory (`Tree.build_version`), then switched in by real VFS operations
on the agent's own mount, from a worker thread: mkdir of the version directory, symlink
`..data_tmp`, rename onto `..data`, symlinks for new top-level names, unlink of vanished ones, and,
after a grace period, rmdir of the old version. The kernel thus updates its caches itself, and
inotify watchers on the volume directory (or on any bind mount of it) see exactly kubelet's events:
CREATE `..data_tmp`, MOVED_FROM/MOVED_TO `..data`, DELETE of the old version (FUSE.md fact 2).
No file is ever rewritten, and no notify call is needed.

These operations must never run on the trio thread: the trio thread is the one that answers them.

The old version stays for `grace_s` after the switch, so a reader that resolved `..data` just before
the switch still finds its files (FUSE.md fact 6); kubelet deletes it at once, which its tmpfs can
afford because unlinked dentries stay valid for those who hold them.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from pathlib import Path

    from fusevol.fuse.tree import Node, Tree
    from fusevol.model import Payload

DATA = b"..data"
DATA_TMP = b"..data_tmp"


@dataclass(frozen=True, slots=True)
class Version:
    name: bytes
    """The version directory's name, `..<UTC timestamp>.<random>`."""
    payload: Payload
    gid: int | None
    dir_mode: int


@dataclass(frozen=True, slots=True)
class PublisherStatistics:
    volumes: int
    publishes: int
    pending_removals: int


class Publisher:
    def __init__(self, tree: Tree, *, mountpoint: Path, grace_s: float) -> None:
        self._tree = tree
        self._mountpoint = mountpoint
        self._grace_s = grace_s
        self._versions: dict[bytes, Version | None] = {}
        self._publishes = 0
        self._pending_removals = 0
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the delayed removals of old versions until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def path(self, volume: bytes) -> Path:
        """Where the volume's subtree is on the agent's mount (the source of its bind mounts)."""
        return self._mountpoint / os.fsdecode(volume)

    def current(self, volume: bytes) -> Version | None:
        return self._versions.get(volume)

    def has_volume(self, volume: bytes) -> bool:
        return volume in self._versions

    def volumes(self) -> tuple[bytes, ...]:
        return tuple(self._versions)

    async def create_volume(
        self,
        volume: bytes,
        *,
        mode: int,
        gid: int = 0,
        nested: tuple[str, ...] = (),
        nested_mode: int = 0o755,
    ) -> None:
        """Create the volume directory, empty but for the `nested` mountpoint directories (kept
        across versions: KUBELET.md A1). No-op if it exists."""
        if volume in self._versions:
            return
        root = self._tree.new_dir(mode=mode, gid=gid)
        for name in nested:
            self._tree.link(root, name.encode(), self._tree.new_dir(mode=nested_mode, gid=gid))
        self._tree.stage(self._tree.root, volume, root)
        try:
            await trio.to_thread.run_sync(os.mkdir, self.path(volume))
        finally:
            self._tree.unstage(self._tree.root, volume)
        self._versions[volume] = None

    async def remove_volume(self, volume: bytes) -> None:
        """Remove the volume directory and every version in it. No-op if it does not exist."""
        if (
            self._versions.pop(volume, None) is None
            and self._tree.child(self._tree.root, volume) is None
        ):
            return
        with contextlib.suppress(FileNotFoundError):
            await trio.to_thread.run_sync(os.rmdir, self.path(volume))

    async def publish(
        self, volume: bytes, payload: Payload, *, gid: int | None = None, dir_mode: int = 0o755
    ) -> bool:
        """Make `payload` the volume's content. Returns False if it already was.

        The steps carry AtomicWriter's numbers (pkg/volume/util/atomic_writer.go, `Write`):
        (1) the payload was validated by its builder (`fusevol.projection`);
        (2) the current version is known here, not read back;
        (3) top-level names of the old version that the new one lacks are to be removed;
        (4) an unchanged payload (content *and* modes: kubelet ignores mode-only changes, we do
            not) skips to (10);
        (5) the version directory is built in memory and staged;
        (6)-(9) mkdir it, symlink `..data_tmp` to it, rename `..data_tmp` onto `..data`;
        (10) create the missing top-level symlinks `name -> ..data/name`, after the switch;
        (11) unlink the top-level names of (3);
        (12) remove the old version, after the grace period.
        """
        root = self.path(volume)
        volume_dir = self._tree.child(self._tree.root, volume)
        assert volume_dir is not None, f"volume {volume!r} was not created"
        old = self._versions[volume]
        new_names = _top_level(payload)
        missing = {n for n in new_names if self._tree.child(volume_dir, n) is None}
        removed = (_top_level(old.payload) - new_names) if old else set()  # (3)
        if old is not None and (old.payload, old.gid, old.dir_mode) == (
            payload,
            gid,
            dir_mode,
        ):  # (4)
            if missing:
                await trio.to_thread.run_sync(_create_links, root, missing)  # (10)
            return False

        name = self._unused_name(volume_dir)
        version = self._tree.build_version(payload, dir_mode=dir_mode, gid=gid)
        self._tree.stage(volume_dir, name, version)  # (5)
        try:
            await trio.to_thread.run_sync(_switch, root, name, missing, removed)  # (6)-(11)
        finally:
            self._tree.unstage(volume_dir, name)
        self._versions[volume] = Version(name, payload, gid, dir_mode)
        self._publishes += 1
        if old is not None:  # (12)
            self._remove_later(root / os.fsdecode(old.name))
        return True

    def statistics(self) -> PublisherStatistics:
        return PublisherStatistics(len(self._versions), self._publishes, self._pending_removals)

    def _unused_name(self, volume_dir: Node) -> bytes:
        stamp = time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime()).encode()
        while True:
            name = stamp + str(random.getrandbits(32)).encode()
            if self._tree.child(volume_dir, name) is None:
                return name

    def _remove_later(self, path: Path) -> None:
        assert self._nursery is not None, "Publisher.run() is not running"
        self._pending_removals += 1
        self._nursery.start_soon(self._remove_after_grace, path)

    async def _remove_after_grace(self, path: Path) -> None:
        try:
            await trio.sleep(self._grace_s)
            with contextlib.suppress(FileNotFoundError):
                await trio.to_thread.run_sync(os.rmdir, path)
        finally:
            self._pending_removals -= 1


def _top_level(payload: Payload) -> set[bytes]:
    return {path.split("/", 1)[0].encode() for path in payload}


def _switch(root: Path, name: bytes, missing: set[bytes], removed: set[bytes]) -> None:
    """(6)-(11) of `Publisher.publish`, as VFS operations; runs in a worker thread."""
    version = root / os.fsdecode(name)
    tmp = root / os.fsdecode(DATA_TMP)
    os.mkdir(version)  # (6) the staged content appears whole
    try:
        os.symlink(os.fsdecode(name), tmp)  # (8)
        os.rename(tmp, root / os.fsdecode(DATA))  # (9)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        with contextlib.suppress(OSError):
            os.rmdir(version)
        raise
    _create_links(root, missing)  # (10)
    for entry in removed:  # (11)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(root / os.fsdecode(entry))


def _create_links(root: Path, names: set[bytes]) -> None:
    for entry in names:
        with contextlib.suppress(FileExistsError):
            os.symlink(os.fsdecode(DATA + b"/" + entry), root / os.fsdecode(entry))
