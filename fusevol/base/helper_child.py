"""The process side of the agent's helper processes (`fusevol.base.helper_parent` starts them).

A helper is a module of fusevol run as `python -m <module> <agent pid>` that answers one JSON line
for each JSON line it reads. It does, in a process of its own, what must not run in the agent's
threads: VFS operations on the agent's own mount (`fusevol.fuse.vfs_helper`, which says why) and
batches of mount system calls (`fusevol.mount.mount_helper`: its Python steps never wait for the
agent's GIL). It ignores SIGINT and SIGTERM (a Ctrl-C on the terminal reaches the whole process
group; the agent still needs its helpers to tear volumes down) and ends at EOF on stdin or at its
parent's death (PR_SET_PDEATHSIG). It imports nothing of fusevol's runtime (no pyfuse3, no trio).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def serve(parent: int, answer: Callable[[object], object]) -> int:
    """Answer every request line on stdin with `answer(request)` on stdout, until EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        return 1
    for line in sys.stdin:
        reply = answer(json.loads(line))
        try:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
        except BrokenPipeError:  # the agent is gone
            os._exit(0)
    return 0


def main(answer: Callable[[object], object]) -> None:
    """`python -m <helper module> <agent pid>`."""
    sys.exit(serve(int(sys.argv[1]), answer))
