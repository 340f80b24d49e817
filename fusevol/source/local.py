"""ManifestSource: the embedded default source, a directory of manifests watched with inotify.

Owns the directory -> store direction for the local mode: which files are read, which file owns
which object, when an object gets a new resourceVersion, and what a failed edit leaves behind.

1. Watch the directory (before listing it, so that no save between listing and watching is lost).
2. Read every manifest file, in name order, and deliver their objects; `store.mark_synced()`;
   `task_status.started()`.
3. For each burst of inotify events (everything readable is drained first; there is no debounce,
   so a save reaches the store within milliseconds), re-read only the files the events name.

The rules, per file: a file delivers the objects it defines now and its objects that disappeared
are deleted; a removed file deletes its objects; a file that fails to parse logs one ERROR line and
keeps its previous objects (a half-finished edit never tears a volume down). An object defined by
two files belongs to the first file that defined it; the other file gets an ERROR line. Pods bound
to another node (`spec.nodeName`) are not delivered. The source numbers what it delivers: an object
gets a fresh `resource_version` only when its content changed, so re-reading an untouched file
changes nothing in the store.

Only the top level is watched (not recursive, like kubelet's staticPodPath): `*.yaml`, `*.yml`,
`*.json`, minus editor temporaries (names starting with `.`, ending with `~` or `.swp`). When the
directory is a configMap volume itself, kubelet swaps its `..data` symlink: that triggers a full
rescan. If the directory is moved away, its objects stay and its parent is watched until it is
back, then it is rescanned; `rm -r` deletes the files first, and so their objects.

Excludes: parsing and validation (`fusevol.decode.manifest`), the API server source
(`fusevol.source.kube`), and any use of the store's contents (the populator and reconciler).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import stat
from typing import TYPE_CHECKING, Any

import inotify_simple
import trio

from fusevol.base.errors import ManifestError
from fusevol.decode.manifest import parse_manifest
from fusevol.model import KubeObject, ObjectKey, Pod, ResourceVersion

if TYPE_CHECKING:
    import pathlib
    from collections.abc import Iterable

    from fusevol.volumemanager.cache.desired import VolumeToServe
    from fusevol.volumemanager.cache.store import ObjectStore

log = logging.getLogger(__name__)

_IN_CLOSE_WRITE: int = inotify_simple.flags.CLOSE_WRITE
_IN_MOVED_FROM: int = inotify_simple.flags.MOVED_FROM
_IN_MOVED_TO: int = inotify_simple.flags.MOVED_TO
_IN_CREATE: int = inotify_simple.flags.CREATE
_IN_DELETE: int = inotify_simple.flags.DELETE
_IN_DELETE_SELF: int = inotify_simple.flags.DELETE_SELF
_IN_MOVE_SELF: int = inotify_simple.flags.MOVE_SELF
_IN_UNMOUNT: int = inotify_simple.flags.UNMOUNT
_IN_Q_OVERFLOW: int = inotify_simple.flags.Q_OVERFLOW
_IN_IGNORED: int = inotify_simple.flags.IGNORED
_IN_ONLYDIR: int = inotify_simple.flags.ONLYDIR
_IN_ISDIR: int = inotify_simple.flags.ISDIR

_DIRECTORY_MASK = (
    _IN_CLOSE_WRITE
    | _IN_MOVED_TO
    | _IN_MOVED_FROM
    | _IN_DELETE
    | _IN_CREATE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
    | _IN_ONLYDIR
)
_PARENT_MASK = _IN_CREATE | _IN_MOVED_TO | _IN_ONLYDIR
_DIRECTORY_GONE = _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_UNMOUNT | _IN_IGNORED
_KUBELET_DATA_LINK = "..data"

FileResult = list[KubeObject] | ManifestError | None
"""What reading one file gave: its objects, why it was rejected, or None if it is gone."""


def is_manifest_name(name: str) -> bool:
    """True for the names the source reads: `*.yaml`, `*.yml`, `*.json`, not editor temporaries."""
    if name.startswith(".") or name.endswith(("~", ".swp")):
        return False
    return name.endswith((".yaml", ".yml", ".json"))


@dataclasses.dataclass(frozen=True, slots=True)
class ManifestSourceStatistics:
    files: int
    rejected_files: int
    objects: int
    watching: bool


class ManifestSource:
    """Delivers the Pods, ConfigMaps and Secrets of the manifests in `directory` to `store`."""

    def __init__(self, *, directory: pathlib.Path, node_name: str, store: ObjectStore) -> None:
        self._directory = directory
        self._node_name = node_name
        self._store = store
        self._files: dict[str, dict[ObjectKey, KubeObject]] = {}
        """File name -> the objects it defines, as last read successfully (after node filtering)."""
        self._owners: dict[ObjectKey, str] = {}
        self._delivered: dict[ObjectKey, KubeObject] = {}
        self._rejected: set[str] = set()
        self._last_version = 0
        self._watch: _DirectoryWatch | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Steps 1-3 of the module docstring; runs until cancelled.

        Raises `ManifestError` if the directory does not exist at start, or if it and its parent
        both disappear.
        """
        with inotify_simple.INotify(nonblocking=True) as inotify:
            # (1)
            self._watch = watch = _DirectoryWatch(inotify=inotify, directory=self._directory)
            if not watch.start():
                raise ManifestError(f"{self._directory}: manifest directory does not exist")
            # (2)
            await self._rescan()
            self._store.mark_synced()
            log.info("manifests loaded directory=%s files=%d", self._directory, len(self._files))
            task_status.started()
            # (3)
            while True:
                names, rescan = await watch.wait_events()
                if rescan:
                    await self._rescan()
                elif names and watch.watching:
                    await self._reload(names)

    def volume_failed(self, volume: VolumeToServe, error: str) -> None:
        """Nothing to record: a manifest directory has no events (the executor logs the error
        and `fusevol status` shows it)."""

    def volume_frozen(self, pod: Pod, spec_name: str, message: str) -> None:
        """Nothing to record (no events here): the agent logs it and `fusevol status` shows it."""

    def statistics(self) -> ManifestSourceStatistics:
        return ManifestSourceStatistics(
            files=len(self._files),
            rejected_files=len(self._rejected),
            objects=len(self._delivered),
            watching=self._watch is not None and self._watch.watching,
        )

    async def _rescan(self) -> None:
        listed = await trio.to_thread.run_sync(_list_manifests, self._directory)
        if listed is not None:  # None: gone again; the watch has seen it and will rescan later
            await self._reload(set(listed) | self._files.keys())

    async def _reload(self, names: Iterable[str]) -> None:
        # Files are read and parsed in a worker thread, one hop per burst. They are tiny, but the
        # trio thread also answers FUSE requests, and a manifest directory on a slow or hung
        # filesystem (or a 1 MiB YAML to parse) must not stall every volume; the hop costs a
        # fraction of a millisecond.
        log.debug("reading manifests files=%s", ",".join(sorted(names)))
        results = await trio.to_thread.run_sync(_read_files, self._directory, sorted(names))
        for name, result in results.items():
            self._apply(name, result)

    def _apply(self, name: str, result: FileResult) -> None:
        """Make the store reflect `result`, the new state of file `name`."""
        origin = self._directory / name
        if isinstance(result, ManifestError):
            self._rejected.add(name)
            if self._files.get(name):
                log.error("manifest rejected, keeping its previous objects: %s", result)
            else:
                log.error("manifest rejected, nothing served from it: %s", result)
            return
        self._rejected.discard(name)
        old = self._files.pop(name, {})
        new: dict[ObjectKey, KubeObject] = {}
        for obj in result or ():
            if isinstance(obj, Pod) and obj.node_name not in ("", self._node_name):
                log.debug(
                    "%s: %s is bound to node %s, not delivered", origin, obj.key, obj.node_name
                )
            else:
                new[obj.key] = obj
        if result is not None:
            self._files[name] = new
        log.debug("manifest read file=%s objects=%d removed=%s", origin, len(new), result is None)
        for key in sorted(old.keys() | new.keys(), key=str):
            owner = self._settle(key)
            if key in new and owner != name:
                log.error(
                    "%s: %s is already defined in %s; ignoring this definition",
                    origin,
                    key,
                    self._directory / str(owner),
                )

    def _settle(self, key: ObjectKey) -> str | None:
        """Deliver the current definition of `key`, or delete it; return the owning file."""
        owner = self._owners.get(key)
        if owner is None or key not in self._files.get(owner, {}):
            # The owner gave it up: the first other file (by name) that defines it takes over.
            owner = min((n for n, objects in self._files.items() if key in objects), default=None)
        if owner is None:
            self._owners.pop(key, None)
            if self._delivered.pop(key, None) is not None:
                self._store.delete(key)
            return None
        self._owners[key] = owner
        self._deliver(self._files[owner][key])
        return owner

    def _deliver(self, obj: KubeObject) -> None:
        previous = self._delivered.get(obj.key)
        if previous is None or (
            dataclasses.replace(obj, resource_version=previous.resource_version) != previous
        ):
            self._last_version += 1
            version = ResourceVersion(str(self._last_version))
            self._delivered[obj.key] = dataclasses.replace(obj, resource_version=version)
        if self._store.upsert(self._delivered[obj.key]):
            log.debug("delivered %s version=%s", obj.key, self._delivered[obj.key].resource_version)


class _DirectoryWatch:
    """The inotify watch on the directory, or on its parent while the directory is away."""

    def __init__(self, *, inotify: Any, directory: pathlib.Path) -> None:
        self._inotify = inotify  # inotify_simple.INotify; the library ships no type hints
        self._directory = directory
        self._name = directory.absolute().name  # also right for a relative path such as "."
        self._parent = directory.absolute().parent
        self._directory_wd: int | None = None
        self._parent_wd: int | None = None

    @property
    def watching(self) -> bool:
        return self._directory_wd is not None

    def start(self) -> bool:
        """Watch the directory; False if it does not exist (or is not a directory)."""
        try:
            wd: int = self._inotify.add_watch(self._directory, _DIRECTORY_MASK)
        except (FileNotFoundError, NotADirectoryError):
            return False
        self._directory_wd = wd
        if self._parent_wd is not None:
            with contextlib.suppress(OSError):  # the parent may be gone as well
                self._inotify.rm_watch(self._parent_wd)
            self._parent_wd = None
        return True

    async def wait_events(self) -> tuple[set[str], bool]:
        """Wait for events, drain all that are readable; return (file names, rescan needed)."""
        await trio.lowlevel.wait_readable(self._inotify.fileno())
        names: set[str] = set()
        rescan = False
        while events := self._inotify.read(timeout=0):
            for event in events:
                wd: int = event.wd
                mask: int = event.mask
                name: str = event.name
                if mask & _IN_Q_OVERFLOW:
                    rescan = True  # events were lost: compare every file
                elif wd == self._parent_wd:
                    is_ours = name == self._name and mask & _IN_ISDIR
                    rescan |= bool(is_ours) and self.start()
                elif wd != self._directory_wd:
                    continue  # a watch we already dropped
                elif mask & _DIRECTORY_GONE:
                    rescan |= self._lost()
                elif name == _KUBELET_DATA_LINK and mask & _IN_MOVED_TO:
                    rescan = True  # the directory is a configMap volume, swapped by kubelet
                elif not mask & _IN_ISDIR and is_manifest_name(name) and self._complete(mask, name):
                    names.add(name)
        return names, rescan

    def _complete(self, mask: int, name: str) -> bool:
        """False for IN_CREATE of a regular file: it is being written, IN_CLOSE_WRITE follows.

        A symlink or a hard link (`ln`) is complete when it is created and sends nothing else.
        """
        if not mask & _IN_CREATE:
            return True
        try:
            status = os.lstat(self._directory / name)
        except OSError:
            return True  # gone already: re-reading finds that out
        return stat.S_ISLNK(status.st_mode) or status.st_nlink > 1

    def _lost(self) -> bool:
        """The directory was deleted, moved or unmounted: watch its parent. True if it is back."""
        with contextlib.suppress(OSError):  # already removed by the kernel unless it was moved
            self._inotify.rm_watch(self._directory_wd)
        self._directory_wd = None
        log.error(
            "manifest directory %s is gone; keeping its objects until it is back", self._directory
        )
        try:
            self._parent_wd = self._inotify.add_watch(self._parent, _PARENT_MASK)
        except OSError as exc:
            raise ManifestError(f"{self._directory}: directory and parent are gone: {exc}") from exc
        return self.start()


def _list_manifests(directory: pathlib.Path) -> list[str] | None:
    """Manifest file names in `directory` (worker thread); None if it does not exist."""
    try:
        return [name for name in os.listdir(directory) if is_manifest_name(name)]
    except (FileNotFoundError, NotADirectoryError):
        return None


def _read_files(directory: pathlib.Path, names: list[str]) -> dict[str, FileResult]:
    """Read and parse each of `names` (worker thread)."""
    results: dict[str, FileResult] = {}
    for name in names:
        path = directory / name
        try:
            text = _read_regular_file(path)
        except OSError as exc:
            results[name] = ManifestError(f"{path}: cannot read: {exc.strerror}")
            continue
        try:
            results[name] = None if text is None else parse_manifest(text, origin=str(path))
        except ManifestError as exc:
            results[name] = exc
        except Exception as exc:  # a parser bug must not take the agent down
            # Its message is not repeated: it could quote a secret's value.
            results[name] = ManifestError(
                f"{path}: cannot be parsed: fusevol's parser failed with {type(exc).__name__}"
                " (a bug: please report it with the file, its secrets removed)"
            )
    return results


def _read_regular_file(path: pathlib.Path) -> bytes | None:
    """The file's bytes; None if it is gone or not a regular file (never blocks on a FIFO)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    with open(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return file.read()
