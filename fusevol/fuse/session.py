"""The agent's one FUSE mount: pyfuse3.init, main and close.

pyfuse3 keeps its session in a module global, so there is exactly one mount per process
(docs/fuse.md fact 1); every pod volume is a subtree of it, bind-mounted at the pod's volume
directory. Mount options: `allow_other` (containers run as other uids), `default_permissions` (the
kernel checks modes and owners from our attributes, as on kubelet's tmpfs), and a recognisable
fsname.

A successor can take over a live connection instead of mounting (`Connection`, `take_over`): a
process that kept a descriptor of it hands it over, with the kernel's INIT request that a patched
pyfuse3 processes again (`pyfuse3.resume`); the requests the dead agent had read are then sent
again by the kernel (FUSE_NOTIFY_RESEND).

Which pyfuse3 serves the mount is logged: fusevol's patched build (`.ci/install-pyfuse3`) gives
the fast read path (`fusevol.fuse.ops`), stock pyfuse3 works without it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
import struct
import subprocess
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import pyfuse3
import trio

from fusevol.node.layout import FUSE_SUBTYPE

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from pathlib import Path

log = logging.getLogger(__name__)

FSNAME = "fusevol"
_NOTIFY_RESEND = struct.pack("<IiQ", 16, 7, 0)
"""fuse_out_header {len 16, error FUSE_NOTIFY_RESEND, unique 0}: a notification, not a reply."""


def has_fast_read_path() -> bool:
    """True if the installed pyfuse3 can negotiate symlink caching and no_open (the patched one)."""
    return hasattr(pyfuse3, "negotiated_capabilities")


@dataclass(frozen=True, slots=True)
class Connection:
    """A live FUSE connection: a `/dev/fuse` descriptor and the kernel's INIT request on it."""

    fd: int
    init_request: bytes


def can_take_over() -> bool:
    """True if the installed pyfuse3 can resume a connection (fusevol's patched build)."""
    return hasattr(pyfuse3, "resume")


async def serve(
    operations: pyfuse3.Operations,
    mountpoint: Path,
    *,
    max_tasks: int,
    unmount: Callable[[], bool] = lambda: True,
    take_over: Connection | None = None,
    connected: Callable[[Connection], None] = lambda _: None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Mount at `mountpoint` (or, with `take_over`, answer a predecessor's live connection, mounted
    there), report started, answer requests until cancelled, then unmount unless `unmount()` says
    no (a lame duck's mountpoint is the next agent's: fusevol.agent.handover); closing the session
    aborts the connection unless another process holds a descriptor of it.

    `connected(connection)` is called once the kernel's INIT request has been answered (at once
    when taking over): its descriptor may then be kept elsewhere (`fusevol.agent.launcher`)."""
    options = {f"fsname={FSNAME}", f"subtype={FUSE_SUBTYPE}", "allow_other", "default_permissions"}
    if take_over is not None:
        _resume(operations, take_over, options)
    else:
        pyfuse3.init(operations, str(mountpoint), options)
    log.info(
        "FUSE %s mountpoint=%s pyfuse3=%s fast_read_path=%s",
        "taken over" if take_over else "mounted",
        mountpoint,
        importlib.metadata.version("pyfuse3"),
        "yes" if has_fast_read_path() else "no (stock pyfuse3: see .ci/install-pyfuse3)",
    )
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(pyfuse3.main, min_tasks=1, max_tasks=max_tasks))
            task_status.started()
            if take_over is not None:
                connected(take_over)
            elif can_take_over():
                # Polled: pyfuse3 answers the kernel's INIT in its own task and signals nothing;
                # the INIT arrives at once, so a few polls at most.
                while (request := pyfuse3.init_request()) is None:  # noqa: ASYNC110
                    await trio.sleep(0.005)
                connected(Connection(_session_fd(), request))
    finally:
        detach = unmount()
        pyfuse3.close(unmount=detach and take_over is None)
        if detach and take_over is not None:  # libfuse did not mount it, so it does not unmount
            subprocess.run(["umount", "--lazy", str(mountpoint)], check=False)  # noqa: ASYNC221
        log.info("FUSE %s mountpoint=%s", "unmounted" if detach else "closed", mountpoint)


def store_pages(files: Iterable[tuple[int, bytes]]) -> int:
    """Put each `(inode, content)` in the kernel's page cache of that inode (FUSE_NOTIFY_STORE),
    so that its first read is answered by the kernel; returns how many were stored. Blocking:
    the kernel locks the inode's pages, which a read it waits on us for may hold, so this runs on
    a worker thread, never the trio thread (docs/fuse.md fact 3). An inode the kernel does not
    hold (it never looked it up, or forgot it) is skipped: its first read asks us, as before."""
    stored = 0
    for inode, content in files:
        try:
            pyfuse3.notify_store(inode, 0, content)
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.debug("pages not stored inode=%d error=%s", inode, exc)
            break  # (ENOSYS: a kernel without it; anything else says the same of the rest)
        stored += 1
    return stored


def _resume(operations: pyfuse3.Operations, connection: Connection, options: set[str]) -> None:
    """Take the predecessor's connection over: a session on the descriptor, the same
    INIT processed again, then FUSE_NOTIFY_RESEND so that the kernel queues again every request
    the predecessor had read but not answered (Linux 6.9; older kernels refuse it, and those
    requests then wait until the connection ends)."""
    pyfuse3.init(operations, f"/dev/fd/{connection.fd}", options)
    pyfuse3.resume(connection.init_request)
    try:
        os.write(connection.fd, _NOTIFY_RESEND)
    except OSError as exc:
        log.warning(
            "the kernel cannot resend requests in flight (FUSE_NOTIFY_RESEND, Linux 6.9): "
            "those the previous agent had read wait until the connection ends error=%s",
            exc,
        )


def _session_fd() -> int:
    """pyfuse3's `/dev/fuse` descriptor (one session per process, so one such descriptor)."""
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{name}") == "/dev/fuse":
                return int(name)
    raise RuntimeError("no /dev/fuse descriptor in this process")
