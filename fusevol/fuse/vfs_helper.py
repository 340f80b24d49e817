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
    version = os.path.join(root, name)
    tmp = os.path.join(root, DATA_TMP)
    os.mkdir(version)  # (6) the staged content appears whole
    try:
        with contextlib.suppress(FileNotFoundError):  # left by a predecessor killed at (8)
            os.unlink(tmp)
        os.symlink(name, tmp)  # (8)
        os.rename(tmp, os.path.join(root, DATA))  # (9)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        with contextlib.suppress(OSError):
            os.rmdir(version)
        raise
    links(root, missing)  # (10)
    unlinks(root, removed)  # (11)


def links(root: str, names: list[str]) -> None:
    """Create `name -> ..data/name` for each name; an existing one is kept."""
    for entry in names:
        with contextlib.suppress(FileExistsError):
            os.symlink(f"{DATA}/{entry}", os.path.join(root, entry))


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
