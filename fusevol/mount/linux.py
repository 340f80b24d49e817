"""The real mount backend: mount(2)/umount2(2) for binds and unmounts, mount(8) for the rest,
and a mount table (`table.MountTable`) read from /proc/self/mountinfo once, then kept by the
backend's own operations.

Bind mounts (thousands per node: one per served pod volume) and unmounts are system calls
(`syscalls`, ctypes), not a mount(8) exec each, and never on the trio thread: a path near a mount
may reach a FUSE server, our own included. Binds of fusevol's own file systems (stacked binds)
and their unmounts are made in batches by the mount helper process (`mount_helper` says why);
other binds and unmounts in a worker thread each. Mounts that need a helper program (nfs, ...)
run mount(8).
Commands run through trio with a timeout, so a hung mount helper (kubelet's hung-NFS problem)
fails its own operation and blocks nothing else. Their argv is logged with sensitive options
masked. A mount point whose server is gone answers ENOTCONN, ESTALE, EIO or EACCES to stat
(mount-utils `IsCorruptedMnt`); such a mount cannot be unmounted normally and is detached
lazily instead.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
from typing import TYPE_CHECKING

import outcome
import trio

from fusevol.base.errors import MountError
from fusevol.base.helper_parent import HelperProcess
from fusevol.mount import syscalls
from fusevol.mount.batch import Batches
from fusevol.mount.syscalls import MNT_DETACH, MNT_FORCE
from fusevol.mount.table import MountTable

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from fusevol.mount.backend import MountBackend
    from fusevol.mount.mountinfo import MountPoint

log = logging.getLogger(__name__)

CORRUPTED_ERRNOS = frozenset({errno.ENOTCONN, errno.ESTALE, errno.EIO, errno.EACCES})
_MAX_STACK = 4096
"""Mounts stacked at one path that `unmount` removes before it gives up (one per restart of the
agent for a served volume: README, "Restarts")."""
_NO_HELPER_FSTYPES = frozenset({None, "tmpfs"})
"""Mounts done by the kernel alone (bind, tmpfs): no helper process to keep alive."""


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
        self._helper = _MountHelper()
        self._batches: Batches[list[object]] = Batches(self._helper.run)
        """Binds of fusevol's own file systems and their unmounts, with their targets: in the
        mount helper process (`fusevol.mount.mount_helper` says why)."""
        self._own_devices: set[str] = set()
        """The devices of fusevol's own file systems (the sources of stacked binds): they answer
        while the agent runs, so their binds are unmounted without a stat, in batches."""
        self.table = MountTable(mountinfo)
        """What is mounted where, as this backend knows it (read from mountinfo when it may be
        wrong: `table` module docstring)."""

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
        try:
            await self._run(argv, shown=shown)
        finally:  # even a failed helper may have mounted something
            self.table.mounted()

    async def bind(
        self,
        source: Path,
        target: Path,
        *,
        read_only: bool,
        stack: bool = False,
        make_target: int | None = None,
    ) -> None:
        if self._is_bind_of(source, target) if stack else self.is_mount_point(target):
            return
        # What `mount --bind -o ro --make-shared` does, as three mount(2) calls. Nothing stats the
        # target first: a dead FUSE mount there is a valid mount point.
        log.debug(
            "bind source=%s target=%s read_only=%s shared=%s", source, target, read_only, stack
        )
        source_path, target_path = _absolute(source), _absolute(target)
        if self.is_mount_point(target):
            make_target = None
        holder = self.table.holder(source_path)
        args = (
            source_path,
            target_path,
            read_only,
            stack,
            make_target,
            None if holder is None else (holder.device, list(holder.options)),
        )
        try:
            if stack:  # binds of fusevol's own file systems, which answer: in batches
                device = str(await self._batches.call(["bind", *args]))
                self._own_devices.add(device)
            else:
                device = await trio.to_thread.run_sync(functools.partial(syscalls.bind, *args))
        except OSError as exc:
            raise MountError(f"bind {source} {target}: {exc.strerror}") from exc
        self.table.bound(source_path, target_path, read_only=read_only, device=device)

    def bind_later(self, source: Path, target: Path, *, make_target: int) -> Callable[[], str]:
        # What `bind` does with `stack`, but in the caller's thread: the holder is read now.
        source_path, target_path = _absolute(source), _absolute(target)
        holder = self.table.holder(source_path)
        held = None if holder is None else (holder.device, list(holder.options))
        return functools.partial(
            syscalls.bind, source_path, target_path, True, True, make_target, held
        )

    def bound(self, source: Path, target: Path, device: str) -> None:
        self._own_devices.add(device)
        self.table.bound(_absolute(source), _absolute(target), read_only=True, device=device)

    async def unmount(
        self, target: Path, *, force: bool = False, remove_target: bool = False
    ) -> None:
        path = _absolute(target)
        for _ in range(_MAX_STACK):
            if not self.is_mount_point(target):
                break
            if force:
                # MNT_FORCE calls the file system's umount_begin (FUSE: abort the connection)
                # before MNT_DETACH: no stat, which would hang on a stuck server.
                await self._umount(target, MNT_FORCE | MNT_DETACH)
                continue
            top = self.table.top(path)
            if top is not None and top.device in self._own_devices:
                # A bind of our own file systems, which answer: no stat, in batches; the target
                # goes in the same hop if nothing is left below. Anything else (the kernel
                # refused) takes the path below.
                last = remove_target and self.table.depth(path) == 1
                try:
                    await self._batches.call(["unmount_own", path, last])
                except OSError:
                    pass
                else:
                    log.debug("umount2 target=%s flags=0x0", target)
                    self.table.unmounted(path, detached=False)
                    if last:
                        return
                    continue
            # stat() may reach a FUSE server, possibly our own: never on the trio thread.
            corrupted = await trio.to_thread.run_sync(_is_corrupted, target, abandon_on_cancel=True)
            await self._umount(target, MNT_DETACH if corrupted else 0)
        else:
            raise MountError(f"{target}: still a mount point after {_MAX_STACK} unmounts")
        if remove_target:
            await self._batches.call(["remove_dir", path])

    def close(self) -> None:
        """Stop the mount helper, if it runs (it also ends with the agent)."""
        self._helper.close()

    def start_helper(self) -> None:
        """Start the mount helper now rather than at the first bind (a Python start costs as
        much as a hundred binds). From the trio thread, which it lives as long as."""
        self._helper.start()

    def mount_points(self) -> tuple[MountPoint, ...]:
        """Read from the kernel (the whole table is asked for at start and stop only)."""
        return self.table.load()

    def is_mount_point(self, path: Path) -> bool:
        return self.table.is_mount_point(_absolute(path))

    def _is_bind_of(self, source: Path, target: Path) -> bool:
        """True if the top mount at `target` shows the same file system subtree as `source`."""
        top = self.table.top(os.path.abspath(target))
        if top is None:
            return False
        source_path = os.path.abspath(source)
        holder = self.table.holder(source_path)
        if holder is None:
            return False
        relative = os.path.relpath(source_path, holder.path)
        root = os.path.normpath(os.path.join(holder.root, relative))
        return (top.device, top.root) == (holder.device, root)

    async def _umount(self, target: Path, flags: int) -> None:
        log.debug("umount2 target=%s flags=%#x", target, flags)
        try:
            with trio.fail_after(self._command_timeout_s):
                await trio.to_thread.run_sync(
                    syscalls.umount2, str(target), flags, abandon_on_cancel=True
                )
        except trio.TooSlowError:
            raise MountError(
                f"umount {target}: timed out after {self._command_timeout_s:g}s"
            ) from None
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # not a mount point: the table was wrong (3)
                self.table.load()
                return
            raise MountError(f"umount {target}: {exc.strerror}") from exc
        self.table.unmounted(_absolute(target), detached=bool(flags & MNT_DETACH))

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


class _MountHelper:
    """The runner of the backend's batches: the mount helper process, started at the first
    batch, and again after one that failed."""

    def __init__(self) -> None:
        self._process: HelperProcess | None = None

    def close(self) -> None:
        if self._process is not None:
            self._process.close()
            self._process = None

    def start(self) -> HelperProcess:
        if self._process is None:
            self._process = HelperProcess("fusevol.mount.mount_helper")
        return self._process

    async def run(self, requests: Sequence[list[object]]) -> list[outcome.Outcome[object]]:
        process = self.start()
        try:
            answers = await process.call(list(requests))
        except BaseException:
            process.kill()
            self._process = None
            raise
        return [
            outcome.Value(result) if code == 0 else outcome.Error(OSError(code, result))
            for code, result in answers  # type: ignore[attr-defined]
        ]


def _absolute(path: Path) -> str:
    """The normalised absolute path (the agent's paths are absolute: no file system access)."""
    return os.path.abspath(path)


def _systemd_is_init() -> bool:
    """sd_booted(3): systemd is PID 1 when /run/systemd/system exists."""
    return os.path.isdir("/run/systemd/system")


def _is_corrupted(path: Path) -> bool:
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno in CORRUPTED_ERRNOS
    return False


if TYPE_CHECKING:
    _check: MountBackend = LinuxMountBackend(command_timeout_s=1)
