"""Run the real agent as a child process, the way a user does, and look at what it serves.

`AgentProcess` starts `python -m fusevol run` on a manifest directory (or, with
`manifests=None`, on the source its `extra_args` name) and a private root, waits
until it is ready, and on `stop()` sends SIGINT (the tearing-down stop) and checks that it exited 0
and left no mount below its root; `hand_over()` sends SIGTERM (the stop that leaves the pod
volumes mounted, and served by a lame duck, until the next agent has stacked its binds). The log
goes to a file the tests can read (`log_text()`, `LogTail`).

As tests/conftest.py does for in-process logs, an agent's log lines at WARNING or above (and any
traceback) fail the test during which they were logged, unless the test said it expects them
(`expect_log`): tests/conftest.py checks every agent started (`STARTED`) after each test that
passed, and `running_agent` when its body ends without an error of its own. `running_agent` also
makes sure the agent is gone and nothing is left mounted below its root, whatever state the test
left it in (a hung agent's FUSE connection is aborted, so a fault test cannot hang the suite).

`process` is `fusevol run`'s main process, the launcher (fusevol/agent/launcher.py), which signals
and exit statuses concern; `pid` is the agent proper, its child, which serves FUSE and may outlive
it as a lame duck. `kill()` is a crash: SIGKILL of the launcher, which takes the agent with it.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fusevol.node import layout

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

NODE = "test-node"
HAS_FUSE = os.geteuid() == 0 and os.path.exists("/dev/fuse")
"""Real FUSE mounts can be made here (root and /dev/fuse): tests/conftest.py skips without."""
_T = TypeVar("_T")


def mountinfo_below(root: Path) -> list[str]:
    """The /proc/self/mountinfo lines of the mounts below `root`, in mount order."""
    prefix = str(root.absolute()) + "/"
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return [line.strip() for line in f if line.split()[4].startswith(prefix)]


def mounts_below(root: Path) -> list[str]:
    """The mount points below `root`, in mount order (a stacked one as often as it is stacked)."""
    return [line.split()[4] for line in mountinfo_below(root)]


def wait_for(
    probe: Callable[[], _T | None], *, timeout_s: float = 10.0, interval_s: float = 0.002
) -> _T:
    """Poll `probe` until it returns something truthy; its exceptions count as 'not yet'."""
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = probe()
        except Exception as exc:
            last = exc
        else:
            if value:
                return value
        time.sleep(interval_s)
    raise TimeoutError(f"condition not met within {timeout_s}s (last error: {last!r})")


class AgentProcess:
    def __init__(
        self,
        *,
        manifests: Path | None,
        root: Path,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        wrapper: tuple[str, ...] = (),
    ) -> None:
        """`wrapper`: a command `fusevol run` runs under (`unshare --pid --fork ...`: as in a
        pod of its own); `pid` is then the wrapper's child, the launcher."""
        self._wrapper = wrapper
        self._source_args = () if manifests is None else ("--manifests", str(manifests))
        self.manifests = manifests if manifests is not None else root.parent / "no-manifests"
        self.root = root
        self.log_path = root.parent / f"{root.name}-agent.log"
        self._extra_args = extra_args
        self._env = None if env is None else {**os.environ, **env}
        self.process: subprocess.Popen[bytes] | None = None
        self._log_checked: int | None = None
        """Where in the log the next check for unexpected lines starts (bytes)."""
        self._expected_log: list[re.Pattern[str]] = []
        self.pid = 0
        """The agent proper (the launcher's child): known once `start()` returns."""

    def start(self) -> AgentProcess:
        argv = [
            *self._wrapper,
            sys.executable,
            "-m",
            "fusevol",
            "run",
            *self._source_args,
            "--root",
            str(self.root),
            "--node-name",
            NODE,
            "--log-level",
            "debug",
            "--http-port",
            "0",
            *self._extra_args,
        ]
        # A restart on the same root appends to the same log and finds the last status file:
        # only what this process writes counts.
        offset = len(self.log_text())
        if self._log_checked is None:
            self._log_checked = len(self.log_text().encode())
            STARTED.append(self)
        layout.status_file(self.root).unlink(missing_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self._env)
        log.close()
        wait_for(
            lambda: self._exited_early() or " ready " in self.log_text()[offset:], timeout_s=60
        )
        wait_for(layout.status_file(self.root).exists)
        launcher = self.process.pid
        with open(f"/proc/{launcher}/task/{launcher}/children") as f:
            self.pid = int(f.read().split()[0])
        return self

    def agent_alive(self) -> bool:
        """True while the agent proper runs (a zombie counts as gone)."""
        return pid_alive(self.pid)

    def wait_agent_gone(self, timeout_s: float) -> None:
        """Wait until the agent proper has exited; subprocess.TimeoutExpired if it has not."""
        deadline = time.monotonic() + timeout_s
        while self.agent_alive():
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"fusevol agent pid {self.pid}", timeout_s)
            time.sleep(0.005)

    def _exited_early(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"agent exited with {self.process.returncode}:\n{self.log_text()}")
        return False

    def expect_log(self, *patterns: str) -> AgentProcess:
        """Say that log lines at WARNING or above matching any of `patterns` (regular
        expressions, searched in the line) are expected: they do not fail the test."""
        self._expected_log.extend(re.compile(p) for p in patterns)
        return self

    def take_unexpected_log_lines(self) -> list[str]:
        """This agent's WARNING/ERROR/CRITICAL lines and tracebacks that no `expect_log` covers,
        logged since the last call (whole lines only)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_checked or 0)
                chunk = f.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1
        self._log_checked = (self._log_checked or 0) + end
        return [
            line
            for line in chunk[:end].decode(errors="replace").splitlines()
            if _PROBLEM.search(line) and not any(p.search(line) for p in self._expected_log)
        ]

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, *, check_clean: bool = True) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        code = self.process.wait(timeout=60)
        if check_clean:
            assert code == 0, self.log_text()
            assert mounts_below(self.root) == [], self.log_text()
        return code

    def hand_over(self) -> int:
        """SIGTERM: `fusevol run` exits 0 and leaves every pod volume mounted; the agent proper
        serves them on as a lame duck until the next agent releases it
        (fusevol/agent/handover.py)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=60)
        assert code == 0, self.log_text()
        return code

    def kill(self) -> None:
        """kill -9 of `fusevol run`: the agent proper dies with it (a crash)."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=10)
        self.wait_agent_gone(10)

    def kill_all(self) -> None:
        """kill -9 of `fusevol run` and of its agent at once (systemd's kill of the unit, a
        deleted pod): nothing of ours is left holding the connection."""
        assert self.process is not None
        self.process.kill()
        os.kill(self.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        self.wait_agent_gone(10)

    def volume(self, uid: str, plugin: str, name: str) -> Path:
        """A pod volume directory: `plugin` is `configmap` or `secret`."""
        return self.root / "pods" / uid / "volumes" / f"kubernetes.io~{plugin}" / name

    def wait_mounted(self, path: Path, *, timeout_s: float = 10.0) -> Path:
        wait_for(lambda: str(path) in mounts_below(self.root), timeout_s=timeout_s)
        return path

    def volume_status(self, uid: str, volume: str) -> dict[str, object]:
        """The volume's entry in the agent's status snapshot, or {} if it has none."""
        for pod in self.snapshot()["pods"]:
            for entry in pod["volumes"] if pod["uid"] == uid else ():
                if entry["name"] == volume:
                    return dict(entry)
        return {}

    def wait_state(self, uid: str, volume: str, state: str, *, timeout_s: float = 10.0) -> None:
        wait_for(lambda: self.volume_status(uid, volume).get("state") == state, timeout_s=timeout_s)

    def snapshot(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(layout.status_file(self.root).read_text())
        return data

    def status(self) -> str:
        return subprocess.run(
            [sys.executable, "-m", "fusevol", "status", "--root", str(self.root)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    def live_statistics(self) -> dict[str, Any]:
        """The components' counters now (`/status`, built when asked)."""
        code, body = self.http_get("/status")
        assert code == 200, body
        statistics: dict[str, Any] = json.loads(body)["statistics"]
        return statistics

    def wait_reconciled(self, *, timeout_s: float = 10.0) -> dict[str, Any]:
        """Until the reconciler has acted on everything its store holds now: a complete pass
        started from the store's generation, and no operation pending. What the agent would
        have done by then about a change already in the store (or already refused), it has
        done: a test may then assert that something did not happen. Returns the statistics."""

        def settled() -> dict[str, Any] | None:
            stats = self.live_statistics()
            reconciled = stats["reconciler"]["store_generation"] == stats["store"]["generation"]
            return stats if reconciled and stats["executor"]["pending"] == 0 else None

        found: dict[str, Any] = wait_for(settled, timeout_s=timeout_s, interval_s=0.01)
        return found

    def http_get(self, path: str) -> tuple[int, str]:
        """GET `path` from the agent's HTTP server: (status, body)."""
        ports = re.findall(r"http listening address=\S*:(\d+)", self.log_text())
        assert ports, "the agent logged no HTTP address"
        try:  # the last agent's: a restart on the same root appends to the same log
            with urllib.request.urlopen(f"http://127.0.0.1:{ports[-1]}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """The samples called `name` (a counter's `..._total`) in the agent's /metrics: labels,
        value."""
        families = text_string_to_metric_families(self.http_get("/metrics")[1])
        return [(s.labels, s.value) for f in families for s in f.samples if s.name == name]

    def fuse_requests(self) -> collections.Counter[str]:
        """`fusevol_fuse_requests_total` by operation, from the agent's /metrics."""
        return collections.Counter(
            {
                labels["operation"]: int(value)
                for labels, value in self.samples("fusevol_fuse_requests_total")
            }
        )

    def fuse_mountpoint(self) -> Path:
        return layout.fuse_mountpoint(self.root)

    def fuse_subtree(self, volume: Path) -> Path:
        """Where the served volume bound at `volume` is on the agent's own mount: the root of
        the top bind there (mountinfo's 4th field), below the FUSE mountpoint."""
        wanted = str(volume.absolute())
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            roots = [line.split()[3] for line in f if line.split()[4] == wanted]
        assert roots, f"{volume} is not a mount point"
        return self.fuse_mountpoint() / roots[-1].lstrip("/")


_PROBLEM = re.compile(
    r"^<[234]>|^\d\d:\d\d:\d\d\.\d{3} (WARNING|ERROR|CRITICAL) |^Traceback \(most recent"
)
"""A log line that fails a test unless expected (the plain format, or journald's priorities)."""


STARTED: list[AgentProcess] = []
"""Every agent started (by any test): tests/conftest.py checks their logs after each test."""


def fail_on_unexpected_log_lines(agents: list[AgentProcess]) -> None:
    """Fail the test if one of `agents` logged an unexpected line since the last check."""
    unexpected = [line for agent in agents for line in agent.take_unexpected_log_lines()]
    if unexpected:
        pytest.fail(
            "unexpected agent log lines at WARNING or above:\n" + "\n".join(unexpected[:20]),
            pytrace=False,
        )


@contextlib.contextmanager
def running_agent(
    manifests: Path | None,
    root: Path,
    *extra_args: str,
    env: dict[str, str] | None = None,
    expect_log: tuple[str, ...] = (),
    wrapper: tuple[str, ...] = (),
) -> Iterator[AgentProcess]:
    """An agent started on `manifests` (see `AgentProcess`, and its `wrapper`), checked and
    removed at the end.

    `expect_log`: patterns of the WARNING/ERROR lines the test provokes (see `expect_log()`);
    a test can also declare them later on the agent it gets.
    """
    agent = AgentProcess(
        manifests=manifests, root=root, extra_args=extra_args, env=env, wrapper=wrapper
    )
    agent.expect_log(*expect_log)
    try:
        yield agent.start()  # inside: an agent that fails to get ready is removed too
        fail_on_unexpected_log_lines([agent])
    finally:
        if agent.process is not None and agent.process.poll() is None:
            agent.process.send_signal(signal.SIGINT)  # the tearing-down stop, if it still can
            with contextlib.suppress(subprocess.TimeoutExpired):
                agent.process.wait(timeout=10)
        force_stop(agent)


def force_stop(agent: AgentProcess, *, patience_s: float = 1.5) -> None:
    """Make sure `agent` is gone and nothing is mounted below its root, whatever state it is in.

    A SIGKILLed agent can be left with a thread waiting on its own FUSE mount (see
    tests/fuse/test_faults.py): it never exits until the connection is aborted, which
    `umount -f` does for FUSE even when it then answers "target is busy". Only a lazy unmount
    of the rest follows.
    """
    process = agent.process
    if process is not None and process.poll() is None:
        process.kill()
        process.wait(timeout=10)
    if agent.pid and agent.agent_alive():  # a lame duck, or an agent dying with its launcher
        with contextlib.suppress(ProcessLookupError):
            os.kill(agent.pid, signal.SIGKILL)
        try:
            agent.wait_agent_gone(patience_s)
        except subprocess.TimeoutExpired:
            abort_fuse_connection(agent)
            agent.wait_agent_gone(10)
    for path in reversed(mounts_below(agent.root)):
        subprocess.run(["umount", "-l", path], check=False)


def abort_fuse_connection(agent: AgentProcess) -> None:
    """`umount -f` of the agent's FUSE mount: the kernel aborts the connection (fuse_umount_begin)
    even if the unmount itself then fails as busy."""
    mountpoint = str(agent.fuse_mountpoint())
    subprocess.run(["umount", "-f", mountpoint], check=False, capture_output=True)


class LogTail:
    """Reads an agent log incrementally, so a long test does not re-read the whole file."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = path.stat().st_size if path.exists() else 0
        self.text = ""

    def read_new(self) -> str:
        try:
            with open(self._path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return ""
        # Only whole lines: a line being written is read on the next call.
        end = chunk.rfind(b"\n") + 1
        self._offset += end
        new = chunk[:end].decode(errors="replace")
        self.text += new
        return new

    def wait_line(self, *parts: str, timeout_s: float = 10.0) -> str:
        """The first new line (since this tail started) holding every one of `parts`."""

        def probe() -> str | None:
            self.read_new()
            return next(
                (line for line in self.text.splitlines() if all(p in line for p in parts)), None
            )

        return wait_for(probe, timeout_s=timeout_s, interval_s=0.005)


def pid_alive(pid: int) -> bool:
    """True if process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def write_atomically(path: Path, text: str) -> None:
    """Save a file the way editors do: write a temporary file, then rename it into place."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Holder:
    """`fusevol hold` on `root`, as the chart's holder pod runs it."""

    def __init__(self, root: Path, *args: str) -> None:
        self.log_path = root.parent / f"{root.name}-holder.log"
        argv = [sys.executable, "-m", "fusevol", "hold", "--root", str(root), *args]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: "holding FUSE connections" in self.log_text())

    def log_text(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def stop(self) -> int:
        self.process.terminate()
        return self.process.wait(timeout=10)
