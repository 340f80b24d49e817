"""Volumes set up by the mount backend: nfs, local, hostPath and emptyDir, as kubelet does them.

Each plugin's `set_up` is idempotent (an existing mount is adopted as it is, which is how a
restarted agent keeps running pods' mounts: docs/kubelet.md fact 9 reconstruction) and cleans up
after itself on failure: no directory and no mount remain (docs/kubelet.md fact 10). `tear_down` is
idempotent too.

    nfs       mount -t nfs -o <options> server:path <dir>; dir 0750; "ro" when read-only;
              options: the PV annotation, else spec.mountOptions, de-duplicated and sorted (fact 10)
    local     bind mount of the PV's path at <dir> (0750), read-only when asked (fact 11)
    hostPath  no directory, no mount: the runtime binds the host path; only the type check (fact 11)
    emptyDir  a directory (0777), or a tmpfs sized by sizeLimit for medium Memory
    gitRepo   an emptyDir directory into which git clones once per pod (`fusevol.mount.gitrepo`)

Excluded: the volumes served from memory (fusevol.volumemanager.reconciler.served).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import trio

from fusevol.base.errors import MountError, VolumeSetupError
from fusevol.base.fsutil import mkdir_all
from fusevol.base.quantity import parse_quantity, value
from fusevol.model import (
    EmptyDirVolumeSource,
    GitRepoVolumeSource,
    HostPathVolumeSource,
    LocalVolumeSource,
    NFSVolumeSource,
)
from fusevol.mount import gitrepo
from fusevol.node import layout
from fusevol.node.layout import Plugin

if TYPE_CHECKING:
    from fusevol.model import PersistentVolumeSource, Pod, Volume, VolumeSource
    from fusevol.mount.backend import MountBackend


class MountVolume(Protocol):
    """What a plugin reads of a volume to set it up: the reconciler's volume to serve."""

    @property
    def plugin(self) -> Plugin | None: ...
    @property
    def pod(self) -> Pod: ...
    @property
    def volume(self) -> Volume:
        """The pod's `spec.volumes[]` entry."""

    @property
    def spec_name(self) -> str:
        """The volume directory's name: the volume's name, or its PersistentVolume's."""

    @property
    def source(self) -> VolumeSource | PersistentVolumeSource | None:
        """What to set up: the inline source, or the bound PersistentVolume's."""

    @property
    def read_only(self) -> bool: ...
    @property
    def mount_options(self) -> tuple[str, ...]: ...


class MountPlugins:
    def __init__(self, *, root: Path, backend: MountBackend, git_timeout_s: float = 300.0) -> None:
        self._root = root
        self._backend = backend
        self._git_repo = gitrepo.GitRepo(timeout_s=git_timeout_s)

    def path(self, volume: MountVolume) -> Path:
        """Where the volume is on the node: its pod volume directory, or the host path."""
        if isinstance(volume.source, HostPathVolumeSource):
            return Path(volume.source.path)
        assert volume.plugin is not None
        return layout.volume_dir(self._root, volume.pod.uid, volume.plugin, volume.spec_name)

    async def set_up(self, volume: MountVolume) -> Path:
        target = self.path(volume)
        match volume.source:
            case NFSVolumeSource() as nfs:
                await self._mount(target, _nfs_source(nfs), _nfs_options(volume), fstype="nfs")
            case LocalVolumeSource(path=path):
                _reject_backsteps(path, "local volume path")
                options = ["bind", *(["ro"] if volume.read_only else []), *volume.mount_options]
                await self._mount(target, path, options, fstype=None)
            case HostPathVolumeSource() as host_path:
                await trio.to_thread.run_sync(check_host_path, host_path)
            case EmptyDirVolumeSource() as empty_dir:
                await self._empty_dir(target, empty_dir)
            case GitRepoVolumeSource() as git_repo:
                meta_dir = layout.volume_meta_dir(target, Plugin.GIT_REPO)
                await self._git_repo.set_up(
                    target, meta_dir, git_repo, fs_group=volume.pod.fs_group
                )
            case _:
                raise VolumeSetupError(f"volume {volume.volume.name!r}: not a mount-backed type")
        return target

    async def tear_down(self, plugin: Plugin, path: Path) -> None:
        if plugin is Plugin.HOST_PATH:
            return
        await self._backend.unmount(path)
        if plugin not in (Plugin.EMPTY_DIR, Plugin.GIT_REPO):
            await trio.to_thread.run_sync(_remove_dir, path)
            return
        self._check_nothing_mounted_below(path)  # on the trio thread, as every use of the table
        await trio.to_thread.run_sync(_remove_tree, path)
        if plugin is Plugin.GIT_REPO:
            meta_dir = layout.volume_meta_dir(path, Plugin.GIT_REPO)
            await trio.to_thread.run_sync(gitrepo.remove, path, meta_dir)

    async def _mount(
        self, target: Path, source: str, options: list[str], *, fstype: str | None
    ) -> None:
        if self._backend.is_mount_point(target):
            return
        await trio.to_thread.run_sync(mkdir_all, target, 0o750)
        try:
            await self._backend.mount(source, target, fstype=fstype, options=options)
        except MountError:
            if self._backend.is_mount_point(target):
                with contextlib.suppress(MountError):
                    await self._backend.unmount(target)
            if not self._backend.is_mount_point(target):
                await trio.to_thread.run_sync(_remove_dir, target)
            raise

    async def _empty_dir(self, target: Path, source: EmptyDirVolumeSource) -> None:
        if source.medium not in ("", "Memory"):
            raise VolumeSetupError(f"emptyDir medium {source.medium!r} is not supported")
        if source.medium == "":
            await trio.to_thread.run_sync(_make_dir, target, 0o777)
            return
        options = []
        if source.size_limit:
            try:
                options.append(f"size={value(parse_quantity(source.size_limit))}")
            except ValueError as exc:
                raise VolumeSetupError(f"emptyDir sizeLimit: {exc}") from None
        await self._mount(target, "tmpfs", options, fstype="tmpfs")

    def _check_nothing_mounted_below(self, path: Path) -> None:
        """Never delete an emptyDir's content through a mount inside it."""
        prefix = os.path.join(path, "")
        inside = [mp.path for mp in self._backend.mount_points() if mp.path.startswith(prefix)]
        if inside:
            raise MountError(f"cannot remove {path}: still mounted below it: {', '.join(inside)}")


def _nfs_source(nfs: NFSVolumeSource) -> str:
    if not nfs.server or not nfs.path:
        raise VolumeSetupError("nfs: server and path are required")
    if not nfs.path.startswith("/"):
        raise VolumeSetupError(f"nfs: path {nfs.path!r} must be absolute")
    server = f"[{nfs.server}]" if ":" in nfs.server else nfs.server  # an IPv6 address
    return f"{server}:{nfs.path}"


def _nfs_options(volume: MountVolume) -> list[str]:
    """kubelet's `JoinMountOptions`: "ro" when read-only plus the volume's options, as a set."""
    return sorted({*(["ro"] if volume.read_only else []), *volume.mount_options})


_TYPE_CHECKS = {
    "Directory": (stat.S_ISDIR, "a directory"),
    "DirectoryOrCreate": (stat.S_ISDIR, "a directory"),
    "File": (stat.S_ISREG, "a file"),
    "FileOrCreate": (stat.S_ISREG, "a file"),
    "Socket": (stat.S_ISSOCK, "a socket file"),
    "CharDevice": (stat.S_ISCHR, "a character device"),
    "BlockDevice": (stat.S_ISBLK, "a block device"),
}


def check_host_path(source: HostPathVolumeSource) -> None:
    """kubelet's hostPath type check, with its error texts (docs/kubelet.md fact 11)."""
    _reject_backsteps(source.path, "hostPath")
    if source.type == "":
        return
    if source.type not in _TYPE_CHECKS:
        raise VolumeSetupError(f"{source.type} is an invalid volume type")
    path = source.path
    if source.type == "DirectoryOrCreate" and not os.path.lexists(path):
        for made in mkdir_all(path, 0o755):
            os.chmod(made, 0o755)  # kubelet's MkdirAll(0755) under the usual umask 022, not ours
    elif source.type == "FileOrCreate" and not os.path.lexists(path):
        try:
            fd = os.open(path, os.O_CREAT | os.O_RDONLY | os.O_CLOEXEC, 0o644)
            os.fchmod(fd, 0o644)  # likewise
            os.close(fd)
        except OSError as exc:
            raise VolumeSetupError(f"hostPath type check failed: {path}: {exc.strerror}") from None
    check, what = _TYPE_CHECKS[source.type]
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = 0
    if not check(mode):
        raise VolumeSetupError(f"hostPath type check failed: {path} is not {what}")


def _reject_backsteps(path: str, what: str) -> None:
    """kubelet's `ValidatePathNoBacksteps` (and a required path)."""
    if not path:
        raise VolumeSetupError(f"{what}: path is required")
    if ".." in path.split("/"):
        raise VolumeSetupError(f"invalid {what} {path!r}: must not contain '..'")


def _make_dir(path: Path, mode: int) -> None:
    mkdir_all(path, 0o750)
    os.chmod(path, mode)  # umask-proof, as kubelet's emptyDir does


def _remove_dir(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(path)


def _remove_tree(path: Path) -> None:
    """Delete a volume directory with its content (`_check_nothing_mounted_below` first)."""
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(path)
