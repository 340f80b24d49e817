"""fsGroup ownership of the volumes served from memory: kubelet's `SetVolumeOwnership` walk.

For configMap, secret, downwardAPI and projected volumes kubelet runs the walk on every write,
always recursively (docs/kubelet.md fact 5): everything gets group fsGroup (symlinks too); files get
`mode | 0440` (the read-only mask: these volumes are read-only); directories get
`mode | 0440 | 0110 | setgid`. So 0644 stays 0644, 0600 becomes 0640, 0400 becomes 0440, the
version directory 0755 becomes 02755, a configMap root 0777 becomes 02777 and a tmpfs root 1777
becomes 3777. Without fsGroup nothing changes. Owners stay root but for files with an `fs_user`.

fusevol computes these modes before building a version, so the walk's result is there from the
first instant, with no window in which a file has its pre-walk mode.
"""

from __future__ import annotations

import stat
from typing import TYPE_CHECKING

from fusevol.model import FileProjection

if TYPE_CHECKING:
    from fusevol.model import Payload

READ_ONLY_MASK = 0o440
DIRECTORY_BITS = stat.S_ISGID | 0o110


def file_mode(mode: int, fs_group: int | None) -> int:
    return mode if fs_group is None else mode | READ_ONLY_MASK


def dir_mode(mode: int, fs_group: int | None) -> int:
    return mode if fs_group is None else mode | READ_ONLY_MASK | DIRECTORY_BITS


def apply_fs_group(payload: Payload, fs_group: int | None) -> Payload:
    """The payload with the walk's file modes. The bytes are shared, never copied."""
    if fs_group is None:
        return payload
    return {
        path: FileProjection(f.data, file_mode(f.mode, fs_group), f.fs_user)
        for path, f in payload.items()
    }
