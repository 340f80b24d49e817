"""systemd's notify protocol (Type=notify): readiness, stopping, the watchdog's pings, and the
file descriptor store.

Every call is a no-op outside such a unit ($NOTIFY_SOCKET unset). The unit sets
NotifyAccess=all because the agent is the launcher's child (fusevol.agent.launcher), and the
launcher takes $WATCHDOG_PID out of the child's environment so that the child's pings count.

`store_fds` is `sd_pid_notify_with_fds(..., "FDSTORE=1\nFDNAME=<name>", fds)`: systemd keeps the
descriptors (the unit's `FileDescriptorStoreMax=`) across a crash or a restart of the whole
service and hands them to the next start as `$LISTEN_FDS` (from fd 3 on) named in
`$LISTEN_FDNAMES` (`fusevol.agent.launcher` reads them back).
"""

from __future__ import annotations

import array
import os
import socket

import trio

READY = b"READY=1"
STOPPING = b"STOPPING=1"
WATCHDOG = b"WATCHDOG=1"


def notify(message: bytes) -> None:
    """Send `message` to systemd; no-op outside systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.sendto(message, address)


def store_fds(name: str, fds: list[int]) -> None:
    """Have systemd keep `fds` in the unit's file descriptor store under `name`; no-op outside
    systemd (and refused by systemd, harmlessly, without `FileDescriptorStoreMax=`)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    message = f"FDSTORE=1\nFDNAME={name}".encode()
    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.sendmsg([message], rights, 0, address)


async def watchdog() -> None:
    """Tell systemd we are alive at half its WatchdogSec, from the trio loop: a loop that froze
    stops the pings, and systemd restarts the agent. Returns at once outside such a unit."""
    usec = os.environ.get("WATCHDOG_USEC")
    if not usec or os.environ.get("WATCHDOG_PID", str(os.getpid())) != str(os.getpid()):
        return
    while True:
        notify(WATCHDOG)
        await trio.sleep(int(usec) / 2e6)
