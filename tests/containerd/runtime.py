"""containerd for the tests: its own daemon, a busybox rootfs, containers that bind pod volumes.

containerd (Debian's 1.6) is started by hand with its own configuration: the CRI plugin disabled,
root, state and sockets in a temporary directory, so nothing of the host's containerd (if any) is
touched. The rootfs is Debian's busybox-static and a few applet links: no image, no registry.
Containers run with runc; `ctr task exec` runs commands in them, as root or as another uid.

`LineClock` timestamps, on the host's monotonic clock, each line a container appends to a file of
a directory bound into it: busybox's `date` has no sub-second precision, and a `ctr task exec` per
probe costs ~70 ms, so the container writes one line per event and the host notes when it arrives.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

APPLETS = ("sh", "cat", "ls", "stat", "id", "touch", "sleep", "usleep", "echo", "mkdir", "rm")
TOOLS = ("containerd", "ctr", "runc")
BUSYBOX = "/bin/busybox"

needs_containerd = pytest.mark.skipif(
    os.geteuid() != 0
    or not os.path.exists("/dev/fuse")
    or any(shutil.which(tool) is None for tool in TOOLS)
    or not os.path.exists(BUSYBOX),
    reason="needs root, /dev/fuse, containerd, ctr, runc and busybox-static (.ci/setup)",
)

CONFIG = """\
version = 2
root = "{dir}/root"
state = "{dir}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{dir}/containerd.sock"
[ttrpc]
  address = "{dir}/containerd.sock.ttrpc"
"""


def build_rootfs(path: Path) -> Path:
    """A busybox rootfs at `path`, with an image's modes: its root 0755, /tmp 1777.

    pytest creates its temporary directories 0700; left so, the container's `/` is 0700 and a
    process of any uid but root fails every path lookup with EACCES (root passes on
    CAP_DAC_OVERRIDE), which looks like a permission problem of the volumes."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o755)
    for directory in ("bin", "etc", "proc", "sys", "dev", "tmp", "out"):
        (path / directory).mkdir(parents=True, exist_ok=True)
    shutil.copy2(BUSYBOX, path / "bin" / "busybox")
    for applet in APPLETS:
        (path / "bin" / applet).symlink_to("busybox")
    (path / "tmp").chmod(0o1777)
    return path


class Containerd:
    """A containerd daemon of its own in `directory`; `stop()` removes every container first."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.toml").write_text(CONFIG.format(dir=directory))
        self.socket = directory / "containerd.sock"
        self._log = open(directory / "containerd.log", "ab")  # noqa: SIM115 - the daemon's
        self._process = subprocess.Popen(
            ["containerd", "--config", str(directory / "config.toml")],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self._containers: list[str] = []
        self._rootfs: dict[str, Path] = {}
        deadline = time.monotonic() + 10
        while not self.socket.exists():
            if time.monotonic() > deadline or self._process.poll() is not None:
                raise RuntimeError((directory / "containerd.log").read_text())
            time.sleep(0.01)

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`ctr` on this daemon; with `check`, a failure raises with what ctr said."""
        ran = subprocess.run(
            ["ctr", "--address", str(self.socket), *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if check and ran.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)[:300]}: {ran.stderr.strip()}")
        return ran

    def run(
        self,
        name: str,
        rootfs: Path,
        *mounts: str,
        command: tuple[str, ...],
        annotations: Mapping[str, str] | None = None,
    ) -> str:
        """Start container `name` on `rootfs` in the background; each mount is a `--mount`
        value (`type=bind,src=...,dst=...,options=...`). `annotations`: OCI annotations of its
        bundle (`--annotation`), such as the `io.kubernetes.cri.*` ones containerd's CRI sets."""
        argv = ["run", "-d", "--env", "PATH=/bin", "--rootfs"]
        for key, value in (annotations or {}).items():
            argv += ["--annotation", f"{key}={value}"]
        for mount in mounts:
            argv += ["--mount", mount]
        self.ctr(*argv, str(rootfs), name, *command)
        self._containers.append(name)
        self._rootfs[name] = rootfs
        return name

    def exec(self, name: str, *command: str, user: int = 0) -> subprocess.CompletedProcess[str]:
        """Run `command` in container `name` as `user`; never raises for its exit status.

        The command's output and status go through files in the container's /tmp, not through
        ctr's pipes: Debian 12's ctr (containerd 1.6) deletes an exec'd process before it has
        drained its output, and so loses a short command's output now and then (measured: 2-3 of
        400 `cat`s under load printed nothing, exit 0; fixed upstream by containerd PR 13931,
        "ctr: drain exec output before cleanup")."""
        exec_id = f"e{time.monotonic_ns()}"
        script = 'out=$1; shift; "$@" >"$out.out" 2>"$out.err"; echo $? >"$out.rc"'
        argv = ("sh", "-c", script, "sh", f"/tmp/{exec_id}", *command)
        ran = self.ctr(
            "task", "exec", "--exec-id", exec_id, "--user", str(user), name, *argv, check=False
        )
        files = self._rootfs[name] / "tmp"
        try:
            code = int((files / f"{exec_id}.rc").read_text())
        except FileNotFoundError:  # the exec itself failed: ctr says why
            return ran
        result = subprocess.CompletedProcess(
            list(command),
            code,
            (files / f"{exec_id}.out").read_text(),
            (files / f"{exec_id}.err").read_text(),
        )
        for suffix in ("out", "err", "rc"):
            (files / f"{exec_id}.{suffix}").unlink()
        return result

    def pids(self, name: str) -> list[int]:
        """The processes of container `name`, as the host sees them (`ctr task ps`)."""
        listed = self.ctr("task", "ps", name).stdout.splitlines()[1:]  # PID INFO
        return [int(line.split()[0]) for line in listed if line.strip()]

    def remove(self, name: str) -> None:
        self.ctr("task", "kill", "--signal", "SIGKILL", name, check=False)
        for _ in range(100):
            if self.ctr("task", "delete", name, check=False).returncode == 0:
                break
            time.sleep(0.02)
        self.ctr("container", "delete", name, check=False)
        self._containers.remove(name)

    def stop(self) -> None:
        for name in list(self._containers):
            self.remove(name)
        self._process.terminate()
        self._process.wait(timeout=10)
        self._log.close()


def bind(src: Path, dst: str, *options: str) -> str:
    """A `ctr run --mount` value binding host directory `src` at `dst`."""
    return f"type=bind,src={src},dst={dst},options={':'.join(('rbind', *options))}"


class LineClock:
    """Follows a file a container appends lines to; notes when each complete line arrives.

    A `stamped` file's lines begin with the moment the container began the work the line reports:
    the first field of /proc/uptime (CLOCK_BOOTTIME, 10 ms steps), which a shell reads with its
    builtin `read`, no process needed. Such a line is noted at that moment instead, on the host's
    monotonic clock: when a reader looked, not when the scheduler let it finish (a container's
    processes may wait seconds for a CPU on a loaded machine)."""

    def __init__(self, path: Path, *, stamped: bool = False) -> None:
        self._path = path
        self._offset = (
            time.clock_gettime(time.CLOCK_BOOTTIME) - time.monotonic() if stamped else None
        )
        path.touch()
        self.lines: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        buffer = b""
        with open(self._path, "rb") as f:
            while not self._stop.is_set():
                chunk = f.read()
                if not chunk:
                    time.sleep(0.0005)
                    continue
                now = time.monotonic()
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                self.lines.extend(self._noted(now, line.decode()) for line in complete)

    def _noted(self, now: float, line: str) -> tuple[float, str]:
        if self._offset is None:
            return now, line
        stamp, _, text = line.partition(" ")
        return float(stamp) - self._offset, text

    def wait_for(self, text: str, *, after: float, timeout_s: float = 10.0) -> float:
        """The time of the first line equal to `text` noted after `after`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for at, line in list(self.lines):
                if at >= after and line == text:
                    return at
            time.sleep(0.001)
        raise TimeoutError(f"no line {text!r} within {timeout_s}s: {self.lines[-5:]}")

    def settled(
        self, text: str, *, after: float, within_s: float, patience_s: float = 30.0
    ) -> float:
        """For a `stamped` file: check that every line begun `within_s` or more after `after` is
        `text`, once one such line has come (waiting up to `patience_s` for it); return when the
        first `text` line begun after `after` was begun. A reader the scheduler held up meanwhile
        is not a late change; one that looks after `within_s` and still sees the old one is."""
        assert self._offset is not None, "settled() needs a stamped file"
        deadline, limit = time.monotonic() + patience_s, after + within_s
        while not any(at >= limit for at, _ in list(self.lines)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no line begun {within_s}s after the change: {self.lines[-5:]}")
            time.sleep(0.001)
        lines = [(at, line) for at, line in list(self.lines) if at >= after]
        late = [(at - after, line) for at, line in lines if at >= limit and line != text]
        if late:
            raise TimeoutError(f"still not {text!r} {within_s}s after the change: {late[:5]}")
        return next(at for at, line in lines if line == text)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
