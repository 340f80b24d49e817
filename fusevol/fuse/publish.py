"""Make a new version of a volume visible the way kubelet's AtomicWriter does.

The new version is built in memory (`Tree.build_version`), then switched in by real VFS operations
on the agent's own mount, made by a helper process (`fusevol.fuse.vfs_helper`, which says why not a
thread of the agent): mkdir of the version directory, symlink
`..data_tmp`, rename onto `..data`, symlinks for new top-level names, unlink of vanished ones, and,
after a grace period, rmdir of the old version. The kernel thus updates its caches itself, and
inotify watchers on the volume directory (or on any bind mount of it) see exactly kubelet's events:
CREATE `..data_tmp`, MOVED_FROM/MOVED_TO `..data`, DELETE of the old version (docs/fuse.md fact 2).
No file is ever rewritten. A new volume's first version needs none of this: its directory
appears whole, with no request at all (`_create`).

Warm before visible (docs/fuse.md fact 15): before `..data` names a new version, and before a
new volume is bound anywhere (a CSI volume: before kubelet can start a container, `warm_later`),
the kernel is given all its first reads would ask for: the helper lists the version (entries and
attributes) and reads its links back (targets), and the files' contents go to the page cache
(`store_pages`). The first read of any key is then a hot one.

These operations must never run on the trio thread: the trio thread is the one that answers them.
Only the helpers may perform them (`is_publisher`, checked by `fusevol.fuse.ops`): a helper's
pid, or, from a PID namespace the connection cannot see, root with the helpers' group.

Pinned (docs/fuse.md fact 17): once a version is visible, the pin holder keeps the kernel's
entries of its names (`Pins`), as a tmpfs keeps its own, so a read after the kernel dropped its
caches costs one request, not three. The old version's are let go before it is removed.

The old version stays for `grace_s` after the switch, so a reader that resolved `..data` just before
the switch still finds its files (docs/fuse.md fact 6); kubelet deletes it at once, which its tmpfs
can afford because unlinked dentries stay valid for those who hold them.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import trio

from fusevol.base.helper_parent import HelperProcess
from fusevol.fuse.building import names
from fusevol.fuse.nodes import symlink_gid, walk
from fusevol.fuse.pins import Pins
from fusevol.fuse.vfs_helper import PUBLISHER_GID

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from fusevol.fuse.nodes import Node
    from fusevol.fuse.tree import Tree
    from fusevol.model import Payload

log = logging.getLogger(__name__)

DATA = b"..data"
DATA_TMP = b"..data_tmp"


@dataclass(frozen=True, slots=True)
class VolumeDir:
    """A volume's own directory, which stays across its versions."""

    mode: int
    gid: int = 0
    nested: tuple[str, ...] = ()
    """Mountpoint directories of the volumes mounted below this one (docs/kubelet.md fact 1)."""
    nested_mode: int = 0o755


HELPERS = 2
"""Helper processes: publishes of different volumes run concurrently, each op takes ~1 ms."""
_LOOKED_UP = 3
"""A version of this many files at most, all at its top, has them looked up one by one (a
request each) instead of listed (four requests a directory)."""
WARM_FILES = 1000
WARM_DIRECTORIES = 100
WARM_BYTES = 16 << 20
"""A version is warmed (`_warm`) up to these: beyond, its first reads ask the agent, as before,
and a tenant's 50,000 keys cost no listing of them before the switch."""
PIN_NAMES = 10_000
"""A volume of more names than this (its links, `..data` and its version's files) is not pinned
(`Pins`): a tenant's 50,000 keys take none of the node's bound."""
_TURN = 256
"""Top-level links made or removed in one helper call (`_in_turns`): some 50 ms."""


@dataclass(frozen=True, slots=True)
class PublisherStatistics:
    volumes: int
    publishes: int
    pending_removals: int
    warming: int
    """New volumes warmed after `publish` returned (`warm_later`), not done yet."""
    pinned: int
    """Names whose kernel entries the pin holder keeps (`Pins`)."""


class Publisher:
    def __init__(
        self,
        tree: Tree,
        *,
        mountpoint: Path,
        grace_s: float,
        store_pages: Callable[[list[tuple[int, bytes]]], int] | None = None,
        pins: Pins | None = None,
    ) -> None:
        """`store_pages`: puts files' content in the kernel's page cache (blocking; run on a
        worker thread): with it, versions are warmed before they are visible (`_warm`).
        `pins`: keeps the kernel's entries of visible versions (none without)."""
        self._tree = tree
        self._pins = pins or Pins(0)
        self._store_pages = store_pages
        self._warms: list[_Waiting] = []
        self._warming = trio.Lock()
        self._mountpoint = mountpoint
        self._grace_s = grace_s
        self._publishes = 0
        self._pending_removals = 0
        self._warming_later = 0
        self._nursery: trio.Nursery | None = None
        self._idle: list[HelperProcess] = []
        self._helpers: dict[int, HelperProcess] = {}
        self._available = trio.Semaphore(HELPERS)
        self._leftovers: list[tuple[str, Path]] = []
        self._last_name = b"-"
        self._routes: dict[bytes, Path] = {}
        self._removing: set[bytes] = set()
        """Volumes whose pins are let go of, or gone, before their directory is removed: none
        may be pinned again (a CSI volume's warming ends meanwhile)."""

    def adopt(self) -> None:
        """Take the volumes of a restored tree (a predecessor's, `fusevol.fuse.snapshot`) as
        published here: the current version of each is the one `..data` names. What a publish cut
        short left behind (versions `..data` does not name, a `..data_tmp`) is removed once `run`
        has started, after the grace period."""
        for name, directory in (self._tree.root.children or {}).items():
            current = self._current(directory)
            for entry, node in (directory.children or {}).items():
                if entry == DATA_TMP:
                    self._leftovers.append(("unlink", self.path(name) / os.fsdecode(entry)))
                elif node.is_dir and entry.startswith(b"..") and entry != current:
                    self._leftovers.append(("rmdir", self.path(name) / os.fsdecode(entry)))

    def _current(self, directory: Node) -> bytes | None:
        """The name of the version directory a volume's `..data` names, if it is one. The tree
        is the one record of what each volume holds: a copy of every payload beside it was some
        400 bytes a volume, on thousands of volumes."""
        data = self._tree.child(directory, DATA)
        current = None if data is None else self._tree.child(directory, data.target)
        return data.target if data is not None and current is not None and current.is_dir else None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the helper processes, host the delayed removals of old versions until cancelled,
        then stop the helpers: from then on nobody may change the mount."""
        try:
            for _ in range(HELPERS):
                self._idle.append(self._spawn())
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(self._pins.run)
                for op, path in self._leftovers:
                    self._remove_later(path, op)
                self._leftovers.clear()
                for volume in self._tree.root.children or ():  # adopted: a predecessor's
                    self._pin(volume)
                task_status.started()
                await trio.sleep_forever()
        finally:
            for helper in list(self._helpers.values()):
                self._discard(helper)

    def is_publisher(self, pid: int, uid: int, gid: int) -> bool:
        """True if a FUSE request's sender is one of the publisher's helper processes: its pid, or
        root with the helpers' own group, `PUBLISHER_GID` (only root may take it, and only root
        reaches this mount). The kernel gives a sender's pid as the connection's mounter sees
        it: after a takeover by an agent in another PID namespace (another pod) that is another
        number than ours, or 0 where the mounter cannot see the sender at all."""
        return (pid > 0 and pid in self._helpers) or (uid == 0 and gid == PUBLISHER_GID)

    def current_version(self, volume: bytes) -> bytes | None:
        """The name of the version directory the volume's `..data` names (None: no volume)."""
        directory = self._tree.child(self._tree.root, volume)
        return None if directory is None else self._current(directory)

    def route(self, volume: bytes, through: Path) -> None:
        """Make the VFS operations on `volume` through `through`, until it is removed: an audited
        volume's go through the audit file system, which passes them on to the agent's mount, so
        that the kernel updates its caches and inotify watchers of the audited volume see
        kubelet's events (`fusevol.fuse.audit`). Its pins, if a predecessor's volume was
        pinned as it was taken over, are let go of: its readers go through the audit file
        system's own entries."""
        self._routes[volume] = through
        self._pins.unpin(str(self.path(volume)))

    def routed(self, volume: bytes) -> bool:
        return volume in self._routes

    def _through(self, volume: bytes) -> Path:
        """Where the VFS operations on `volume` are made (`route`)."""
        return self._routes.get(volume) or self.path(volume)

    def path(self, volume: bytes) -> Path:
        """Where the volume's subtree is on the agent's mount (the source of its bind mounts)."""
        return self._mountpoint / os.fsdecode(volume)

    async def remove_volume(self, volume: bytes) -> None:
        """Remove the volume directory and every version in it, and its route (`route`). No-op
        if it does not exist."""
        through = self._through(volume)
        self._routes.pop(volume, None)
        if self._tree.child(self._tree.root, volume) is None:
            return
        self._removing.add(volume)
        try:
            await self._pins.released(str(self.path(volume)))  # else the kernel keeps its nodes
            await self._vfs("rmdir", through)
        except FileNotFoundError:
            if self._tree.child(self._tree.root, volume) is not None:
                # The kernel says the name is not there while our tree holds it: should never
                # be. Say so; a later publish of the volume takes the directory as it finds it.
                log.warning(
                    "volume directory not found through the mount path=%s", self.path(volume)
                )
        finally:
            self._removing.discard(volume)

    async def publish(
        self,
        volume: bytes,
        payload: Payload,
        *,
        gid: int | None = None,
        dir_mode: int = 0o755,
        new: VolumeDir | None = None,
        warm_later: bool = False,
    ) -> bool:
        """Make `payload` the volume's content. Returns False if it already was.

        A volume that does not exist yet is made as `new` says, with `payload` as its first
        version, and appears whole (`_create`); it is warmed before this returns, or with
        `warm_later` meanwhile, after (a CSI volume: kubelet is answered once it is bound, and
        starts no container before every volume of the pod is set up and its sandbox made).
        For an existing one, the steps carry AtomicWriter's numbers
        (pkg/volume/util/atomic_writer.go, `Write`):
        (1) the payload was validated by its builder (`fusevol.projection`);
        (2) the current version is read from the tree (`..data` names it), not from the mount;
        (3) top-level names of the old version that the new one lacks are to be removed;
        (4) an unchanged payload (content *and* modes: kubelet ignores mode-only changes, we do
            not) skips to (10);
        (5) the version directory is built in memory and staged;
        (6)-(9) mkdir it, symlink `..data_tmp` to it, rename `..data_tmp` onto `..data`;
        (10) create the missing top-level symlinks `name -> ..data/name`, after the switch;
        (11) unlink the top-level names of (3);
        (12) remove the old version, after the grace period.
        (10) and (11) go with (6)-(9) in one helper call, or beyond `_TURN` names in turns of
        their own (`_in_turns`).
        """
        volume_dir = self._tree.child(self._tree.root, volume)
        if volume_dir is None:
            assert new is not None, f"volume {volume!r} does not exist"
            name, version = self._create(volume, payload, gid, dir_mode, new)
            pages = self._pages(version)
            if pages is not None:
                top = [os.fsdecode(n) for n in sorted(_top_level(payload))]
                look_up = _looked_up(version)
                through = str(self._through(volume))
                warming = [through, os.fsdecode(name), top, look_up]
                if warm_later:
                    assert self._nursery is not None, "Publisher.run() is not running"
                    self._warming_later += 1
                    self._nursery.start_soon(self._warm_meanwhile, volume, warming, pages)
                    return True
                await self._warm(warming, pages)
            self._pin(volume, listed=pages is None)
            return True
        root = self._through(volume)
        old = self._current(volume_dir)
        current = None if old is None else self._tree.child(volume_dir, old)
        new_names = _top_level(payload)
        missing = {n for n in new_names if self._tree.child(volume_dir, n) is None}
        removed = set(current.children or ()) - new_names if current is not None else set()  # (3)
        links = [os.fsdecode(n) for n in sorted(missing)]
        if current is not None and _holds(current, payload, gid, dir_mode):  # (4)
            await self._in_turns("links", root, links)  # (10)
            if links:
                self._pin(volume)
            return False

        name = self._unused_name(volume_dir)
        version = self._tree.build_version(payload, dir_mode=dir_mode, gid=gid)
        self._tree.stage(volume_dir, name, version)  # (5)
        unlinks = [os.fsdecode(n) for n in sorted(removed)]
        alone = len(links) + len(unlinks) <= _TURN
        first = (links if alone else links[:_TURN], unlinks if alone else [])
        try:
            pages = self._pages(version)
            if pages is None:
                await self._vfs("switch", root, os.fsdecode(name), *first)  # (6)-(9), (10), (11)
            else:
                stage = ("stage", root, os.fsdecode(name), _looked_up(version))
                await self._vfs(*stage)  # (6)-(8), caches warmed
                await self._store(pages)
                await self._vfs("commit", root, os.fsdecode(name), *first)  # (9), (10), (11)
        finally:
            self._tree.unstage(volume_dir, name)
        if not alone:
            await self._in_turns("links", root, links[_TURN:])  # (10)
            await self._in_turns("unlinks", root, unlinks)  # (11)
        self._pin(volume, listed=pages is None)
        self._pins.unpin(str(self.path(volume)), unlinks)
        self._publishes += 1
        if old is not None:  # (12)
            pinned = (str(self.path(volume)), os.fsdecode(old))
            self._remove_later(root / os.fsdecode(old), "retire", pinned=pinned)
        return True

    def _create(
        self, volume: bytes, payload: Payload, gid: int | None, dir_mode: int, new: VolumeDir
    ) -> tuple[bytes, Node]:
        """Build the volume's directory in memory as the steps of `publish` would leave it (the
        nested mountpoints, the version, `..data` and the top-level links) and attach it without
        a VFS operation: the kernel holds nothing under a name that does not exist yet, not even
        a negative entry (docs/fuse.md fact 14), so its next lookup finds the whole directory.
        No request and no helper round trip, where the steps of `publish` cost a dozen of each.
        Nobody can watch inside a directory that does not exist yet; the next version is
        switched in by the VFS operations of `publish`, with kubelet's events
        (docs/fuse.md fact 2)."""
        tree, now = self._tree, self._tree.now_ns()
        root = tree.new_dir(mode=new.mode, gid=new.gid, mtime_ns=now)
        for nested in new.nested:
            mountpoint = tree.new_dir(mode=new.nested_mode, gid=new.gid, mtime_ns=now)
            tree.link(root, nested.encode(), mountpoint)
        name = self._unused_name(root)
        version = tree.build_version(payload, dir_mode=dir_mode, gid=gid, mtime_ns=now)
        tree.link(root, name, version)
        link_gid = symlink_gid(root)
        tree.link(root, DATA, tree.new_symlink(name, gid=link_gid, mtime_ns=now))
        for top in sorted(_top_level(payload)):
            if tree.child(root, top) is None:
                link = tree.new_symlink(_link_target(top), gid=link_gid, mtime_ns=now)
                tree.link(root, top, link)
        tree.add(tree.root, volume, root)
        self._publishes += 1
        return name, version

    def _pages(self, version: Node) -> list[tuple[int, bytes]] | None:
        """What `_store` puts in the kernel's page cache for `version`: each file's inode and
        content; None if versions are not warmed here, or `version` is past the `WARM_*` bounds.

        Warm before visible: the helper's listing gives the kernel every entry and attribute
        of the version, its reading of the links their targets, and `_store` the files' pages,
        before `..data` names the version (or, for a new volume, before it is bound anywhere;
        a CSI volume's meanwhile, `publish`'s `warm_later`).
        The first read of any key then asks the agent nothing, as a hot one. The pages are the
        page cache's, which the kernel may reclaim (as it may not a tmpfs's): at most what
        kubelet's tmpfs copy of the volume holds, once however many pods share the version."""
        if self._store_pages is None:
            return None
        pages, directories, size = [], 0, 0
        for node in walk(version):
            if node.is_dir:
                directories += 1
            elif node.data:
                pages.append((node.inode, node.data))
                size += len(node.data)
            if len(pages) > WARM_FILES or directories > WARM_DIRECTORIES or size > WARM_BYTES:
                return None
        return pages

    async def _warm(self, volume: list[Any], pages: list[tuple[int, bytes]]) -> None:
        """Warm a new volume (`vfs_helper.warm`), with the others that wait meanwhile: the volumes
        of a pod set up together (a pod with 100 volumes) take a helper call or two, not one
        each. The first caller sends what is pending; while it runs, the next ones queue behind
        it, and the first of them sends all of theirs."""
        waiting = _Waiting(volume, pages)
        self._warms.append(waiting)
        async with self._warming:
            if waiting.done:
                return
            batch, self._warms = self._warms, []
            try:
                await self._vfs("warm", [each.volume for each in batch])
                await self._store([page for each in batch for page in each.pages])
            finally:
                for each in batch:
                    each.done = True

    async def _warm_meanwhile(
        self, volume: bytes, warming: list[Any], pages: list[tuple[int, bytes]]
    ) -> None:
        """`_warm`, for a caller that did not wait (`publish`'s `warm_later`): a helper that
        died leaves the volume cold (its first reads ask the agent), and nothing else."""
        warmed = False
        try:
            await self._warm(warming, pages)
            warmed = True
        except Exception as exc:
            log.warning("new volume not warmed, its first reads ask the agent error=%s", exc)
        finally:
            self._warming_later -= 1
        self._pin(volume, listed=not warmed)

    def _pin(self, volume: bytes, *, listed: bool = False) -> None:
        """Have the pin holder keep the volume's `..data`, its top-level links and its current
        version's files, all of them anew (a name held already costs no request), or, past
        `PIN_NAMES`, none; `listed`: the version was not warmed (`Pins.pin`). An audited volume
        is not pinned: its readers go through the audit file system's own entries."""
        directory = self._tree.child(self._tree.root, volume)
        if directory is None or volume in self._routes or volume in self._removing:
            return
        version = self._current(directory)
        node = None if version is None else self._tree.child(directory, version)
        if node is None or version is None or directory.children is None:
            return
        root = str(self.path(volume))
        if len(directory.children) <= PIN_NAMES:
            links = [
                os.fsdecode(name)
                for name, child in directory.children.items()
                if not name.startswith(b"..") and not child.is_dir
            ]
            files = itertools.islice(_files(node, os.fsdecode(version)), PIN_NAMES)
            names = [os.fsdecode(DATA), *links, *files]
            if len(names) <= PIN_NAMES:
                self._pins.pin(root, names, listed=listed)
                return
        self._pins.unpin(root)  # grown past the bound: it holds none

    async def _store(self, pages: list[tuple[int, bytes]]) -> None:
        assert self._store_pages is not None
        if pages:
            await trio.to_thread.run_sync(self._store_pages, pages)

    def statistics(self) -> PublisherStatistics:
        volumes = len(self._tree.root.children or ())
        return PublisherStatistics(
            volumes, self._publishes, self._pending_removals, self._warming_later, self._pins.held
        )

    def _unused_name(self, volume_dir: Node) -> bytes:
        """A version directory name, `..<UTC time>.<random>`, that `volume_dir` does not hold.
        The volumes made within one second share one (a name need only be new in its own
        directory): one bytes object for thousands of volumes made at a start, where each
        made its own (64 bytes, held by the volume and its `..data`)."""
        stamp = time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime()).encode()
        name = self._last_name
        if name.startswith(stamp) and self._tree.child(volume_dir, name) is None:
            return name
        while True:
            name = stamp + str(random.getrandbits(32)).encode()
            if self._tree.child(volume_dir, name) is None:
                self._last_name = name
                return name

    def _remove_later(
        self, path: Path, op: str = "rmdir", *, pinned: tuple[str, str] | None = None
    ) -> None:
        """`op` on `path` after the grace period; `pinned`: the pins to let go of first (the
        volume's path on the agent's mount, the version's name)."""
        assert self._nursery is not None, "Publisher.run() is not running"
        self._pending_removals += 1
        self._nursery.start_soon(self._remove_after_grace, path, op, pinned)

    async def _remove_after_grace(
        self, path: Path, op: str, pinned: tuple[str, str] | None
    ) -> None:
        try:
            await trio.sleep(self._grace_s)
            if pinned is not None:  # else the kernel keeps the version's nodes past the rmdir
                root, version = pinned
                await self._pins.released(root, [version])
            with contextlib.suppress(FileNotFoundError):
                await self._vfs(op, path)
        finally:
            self._pending_removals -= 1

    async def _in_turns(self, op: str, root: Path, names: list[str]) -> None:
        """`op` (links, unlinks) over `names`, `_TURN` of them at a time, each turn queued for a
        helper anew: a volume of 100,000 keys renamed in an edit (200,000 operations, some
        30 s) leaves the helpers to other volumes' publishes between its turns."""
        for start in range(0, len(names), _TURN):
            await self._vfs(op, root, names[start : start + _TURN])

    async def _vfs(self, op: str, *args: object) -> None:
        """Run one operation of `fusevol.fuse.vfs_helper` in an idle helper; raise its OSError.

        A helper whose request is cancelled, or that died, is killed and replaced: a half-read
        answer must never reach the next caller. Its request, if the kernel already sent it to
        us, is still answered by our trio thread, so it dies at once."""
        request = [op, *map(_jsonable, args)]
        async with self._available:
            helper = self._idle.pop() if self._idle else self._spawn()
            try:
                answer = await helper.call(request)
            except BaseException:
                self._discard(helper)
                raise
            self._idle.append(helper)
        code, message = cast("list[Any]", answer)
        if code:
            raise OSError(code, message, str(args[0]))

    def _spawn(self) -> HelperProcess:
        helper = HelperProcess("fusevol.fuse.vfs_helper")
        self._helpers[helper.pid] = helper
        return helper

    def _discard(self, helper: HelperProcess) -> None:
        self._helpers.pop(helper.pid, None)
        with contextlib.suppress(ValueError):
            self._idle.remove(helper)
        helper.kill()


@dataclass(slots=True)
class _Waiting:
    """A new volume waiting to be warmed (`Publisher._warm`)."""

    volume: list[Any]
    pages: list[tuple[int, bytes]]
    done: bool = False


def _files(version: Node, prefix: str) -> Iterator[str]:
    """The path of every file below `version`, each beginning with `prefix`."""
    stack = [(prefix, version)]
    while stack:
        path, directory = stack.pop()
        for name, node in (directory.children or {}).items():
            each = f"{path}/{os.fsdecode(name)}"
            if node.is_dir:
                stack.append((each, node))
            else:
                yield each


def _looked_up(version: Node) -> list[str] | None:
    """The files `vfs_helper.look_up` looks up one by one, or None to list the version."""
    children = version.children
    if children is None:
        return []
    if len(children) > _LOOKED_UP or any(node.is_dir for node in children.values()):
        return None
    return [os.fsdecode(name) for name in children]


def _holds(version: Node, payload: Payload, gid: int | None, dir_mode: int) -> bool:
    """True if `version` serves `payload` as `Tree.build_version(payload, dir_mode=dir_mode,
    gid=gid)` would: the same files, each with its content, mode and owner, and the same group
    and directory mode."""
    if (version.mode & 0o7777, version.gid) != (dir_mode, gid or 0):
        return False
    files = 0
    for path, projection in payload.items():
        node: Node | None = version
        for name in names(path):
            node = node.children.get(name) if node is not None and node.children else None
        if node is None or node.is_dir:
            return False
        if (node.content, node.mode & 0o7777, node.uid) != (
            projection.data,
            projection.mode,
            projection.fs_user or 0,
        ):
            return False
        files += 1
    return files == sum(1 for node in walk(version) if not node.is_dir)


@functools.lru_cache(maxsize=1024)
def _link_target(top: bytes) -> bytes:
    """`..data/<top>`: one bytes object for the links of that name of every volume made here."""
    return DATA + b"/" + top


def _top_level(payload: Payload) -> set[bytes]:
    return {names(path)[0] for path in payload}


def _jsonable(value: object) -> object:
    return os.fsdecode(value) if isinstance(value, (bytes, os.PathLike)) else value
