"""A faithful Python port of kubelet's AtomicWriter, writing to a real directory (tmpfs in tests).

The yardstick for fusevol's layout: the tests write the same payload with this and compare the
two trees (names, types, modes, owners, symlink targets, contents), the version directory's name
aside. Ported from pkg/volume/util/atomic_writer.go (`Write`), with kubelet's umask 022.
"""

from __future__ import annotations

import os
import random
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from fusevol.model import FileProjection

DATA = "..data"
DATA_TMP = "..data_tmp"


def write(
    target: Path, payload: Mapping[str, FileProjection], *, fs_group: int | None = None
) -> None:
    """AtomicWriter.Write(payload, setPerms) into the existing directory `target`; with an
    fsGroup, setPerms is kubelet's ownership walk over the volume (read-only volume types)."""
    old_umask = os.umask(0o022)
    try:
        _write(target, payload, fs_group)
    finally:
        os.umask(old_umask)


def set_volume_ownership(directory: Path, fs_group: int) -> None:
    """`SetVolumeOwnership` for a read-only volume (pkg/volume/volume_linux.go, walkDeep):
    children before their directory; lchown to the group everywhere, symlinks included; chmod
    `mode | 0440` for files, `mode | 0440 | 0110 | setgid` for directories, never for symlinks."""
    for dirpath, dirnames, filenames in os.walk(directory, topdown=False):
        for name in [*filenames, *dirnames]:
            _own(Path(dirpath) / name, fs_group)
    _own(directory, fs_group)


def _own(path: Path, fs_group: int) -> None:
    os.lchown(path, -1, fs_group)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return
    mask = 0o440 | (stat.S_ISGID | 0o110 if stat.S_ISDIR(st.st_mode) else 0)
    os.chmod(path, stat.S_IMODE(st.st_mode) | mask)


def _write(target: Path, payload: Mapping[str, FileProjection], fs_group: int | None) -> None:
    cleaned = {os.path.normpath(p): f for p, f in payload.items()}  # (1)
    old_ts = os.readlink(target / DATA) if (target / DATA).is_symlink() else None  # (2)
    paths_to_remove: set[str] = set()
    if old_ts:  # (3)
        for dirpath, dirnames, filenames in os.walk(target / old_ts):
            for name in dirnames + filenames:
                rel = os.path.relpath(os.path.join(dirpath, name), target / old_ts)
                paths_to_remove.add(rel)
        for path in cleaned:
            parts = path.split("/")
            for i in range(1, len(parts) + 1):
                paths_to_remove.discard("/".join(parts[:i]))
    changed = old_ts is None or any(  # (4)
        not (target / old_ts / p).is_file() or (target / old_ts / p).read_bytes() != f.data
        for p, f in cleaned.items()
    )
    if changed or paths_to_remove:
        ts = time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime()) + str(random.getrandbits(32))
        ts_dir = target / ts  # (5)
        ts_dir.mkdir()
        ts_dir.chmod(0o755)
        for path, projection in cleaned.items():  # (6)
            file = ts_dir / path
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_bytes(projection.data)
            file.chmod(projection.mode)
            if projection.fs_user is not None:
                os.chown(file, projection.fs_user, -1)
        if fs_group is not None:  # (7) setPerms
            set_volume_ownership(target, fs_group)
        os.symlink(ts, target / DATA_TMP)  # (8)
        os.rename(target / DATA_TMP, target / DATA)  # (9)
    for path in cleaned:  # (10)
        top = path.split("/")[0]
        if not os.path.lexists(target / top):
            os.symlink(f"{DATA}/{top}", target / top)  # in a setgid root: group fsGroup
    for path in paths_to_remove:  # (11)
        if "/" not in path and os.path.lexists(target / path):
            os.remove(target / path)
    if (changed or paths_to_remove) and old_ts:  # (12)
        shutil.rmtree(target / old_ts)


@dataclass(frozen=True)
class Entry:
    kind: str
    mode: int
    uid: int
    gid: int
    content: bytes | str | None


def snapshot(root: Path) -> dict[str, Entry]:
    """Every entry below `root`, keyed by its relative path with the version name replaced by
    `<ts>`, plus the root itself as "."."""
    ts = os.readlink(root / DATA) if (root / DATA).is_symlink() else None
    result: dict[str, Entry] = {".": _entry(root)}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = os.path.relpath(path, root)
            if ts is not None:
                rel = rel.replace(ts, "<ts>")
            result[rel] = _entry(path, ts)
    return result


def _entry(path: Path, ts: str | None = None) -> Entry:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(path)
        if ts is not None:
            target = target.replace(ts, "<ts>")
        return Entry("link", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, target)
    if stat.S_ISDIR(st.st_mode):
        return Entry("dir", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, None)
    return Entry("file", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, path.read_bytes())
