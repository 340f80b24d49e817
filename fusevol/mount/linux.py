"""The real mount backend: mount(2)/umount2(2) for binds and unmounts, mount(8) for the rest,
/proc/self/mountinfo as truth.

Bind mounts (thousands per node: one per served pod volume) and unmounts are syscalls made from
a worker thread (ctypes), not a mount(8) exec each: a path near a mount may reach a FUSE server,
our own included, so never on the trio thread. Mounts that need a helper (nfs, ...) run mount(8).
Commands run through trio with a timeout, so a hung mount helper (kubelet's hung-NFS problem)
fails its own operation and blocks nothing else. Their argv is logged with sensitive options
masked. A mount point whose server is gone answers ENOTCONN, ESTALE, EIO or EACCES to stat
(mount-utils `IsCorruptedMnt`); such a mount cannot be unmounted normally and is detached
lazily instead.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from typing import TYPE_CHECKING

import trio

from fusevol.errors import MountError
from fusevol.mount.backend import MountBackend, MountPoint

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

log = logging.getLogger(__name__)

CORRUPTED_ERRNOS = frozenset({errno.ENOTCONN, errno.ESTALE, errno.EIO, errno.EACCES})
_MAX_STACK = 4096
"""Mounts stacked at one path that `unmount` removes before it gives up (one per restart of the
agent for a served volume: README, "Restarts")."""
_NO_HELPER_FSTYPES = frozenset({None, "tmpfs"})
"""Mounts done by the kernel alone (bind, tmpfs): no helper process to keep alive."""


_MS_RDONLY = 0x1
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_NOEXEC = 0x8
_MS_REMOUNT = 0x20
_MS_BIND = 0x1000
_MS_SHARED = 1 << 20
_MNT_FORCE = 0x1
_MNT_DETACH = 0x2
_KEPT_FLAGS = (  # statvfs f_flag bit (ST_*) -> the mount flag a read-only remount must keep
    (os.ST_NOSUID, _MS_NOSUID),
    (os.ST_NODEV, _MS_NODEV),
    (os.ST_NOEXEC, _MS_NOEXEC),
)
_libc = ctypes.CDLL(None, use_errno=True)


class LinuxMountBackend:
    def __init__(
        self,
        *,
        command_timeout_s: float,
        systemd_run: bool | None = None,
        mountinfo: str = "/proc/self/mountinfo",
    ) -> None:
        """`systemd_run`: wrap mounts that run a helper in `systemd-run --scope`; None detects
        whether systemd is the init system."""
        self._command_timeout_s = command_timeout_s
        self._systemd_run = _systemd_is_init() if systemd_run is None else systemd_run
        self._mountinfo = mountinfo
        self._parsed: dict[str, MountPoint] = {}
        """The last table read, by line (`mount_points`)."""

    async def mount(
        self,
        source: str,
        target: Path,
        *,
        fstype: str | None = None,
        options: Sequence[str] = (),
        sensitive_options: Sequence[str] = (),
    ) -> None:
        if self.is_mount_point(target):
            return
        argv, shown = ["mount"], ["mount"]
        if fstype:
            argv += ["-t", fstype]
            shown += ["-t", fstype]
        if options or sensitive_options:
            argv += ["-o", ",".join([*options, *sensitive_options])]
            shown += ["-o", ",".join([*options, *["<masked>"] * len(sensitive_options)])]
        argv += [source, str(target)]
        shown += [source, str(target)]
        if self._systemd_run and fstype not in _NO_HELPER_FSTYPES:
            # kubelet's reason (PR #49640): a mount helper that forks a daemon (ceph-fuse,
            # glusterfs) must not live in the agent's cgroup, or it dies with the agent.
            scope = [
                "systemd-run",
                f"--description=fusevol transient mount for {target}",
                "--scope",
                "--",
            ]
            argv, shown = scope + argv, scope + shown
        await self._run(argv, shown=shown)

    async def bind(
        self, source: Path, target: Path, *, read_only: bool, stack: bool = False
    ) -> None:
        if self._is_bind_of(source, target) if stack else self.is_mount_point(target):
            return
        # What `mount --bind -o ro --make-shared` does, as three mount(2) calls. Nothing stats the
        # target first: a dead FUSE mount there is a valid mount point.
        log.debug(
            "bind source=%s target=%s read_only=%s shared=%s", source, target, read_only, stack
        )
        try:
            await trio.to_thread.run_sync(_bind, str(source), str(target), read_only, stack)
        except OSError as exc:
            raise MountError(f"bind {source} {target}: {exc.strerror}") from exc

    async def unmount(self, target: Path, *, force: bool = False) -> None:
        for _ in range(_MAX_STACK):
            if not self.is_mount_point(target):
                return
            if force:
                # MNT_FORCE calls the file system's umount_begin (FUSE: abort the connection)
                # before MNT_DETACH: no stat, which would hang on a stuck server.
                await self._umount(target, _MNT_FORCE | _MNT_DETACH)
                continue
            # stat() may reach a FUSE server, possibly our own: never on the trio thread.
            corrupted = await trio.to_thread.run_sync(_is_corrupted, target, abandon_on_cancel=True)
            await self._umount(target, _MNT_DETACH if corrupted else 0)
        raise MountError(f"{target}: still a mount point after {_MAX_STACK} unmounts")

    def mount_points(self) -> tuple[MountPoint, ...]:
        # The table is read before every mount: lines seen in the previous read are not parsed
        # again (setting up N volumes would parse N tables of N lines), and only the current
        # table's lines are kept.
        with open(self._mountinfo, encoding="utf-8", errors="surrogateescape") as f:
            lines = [line for line in f if line.strip()]
        previous = self._parsed
        self._parsed = {line: previous.get(line) or _parse_mountinfo_line(line) for line in lines}
        return tuple(self._parsed.values())

    def is_mount_point(self, path: Path) -> bool:
        wanted = os.path.abspath(path)
        return any(mp.path == wanted for mp in self.mount_points())

    def _is_bind_of(self, source: Path, target: Path) -> bool:
        """True if the top mount at `target` shows the same file system subtree as `source`."""
        table = self.mount_points()
        top = _top_mount(table, os.path.abspath(target))
        if top is None:
            return False
        source_path = os.path.abspath(source)
        holders = [mp for mp in table if _is_within(source_path, mp.path)]
        if not holders:
            return False
        holder = _top_mount(table, max((mp.path for mp in holders), key=len))
        assert holder is not None
        relative = os.path.relpath(source_path, holder.path)
        root = os.path.normpath(os.path.join(holder.root, relative))
        return (top.device, top.root) == (holder.device, root)

    async def _umount(self, target: Path, flags: int) -> None:
        log.debug("umount2 target=%s flags=%#x", target, flags)
        try:
            with trio.fail_after(self._command_timeout_s):
                await trio.to_thread.run_sync(_umount2, str(target), flags, abandon_on_cancel=True)
        except trio.TooSlowError:
            raise MountError(
                f"umount {target}: timed out after {self._command_timeout_s:g}s"
            ) from None
        except OSError as exc:
            raise MountError(f"umount {target}: {exc.strerror}") from exc

    async def _run(self, argv: list[str], *, shown: list[str] | None = None) -> None:
        printable = " ".join(shown or argv)
        log.debug("running %s", printable)
        try:
            with trio.fail_after(self._command_timeout_s):
                result = await trio.run_process(
                    argv, capture_stdout=True, capture_stderr=True, check=False
                )
        except trio.TooSlowError:
            raise MountError(f"{printable}: timed out after {self._command_timeout_s:g}s") from None
        except OSError as exc:
            raise MountError(f"{printable}: {exc}") from exc
        if result.returncode != 0:
            output = (result.stderr or result.stdout).decode(errors="replace").strip()
            raise MountError(f"{printable}: exit status {result.returncode}: {output}")


def _mount2(source: str | None, target: str, flags: int) -> None:
    """mount(2) with no file system type and no data: binds and their remounts."""
    encoded = None if source is None else os.fsencode(source)
    if _libc.mount(encoded, os.fsencode(target), None, ctypes.c_ulong(flags), None) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), target)


def _umount2(target: str, flags: int) -> None:
    if _libc.umount2(os.fsencode(target), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), target)


def _bind(source: str, target: str, read_only: bool, shared: bool) -> None:
    """1. bind `source` on `target`; 2. if `read_only`, remount the bind read-only, keeping its
    nosuid/nodev/noexec (a bind remount sets exactly the flags given); 3. if `shared`, make it a
    shared mount. A failure after step 1 detaches the layer just added, and only it."""
    _mount2(source, target, _MS_BIND)
    try:
        if read_only:
            kept = os.statvfs(target).f_flag
            flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY
            flags |= sum(mount for st, mount in _KEPT_FLAGS if kept & st)
            _mount2(None, target, flags)
        if shared:
            _mount2(None, target, _MS_SHARED)
    except OSError:
        _umount2(target, _MNT_DETACH)
        raise


def _systemd_is_init() -> bool:
    """sd_booted(3): systemd is PID 1 when /run/systemd/system exists."""
    return os.path.isdir("/run/systemd/system")


def _is_corrupted(path: Path) -> bool:
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno in CORRUPTED_ERRNOS
    return False


def _top_mount(table: tuple[MountPoint, ...], path: str) -> MountPoint | None:
    """The mount that hides the others mounted at `path`: none of them is mounted on it."""
    at_path = [mp for mp in table if mp.path == path]
    covered = {mp.parent_id for mp in at_path}
    return next((mp for mp in reversed(at_path) if mp.mount_id not in covered), None)


def _is_within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(os.path.join(directory, ""))


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal `\\ooo`."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _parse_mountinfo_line(line: str) -> MountPoint:
    fields = line.split()
    separator = fields.index("-", 6)
    return MountPoint(
        mount_id=int(fields[0]),
        parent_id=int(fields[1]),
        device=fields[2],
        root=_unescape(fields[3]),
        path=_unescape(fields[4]),
        options=tuple(fields[5].split(",")),
        fstype=fields[separator + 1],
        source=_unescape(fields[separator + 2]),
    )


if TYPE_CHECKING:
    _check: MountBackend = LinuxMountBackend(command_timeout_s=1)
