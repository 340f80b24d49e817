"""What a container could reach of other pods' files through the one FUSE superblock: run inside
a mount namespace that holds one pod's bind only (tests/security/test_host_and_container.py).

    python handle_probe.py BIND KEY NAME... [--nodeid N]

Prints one JSON object: the handle of BIND/KEY, the sequential node ids that decode (generation
0), whether the mount's root lists, which NAMEs (other subtrees' readable names) open below the
root, and, for `--nodeid`, how many of 1024 guessed generations decode it.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import struct
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

FILEID_INO64_GEN = 0x81
_libc = ctypes.CDLL(None, use_errno=True)


class _FileHandle(ctypes.Structure):
    _fields_ = [
        ("handle_bytes", ctypes.c_uint),
        ("handle_type", ctypes.c_int),
        ("f_handle", ctypes.c_ubyte * 128),
    ]


def _error() -> OSError:
    code = ctypes.get_errno()
    return OSError(code, os.strerror(code))


def _name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, str(exc.errno))


def name_to_handle(path: str) -> tuple[int, int]:
    handle, mount_id = _FileHandle(), ctypes.c_int()
    handle.handle_bytes = 128
    if _libc.name_to_handle_at(
        -100, path.encode(), ctypes.byref(handle), ctypes.byref(mount_id), 0
    ):
        raise _error()
    high, low, generation = struct.unpack("<III", bytes(handle.f_handle[:12]))
    return high << 32 | low, generation


def open_by_handle(mount_fd: int, nodeid: int, generation: int) -> int:
    handle = _FileHandle()
    data = struct.pack("<III", nodeid >> 32, nodeid & 0xFFFFFFFF, generation)
    handle.handle_bytes = len(data)
    handle.handle_type = FILEID_INO64_GEN
    ctypes.memmove(handle.f_handle, data, len(data))
    fd = int(_libc.open_by_handle_at(mount_fd, ctypes.byref(handle), os.O_RDONLY))
    if fd < 0:
        raise _error()
    return fd


def main(argv: list[str]) -> dict[str, object]:
    bind, key, *names = argv
    guess = None
    if "--nodeid" in names:
        at = names.index("--nodeid")
        guess = int(names[at + 1])
        del names[at : at + 2]
    result: dict[str, object] = {}
    mount_fd = os.open(bind, os.O_RDONLY | os.O_DIRECTORY)
    try:
        result["own"] = name_to_handle(os.path.join(bind, "..data", key))
    except OSError as exc:
        result["own"] = _name(exc)
    decoded, refusals = [], set()
    for nodeid in range(1, 4096):
        try:
            os.close(open_by_handle(mount_fd, nodeid, 0))
            decoded.append(nodeid)
        except OSError as exc:
            refusals.add(_name(exc))
    result["decoded"], result["refusals"] = decoded, sorted(refusals)
    if 1 in decoded:
        root = open_by_handle(mount_fd, 1, 0)
        try:
            result["root_lists"] = sorted(os.listdir(root))
        except OSError as exc:
            result["root_lists"] = _name(exc)
        opened: dict[str, list[str] | str] = {}
        for name in names:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=root)
                opened[name] = os.listdir(fd)
                os.close(fd)
            except OSError as exc:
                opened[name] = _name(exc)
        result["names"] = opened
    if guess is not None:
        hits = 0
        for generation in range(1024):
            try:
                os.close(open_by_handle(mount_fd, guess, generation))
                hits += 1
            except OSError:
                pass
        result["guessed_generations_that_decode"] = hits
    result["changes"] = _changes(os.path.join(bind, key), bind)
    return result


def _changes(path: str, bind: str) -> dict[str, str]:
    """Every way at hand to change a served file or its cached pages, and what each answered."""
    import mmap

    def attempt(change: Callable[[], object]) -> str:
        try:
            change()
        except OSError as exc:
            return _name(exc)
        return "allowed"

    def mapped_writable() -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)

    return {
        "open O_RDWR": attempt(lambda: os.close(os.open(path, os.O_RDWR))),
        "open O_WRONLY|O_TRUNC": attempt(lambda: os.close(os.open(path, os.O_WRONLY | os.O_TRUNC))),
        "mmap MAP_SHARED writable": attempt(mapped_writable),
        "truncate": attempt(lambda: os.truncate(path, 0)),
        "chmod": attempt(lambda: os.chmod(path, 0o777)),
        "utime": attempt(lambda: os.utime(path, (0, 0))),
        "setxattr": attempt(lambda: os.setxattr(path, "user.x", b"1")),
        "unlink": attempt(lambda: os.unlink(path)),
        "rename ..data": attempt(lambda: os.rename(os.path.join(bind, "..data"), path + ".x")),
        "mkdir": attempt(lambda: os.mkdir(os.path.join(bind, "new"))),
        "symlink": attempt(lambda: os.symlink("x", os.path.join(bind, "new"))),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
