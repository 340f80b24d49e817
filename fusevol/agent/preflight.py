"""Start-up checks: an ordinary mistake is one line saying what is wrong and what to do.

`fusevol run` and `fusevol teardown` call `check()` in the launcher, before the agent is forked
and before anything is created below the root, so that a mistake never surfaces as a traceback
from deep inside the agent (an ExceptionGroup ending in `NotADirectoryError`, pyfuse3's
`RuntimeError: fuse_session_mount failed`). Each check raises `FusevolError` with the message
`fusevol.cli` prints as `fusevol: <message>`:

1. root: the agent mounts FUSE and bind mounts, and its lock and state are root's;
2. `--root`: a directory, or creatable (its nearest existing ancestor is a directory);
3. `/dev/fuse` (run only): present and openable read-write;
4. `--kubeconfig` (run only): readable (its content is checked by the client, also one line);
5. `--http-host`/`--http-port` (run only): an address of this host, and the port free. A
   predecessor that was killed may still hold it for a moment while it dies, so a port in use is
   tried again for `PORT_WAIT_S` first. Skipped while an agent runs on the root: the agent's own
   refusal ("another fusevol agent is using ...") says more, or, with `--replace`, if that agent
   can be taken over (its hand-over socket answers), we take its connection and then its port (a
   rollout, whose two pods see each other's lock only as a socket). (`fusevol.observe.http`
   reports a
   failure that comes later, a race with another program, as one line too.)

Excludes: validating flag values (`fusevol.cli`), anything that needs the agent's lock.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from pathlib import Path

from fusevol.base.errors import FusevolError
from fusevol.base.fsutil import flock_held
from fusevol.node import layout

FUSE_DEVICE = Path("/dev/fuse")
PORT_WAIT_S = 3.0


def check(
    *,
    root: Path,
    kubeconfig: Path | None,
    fuse: bool,
    http: tuple[str, int] | None = None,
    replace: bool = False,
) -> None:
    """Checks 1-5 of the module docstring; raises `FusevolError` at the first that fails.
    `http`: (host, port) the agent will listen on; None (or a negative port): none."""
    if os.geteuid() != 0:  # (1)
        raise FusevolError(
            "must run as root: it mounts FUSE and bind mounts (sudo fusevol ..., or the "
            "systemd unit, or the chart's privileged DaemonSet)"
        )
    check_root(root)  # (2)
    if fuse:
        check_fuse_device(FUSE_DEVICE)  # (3)
    if kubeconfig is not None:  # (4)
        try:
            kubeconfig.open("rb").close()
        except OSError as exc:
            raise FusevolError(
                f"--kubeconfig {kubeconfig}: cannot read it: {exc.strerror or exc}"
            ) from None
    takes_over = replace and _serving(root)
    if http is not None and http[1] > 0 and not _agent_runs(root) and not takes_over:  # (5)
        check_port(*http)


def _agent_runs(root: Path) -> bool:
    try:
        return flock_held(os.stat(layout.agent_dir(root) / "lock"))
    except OSError:
        return False


def _serving(root: Path) -> bool:
    """An agent that can be taken over serves on `root` (its hand-over socket answers): we take
    its connection over, and its HTTP port is ours once it has let go. Seen from another pod,
    whose /proc/locks does not show that agent's lock (`_agent_runs`)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(layout.handover_socket(root)))
        except OSError:
            return False
    return True


def check_root(root: Path) -> None:
    """`root` is a directory, or can be made one: every existing ancestor is a directory."""
    path = root.absolute()
    for candidate in (path, *path.parents):
        try:
            if candidate.is_dir():
                return
            if candidate.exists() or candidate.is_symlink():
                what = "it" if candidate == path else str(candidate)
                raise FusevolError(
                    f"--root {root}: {what} is not a directory; give a directory "
                    "(it is created if missing)"
                )
        except OSError as exc:
            raise FusevolError(f"--root {root}: {exc.strerror or exc}") from None


def check_fuse_device(device: Path) -> None:
    """The FUSE device is there and opens read-write (what libfuse's mount needs)."""
    try:
        fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise FusevolError(
                f"no {device}: load the fuse module (modprobe fuse); in a container, pass the "
                f"device (--device {device}, or the chart's hostPath)"
            ) from None
        raise FusevolError(
            f"cannot open {device}: {exc.strerror}; in a container, allow the device "
            "(privileged, or a device cgroup rule for c 10:229)"
        ) from None
    os.close(fd)


def check_port(host: str, port: int, *, wait_s: float = PORT_WAIT_S) -> None:
    """Every address `host` names can listen on `port` (as trio's listeners will: SO_REUSEADDR)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            for family, kind, proto, _, address in socket.getaddrinfo(
                host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            ):
                with socket.socket(family, kind, proto) as sock:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    if family == socket.AF_INET6:
                        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                    sock.bind(address)
            return
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE and time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            raise FusevolError(
                f"--http-host {host} --http-port {port}: cannot listen: {exc.strerror or exc}; "
                "choose another with --http-host/--http-port (--http-port -1: no HTTP endpoints)"
            ) from None
