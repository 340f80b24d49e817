"""`fusevol status`: whether an agent runs on the root, and what it serves or what is left.

Reads the agent's snapshot (`<root>/fusevol/status.json`, written by
`fusevol.observe.status`), so it works without any connection to the agent. A snapshot outlives
its agent, so it first finds out whether an agent runs (`agent_state`): the agent holds an flock
on `<root>/fusevol/lock`, which `/proc/locks` shows without taking it (taking it, even for a
moment, could make an agent starting then refuse to run). Without an agent the snapshot is not
shown as current; what is really still mounted below the root comes from
`/proc/self/mountinfo` (`mounted_below`).
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from fusevol.base.errors import FusevolError
from fusevol.base.fsutil import flock_held
from fusevol.mount.linux import LinuxMountBackend
from fusevol.node import layout

if TYPE_CHECKING:
    import argparse
    from pathlib import Path


@dataclass(frozen=True, slots=True)
class AgentState:
    running: bool
    """An agent holds the lock on the root: it reconciles, and its snapshot is current."""
    pid: int | None
    """The running agent's, or the lame duck's (from the lock file; None if unreadable)."""
    lame_duck: bool
    """No agent runs, but the last one handed over and still serves its volumes."""


def agent_state(root: Path, *, locks: str = "/proc/locks") -> AgentState:
    """Whether an agent runs on `root`, from `/proc/locks` (module docstring)."""
    lock = layout.agent_dir(root) / "lock"
    try:
        st = os.stat(lock)
    except FileNotFoundError:
        return AgentState(running=False, pid=None, lame_duck=False)
    held = flock_held(st, locks=locks)
    pid, handing_over = None, False
    try:
        words = lock.read_text(encoding="utf-8", errors="replace").split()
        pid = int(words[0]) if words and words[0].isdigit() else None
        handing_over = len(words) > 1
    except OSError:  # not root: the lock file is 0600
        pass
    lame_duck = not held and handing_over and pid is not None and _alive(pid)
    return AgentState(running=held, pid=pid if held or lame_duck else None, lame_duck=lame_duck)


def mounted_below(root: Path) -> list[dict[str, str]]:
    """Every mount at or below `root` now, outermost first: path (relative to the root),
    file system type and source."""
    top = os.path.realpath(root)
    table = LinuxMountBackend(command_timeout_s=0, systemd_run=False).mount_points()
    return [
        {"path": os.path.relpath(m.path, top), "fstype": m.fstype, "source": m.source}
        for m in table
        if m.path == top or m.path.startswith(top.rstrip("/") + "/")
    ]


def collect(root: Path) -> dict[str, Any]:
    """What `fusevol status` shows: the agent's snapshot if an agent runs (else its pods are
    not shown: nothing serves them), with `agent` and `mounts` (the mount table) added."""
    state = agent_state(root)
    try:
        snapshot = read(root)
    except FileNotFoundError:
        snapshot = None
    if not state.running:
        snapshot = {
            "node": snapshot["node"] if snapshot else None,
            "written_at": snapshot["written_at"] if snapshot else None,
            "pods": [],
        }
    result: dict[str, Any] = dict(snapshot or {"node": None, "written_at": None, "pods": []})
    result["agent"] = asdict(state)
    result["mounts"] = mounted_below(root)
    return result


def read(root: Path) -> dict[str, Any]:
    with open(layout.status_file(root), encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


def render_collected(status: dict[str, Any], root: Path) -> str:
    """`collect()`'s answer for people: the snapshot when an agent runs, else what is mounted."""
    agent = status["agent"]
    if agent["running"]:
        head = f"agent running pid={agent['pid'] or '?'} root={root}"
        if status["written_at"] is None:
            return f"{head}\nno status written yet"
        return f"{head}\n{render(status)}"
    lines = [f"no agent runs on {root}"]
    if status["written_at"] is not None:
        age = time.time() - status["written_at"]
        lines[0] += f" (the last agent's status, written {age:.1f}s ago, is not shown)"
    if agent["lame_duck"]:
        lines.append(
            f"a lame duck (pid {agent['pid']}) still serves the last agent's volumes until an "
            "agent starts"
        )
    mounts = status["mounts"]
    if not mounts:
        lines.append(f"nothing is mounted below {root}")
        return "\n".join(lines)
    lines.append(f"still mounted below {root} (from /proc/self/mountinfo):")
    width = max(len(m["path"]) for m in mounts)
    lines.extend(f"  {m['path']:<{width}}  {m['fstype']}" for m in mounts)
    if not agent["lame_duck"]:
        lines.append(f"start an agent to serve them again, or `fusevol teardown --root {root}`")
    return "\n".join(lines)


def render(status: dict[str, Any]) -> str:
    """A human-readable table of a status snapshot."""
    age = time.time() - status["written_at"]
    lines = [f"node {status['node']} (status written {age:.1f}s ago)"]
    if not status["pods"]:
        lines.append("no pods")
    for pod in status["pods"]:
        title = f"{pod['namespace']}/{pod['name']}" if pod["name"] else "(pod gone)"
        lines.append(f"pod {title} uid={pod['uid']}")
        for volume in pod["volumes"]:
            line = f"  {volume['name']:<24} {volume['type']:<12} {volume['state']:<14}"
            versions = volume.get("objects") or {}
            if versions:
                line += " " + ",".join(f"{k}@{v or 'missing'}" for k, v in versions.items())
            if volume.get("updated_at"):
                line += f"  updated {time.time() - volume['updated_at']:.0f}s ago"
            if volume["last_error"]:
                line += f"  error: {volume['last_error']}"
            if volume["next_retry_in_s"] is not None:
                line += f"  (retry in {volume['next_retry_in_s']:.1f}s)"
            lines.append(line)
    for frozen in status.get("frozen_volumes", []):
        pod = f"{frozen['namespace']}/{frozen['pod']}" if frozen["pod"] else frozen["uid"]
        lines.append(f"FROZEN pod {pod}: {frozen['message']}")
    for audited in status.get("audited_volumes", []):
        read = ", ".join(f"{path} ({opens})" for path, opens in audited["read"].items())
        never = ", ".join(audited["never_read"])
        lines.append(
            f"AUDIT pod {audited['namespace']}/{audited['pod']} volume {audited['volume']}: "
            f"read {read or 'nothing'}; never read: {never or 'none'}"
        )
    return "\n".join(lines)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def main(args: argparse.Namespace) -> int:
    """`fusevol status`."""
    # `fusevol status | head`: end quietly at the closed pipe, as a C tool would.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if not args.root.is_dir():
        raise FusevolError(f"--root {args.root}: no such directory (is this the agent's root?)")
    collected = collect(args.root)
    print(json.dumps(collected, indent=2) if args.json else render_collected(collected, args.root))
    return 0
