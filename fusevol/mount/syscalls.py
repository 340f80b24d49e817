"""The mount system calls of the mount backend, with no trio: run in a worker thread of the agent
(`fusevol.mount.linux`) or in its mount helper process (`fusevol.mount.mount_helper`)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os

from fusevol.base.fsutil import mkdir_all

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_SHARED = 1 << 20
MNT_FORCE = 0x1
MNT_DETACH = 0x2
_KEPT_FLAGS = (  # statvfs f_flag bit (ST_*) -> the mount flag a read-only remount must keep
    (os.ST_NOSUID, MS_NOSUID),
    (os.ST_NODEV, MS_NODEV),
    (os.ST_NOEXEC, MS_NOEXEC),
)
_OPTION_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}
"""The same flags as mountinfo's per-mount options name them."""
_libc = ctypes.CDLL(None, use_errno=True)

# The new mount API (Linux 5.2, mount_setattr 5.12); the same numbers on every architecture.
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = os.O_CLOEXEC
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOUNT_ATTR_RDONLY = 0x1


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


_new_mount_api = True
"""False once the kernel said it has no mount_setattr (ENOSYS): binds are remounted instead."""


def mount2(source: str | None, target: str, flags: int) -> None:
    """mount(2) with no file system type and no data: binds and their remounts."""
    encoded = None if source is None else os.fsencode(source)
    if _libc.mount(encoded, os.fsencode(target), None, ctypes.c_ulong(flags), None) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), target)


def umount2(target: str, flags: int) -> None:
    if _libc.umount2(os.fsencode(target), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), target)


def _syscall(path: str, number: int, *args: object) -> int:
    """syscall(2) `number`; an OSError naming `path` if it fails."""
    result = int(_libc.syscall(ctypes.c_long(number), *args))
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return result


def _bind_read_only(source: str, target: str) -> bool:
    """Bind `source` on `target` read-only in one step: a clone of its mount, made read-only
    (keeping its nosuid, nodev, noexec) before it is attached. A bind made read-only by a
    remount afterwards is read-only in this mount namespace only: the copies that propagation
    made of it meanwhile (the host's, of a bind the chart's agent makes below kubelet's
    Bidirectional directory) stay read-write. False if the kernel lacks the calls."""
    global _new_mount_api
    if not _new_mount_api:
        return False
    flags = ctypes.c_uint(_OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC)
    attr = _MountAttr(attr_set=_MOUNT_ATTR_RDONLY)
    try:
        tree = _syscall(source, _SYS_OPEN_TREE, _AT_FDCWD, os.fsencode(source), flags)
        try:
            empty, size = ctypes.c_uint(_AT_EMPTY_PATH), ctypes.c_size_t(ctypes.sizeof(attr))
            _syscall(source, _SYS_MOUNT_SETATTR, tree, b"", empty, ctypes.byref(attr), size)
            into = ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH)
            _syscall(target, _SYS_MOVE_MOUNT, tree, b"", _AT_FDCWD, os.fsencode(target), into)
        finally:
            os.close(tree)
    except OSError as exc:
        if exc.errno != errno.ENOSYS:
            raise
        _new_mount_api = False  # before Linux 5.12: bind, then remount
        return False
    return True


def bind(
    source: str,
    target: str,
    read_only: bool,
    shared: bool,
    make_target: int | None,
    holder: tuple[str, list[str]] | None,
) -> str:
    """0. stat `source` for its device, and create `target` with mode `make_target` if given;
    1. bind `source` on `target` (if `read_only`, read-only in one step: `_bind_read_only`,
    and 2. is not needed); 2. if `read_only`, remount the bind read-only, keeping its
    nosuid/nodev/noexec (a bind remount sets exactly the flags given): those of `holder`, the
    (device, options) of the mount the table says `source` is on, if its device is the one the
    stat found, else a statvfs of the new bind (a request to a FUSE server: one per bind of a
    pod with 100 volumes); 3. if `shared`, make it a shared mount. A failure after step 1
    detaches the layer just added, and only it. Returns the source's device, `major:minor` as
    mountinfo shows it."""
    st_dev = os.stat(source).st_dev
    device = f"{os.major(st_dev)}:{os.minor(st_dev)}"
    if make_target is not None:
        mkdir_all(target, make_target)
    made_read_only = read_only and _bind_read_only(source, target)
    if not made_read_only:
        mount2(source, target, MS_BIND)
    try:
        if read_only and not made_read_only:
            if holder is not None and holder[0] == device:
                kept = {_OPTION_FLAGS[o] for o in holder[1] if o in _OPTION_FLAGS}
            else:
                f_flag = os.statvfs(target).f_flag
                kept = {mount for st, mount in _KEPT_FLAGS if f_flag & st}
            mount2(None, target, MS_REMOUNT | MS_BIND | MS_RDONLY | sum(kept))
        if shared:
            mount2(None, target, MS_SHARED)
    except OSError:
        umount2(target, MNT_DETACH)
        raise
    return device


def unmount_own(target: str, remove: bool) -> None:
    """umount2 the top mount at `target`; if `remove`, then rmdir the directory below."""
    umount2(target, 0)
    if remove:
        remove_dir(target)


def remove_dir(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(path)
