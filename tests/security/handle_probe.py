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
    try:
        os.close(os.open(os.path.join(bind, key), os.O_RDWR))
        result["open_for_writing"] = "allowed"
    except OSError as exc:
        result["open_for_writing"] = _name(exc)
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
