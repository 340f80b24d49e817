"""The publisher's helper processes: they perform the VFS operations on the agent's own mount.

Why not threads of the agent (as before): once the FUSE server has read a request, the thread
that sent it waits for the answer uninterruptibly (fs/fuse/dev.c `request_wait_answer`). If the
sender is a thread of the server's own process and the process is SIGKILLed, that thread waits for
an answer only its own dying process could give: the process never finishes dying, never closes
/dev/fuse, the mount never aborts, its lock is never released. A helper is another process and
holds no /dev/fuse descriptor: when the agent dies, its descriptor closes, the connection aborts,
the helper's request fails, and the helper, which asked for SIGKILL at its parent's death
(PR_SET_PDEATHSIG), is gone too. `fusevol.fuse.ops` accepts structural operations only from these
helpers (`Publisher.is_publisher`): their pids, or, seen from another PID namespace (a connection
taken over from an agent in another pod reports pid 0), root with their group, `PUBLISHER_GID`,
which each helper takes as it starts.

Protocol, one JSON line each way (`fusevol.base.helper_child`): `[op, args...]` -> `[errno,
message]` (errno 0: done). Paths are `os.fsdecode`d strings.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import os
from typing import TYPE_CHECKING, Any, cast

from fusevol.base import helper_child

if TYPE_CHECKING:
    from collections.abc import Callable

DATA = "..data"
DATA_TMP = "..data_tmp"

PUBLISHER_GID = 2_147_480_646
"""The group a helper takes as it starts, by which `Publisher.is_publisher` knows it where its pid
cannot be seen: a number no distribution or cluster hands out."""


def switch(root: str, name: str, missing: list[str], removed: list[str]) -> None:
    """Steps (6)-(11) of `Publisher.publish`: mkdir the staged version, symlink `..data_tmp` to it,
    rename it onto `..data`, then create the missing top-level links and unlink the removed."""
    tmp = _stage(root, name, None, warm=False)
    try:
        os.rename(tmp, os.path.join(root, DATA))  # (9)
    except OSError:
        _undo(os.path.join(root, name), tmp)
        raise
    links(root, missing)  # (10)
    unlinks(root, removed)  # (11)


def stage(root: str, name: str, files: list[str] | None = None) -> None:
    """Steps (6)-(8) of `Publisher.publish`, warming the kernel's caches before (9) makes the
    version visible: mkdir the staged version, list each of its directories (the kernel's
    READDIRPLUS: it then holds every name's entry and attributes), symlink `..data_tmp` to it and
    read that link back (the kernel caches a symlink's target). `commit` renames it onto
    `..data`: the dentry moves with everything the kernel holds under it."""
    _stage(root, name, files, warm=True)


def _stage(root: str, name: str, files: list[str] | None, *, warm: bool) -> str:
    """Steps (6)-(8), and with `warm` the look-ups of `stage`; the path of `..data_tmp`."""
    version = os.path.join(root, name)
    tmp = os.path.join(root, DATA_TMP)
    os.mkdir(version)  # (6) the staged content appears whole
    try:
        if warm:
            look_up(version, files)
        with contextlib.suppress(FileNotFoundError):  # left by a predecessor killed at (8)
            os.unlink(tmp)
        os.symlink(name, tmp)  # (8)
        if warm:
            os.readlink(tmp)
    except OSError:
        _undo(version, tmp)
        raise
    return tmp


def commit(root: str, name: str, missing: list[str], removed: list[str]) -> None:
    """Steps (9)-(11) after `stage`: rename `..data_tmp` onto `..data`, then create the missing
    top-level links (read back, so the kernel caches their targets) and unlink the removed."""
    tmp = os.path.join(root, DATA_TMP)
    try:
        os.rename(tmp, os.path.join(root, DATA))  # (9)
    except OSError:
        _undo(os.path.join(root, name), tmp)
        raise
    links(root, missing, read_back=True)  # (10)
    unlinks(root, removed)  # (11)
    # The renames and links made the kernel forget the volume directory's attributes, which
    # the first path walk through it asks for again (it checks modes): ask now, not the pod.
    os.readlink(os.path.join(root, DATA))


def warm(volumes: list[list[Any]]) -> None:
    """Volumes made whole in memory (`Publisher._create`), before they are bound anywhere (a CSI
    volume's while it is bound: `Publisher.publish`'s `warm_later`), each
    `[root, version name, top-level names, files]`: read `..data` and the top-level links back and
    look the version's files up (`look_up`), so the kernel holds what a first reader would have
    asked for. Best effort, volume by volume: one that fails is left cold. Several volumes are
    warmed side by side (`WARMERS`)."""
    if len(volumes) <= 1:
        for volume in volumes:
            _warm_volume(*volume)
        return
    with concurrent.futures.ThreadPoolExecutor(min(WARMERS, len(volumes))) as pool:
        for _ in pool.map(lambda volume: _warm_volume(*volume), volumes):
            pass


WARMERS = 4
"""Threads that warm new volumes side by side. Each request is a round trip to the agent, which
across CPUs costs more in wake-ups than the agent's answer (docs/fuse.md fact 5): one reader
at a time kept the agent waiting, four keep requests queued for it (100 volumes of one key:
37 ms one at a time, 9 ms with four threads; eight, 8 ms)."""


def _warm_volume(root: str, name: str, top: list[str], files: list[str] | None) -> None:
    with contextlib.suppress(OSError):
        os.readlink(os.path.join(root, DATA))
        for entry in top:
            with contextlib.suppress(OSError):  # (a name of a version's own: not a link)
                os.readlink(os.path.join(root, entry))
        look_up(os.path.join(root, name), files)


def look_up(version: str, files: list[str] | None) -> None:
    """Give the kernel the entry and attributes of every name in `version`: an lstat of each of
    `files` (a lookup each: fewer requests for a few files at its top), else a listing of every
    directory (`list_tree`)."""
    if files is None:
        list_tree(version)
        return
    for entry in files:
        os.lstat(os.path.join(version, entry))


def list_tree(path: str) -> None:
    """List `path` and every directory below it, through descriptors (a tenant's nesting may
    make a path longer than the kernel takes whole) and a stack of its own (as deep as it is)."""
    stack = [os.open(path, os.O_RDONLY | os.O_DIRECTORY)]
    try:
        while stack:
            fd = stack.pop()
            try:
                with os.scandir(fd) as entries:
                    below = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
                stack.extend(
                    os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                    for entry in below
                )
            finally:
                os.close(fd)
    finally:
        for fd in stack:
            os.close(fd)


def retire(version: str) -> None:
    """Step (12) of `Publisher.publish`: remove an old version, then read `..data` back: the
    removal made the kernel forget the volume directory's attributes (as `commit` says)."""
    os.rmdir(version)
    with contextlib.suppress(OSError):
        os.readlink(os.path.join(os.path.dirname(version), DATA))


def _undo(version: str, tmp: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(tmp)
    with contextlib.suppress(OSError):
        os.rmdir(version)


def links(root: str, names: list[str], *, read_back: bool = False) -> None:
    """Create `name -> ..data/name` for each name; an existing one is kept."""
    for entry in names:
        path = os.path.join(root, entry)
        with contextlib.suppress(FileExistsError):
            os.symlink(f"{DATA}/{entry}", path)
        if read_back:
            os.readlink(path)


def unlinks(root: str, names: list[str]) -> None:
    """Remove each top-level name; one already gone is no error (step (11) of `switch`)."""
    for entry in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(root, entry))


OPERATIONS: dict[str, Callable[..., None]] = {
    "mkdir": os.mkdir,
    "rmdir": os.rmdir,
    "unlink": os.unlink,
    "switch": switch,
    "stage": stage,
    "commit": commit,
    "warm": warm,
    "retire": retire,
    "links": links,
    "unlinks": unlinks,
}


def answer(request: object) -> list[object]:
    """`[op, args...]` -> `[0, ""]`, or `[errno, message]` if the operation failed."""
    op, *args = cast("list[Any]", request)
    try:
        OPERATIONS[op](*args)
    except OSError as exc:
        return [exc.errno or errno.EIO, exc.strerror or str(exc)]
    return [0, ""]


if __name__ == "__main__":
    os.setgroups([])
    os.setgid(PUBLISHER_GID)
    helper_child.main(answer)
