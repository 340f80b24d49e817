"""`fusevol wait` and `fusevol mounts`: what a container runtime asks the agent, through the root.

Both read only what the agent publishes under the root: its status (`<root>/fusevol/status.json`,
`fusevol.observe.status`: each pod's volumes with state, path and last error, each container's
volumeMounts with the subPath resolved) and the mount table (the subPath views,
`fusevol.volumemanager.reconciler.subpaths`). No socket, no API: a runtime without kubelet calls
them before it creates a pod's containers, as kubelet waits for a pod's volumes and then turns its
volumeMounts into CRI mounts.

- `wait`: polls the status file (a stat every `poll_s`, read again only when it changed) until
  every volume of the pod is `mounted` and every subPath view of its containers is bound.
- `mounts`: one container's mounts (`fusevol.node.container_mounts.resolve`) as `ctr run --mount`
arguments, the
  OCI runtime spec's `mounts` array, or JSON.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from fusevol.base.errors import FusevolError
from fusevol.cli import status
from fusevol.fuse.servers import FOLLOW
from fusevol.node import layout
from fusevol.node.container_mounts import SubPathError, resolve, view_path

if TYPE_CHECKING:
    import argparse
    from pathlib import Path

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds in a Go duration (`2m`, `1m30s`, `500ms`) or a plain number of seconds."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    total, at = 0.0, 0
    for match in _DURATION.finditer(text):
        if match.start() != at:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        at = match.end()
    if at != len(text) or not text:
        raise FusevolError(f"--timeout {text!r}: not a duration (2m, 90s, 1m30s, 500ms)")
    return total


def find_pod(snapshot: dict[str, Any] | None, pod: str) -> dict[str, Any] | None:
    """The pod `namespace/name` or uid in the agent's status, if the agent knows it."""
    for entry in (snapshot or {}).get("pods", []):
        if not entry.get("desired", True):
            continue
        if entry["uid"] == pod or f"{entry['namespace']}/{entry['name']}" == pod:
            found: dict[str, Any] = entry
            return found
    return None


def not_ready(root: Path, pod: dict[str, Any]) -> list[str]:
    """What keeps the pod from running: each volume not set up (`name: state: last error`) and
    each subPath view not bound; empty once everything is there."""
    missing = [
        f"volume {v['name']!r}: {v['state']}" + (f": {v['last_error']}" if v["last_error"] else "")
        for v in pod["volumes"]
        if v["state"] != "mounted"
    ]
    if missing:
        return missing
    bound = set(FOLLOW.mounts(root))
    for container in pod.get("containers") or []:
        for mount in container["mounts"]:
            if mount.get("error"):
                missing.append(mount["error"])
            elif mount["subPath"] and _served(pod, mount["name"]):
                path = view_path(
                    os.path.realpath(root),
                    pod["uid"],
                    mount["name"],
                    container["name"],
                    mount["index"],
                )
                if path not in bound:
                    missing.append(
                        f"container {container['name']!r} volumeMount {mount['index']} "
                        f"({mount['name']} at {mount['mountPath']}): subPath view "
                        f"{mount['subPath']!r} not set up (not in the volume's current version?)"
                    )
    return missing


class StatusFile:
    """The agent's status file, read again only when it changed (its mtime, size or inode)."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._path = layout.status_file(root)
        self._key: tuple[int, int, int] | None = None
        self._data: dict[str, Any] | None = None

    def read(self) -> dict[str, Any] | None:
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            return None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self._key:
            try:
                self._data = status.read(self._root)
            except (OSError, ValueError):
                return self._data  # replaced while read: the next poll sees it
            self._key = key
        return self._data


def wait(root: Path, pod: str, *, timeout_s: float, poll_s: float = 0.1) -> list[str]:
    """Wait until every volume of `pod` is set up; [] then, else what is still missing."""
    status_file = StatusFile(root)
    deadline = time.monotonic() + timeout_s
    while True:
        running = status.agent_state(root).running
        entry = find_pod(status_file.read(), pod) if running else None
        problems = not_ready(root, entry) if entry is not None else []
        if entry is not None and not problems:
            return []
        if time.monotonic() >= deadline:
            if not running:
                return [f"no agent runs on {root}"]
            if entry is None:
                return [f"pod {pod} is not known to the agent (not in its source, or not yet)"]
            return problems
        time.sleep(poll_s)


def wait_message(pod: str, timeout_s: float, problems: list[str]) -> str:
    """kubelet's `unmounted volumes=[...]` line, then one line per problem."""
    names = [p.split("'")[1] for p in problems if p.startswith("volume '")]
    head = f"pod {pod}: timed out after {timeout_s:g}s waiting for its volumes"
    if names:
        head += f": unmounted volumes=[{' '.join(names)}]"
    return "\n".join([head, *(f"  {problem}" for problem in problems)])


def mounts(root: Path, pod: str, container: str, output: str) -> str:
    """`container`'s mounts in `output` format (ctr, oci or json)."""
    if not status.agent_state(root).running:
        raise FusevolError(f"no agent runs on {root}")
    entry = find_pod(StatusFile(root).read(), pod)
    if entry is None:
        raise FusevolError(f"pod {pod}: not known to the agent on {root}")
    try:
        resolved = resolve(os.path.realpath(root), entry, container)
    except SubPathError as exc:
        raise FusevolError(f"pod {pod}: {exc}") from None
    problems = [p for p in not_ready(root, entry) if f"container {container!r}" in p]
    if problems:
        raise FusevolError(f"pod {pod}: {problems[0]}")
    if output == "ctr":
        return " ".join(f"--mount {m.ctr()}" for m in resolved)
    if output == "oci":
        return json.dumps([m.oci() for m in resolved], indent=2)
    return json.dumps(
        {
            "pod": f"{entry['namespace']}/{entry['name']}",
            "uid": entry["uid"],
            "container": container,
            "mounts": [
                {**m.oci(), "readOnly": m.read_only, "propagation": m.propagation} for m in resolved
            ],
        },
        indent=2,
    )


def _served(pod: dict[str, Any], volume: str) -> bool:
    return any(
        v["name"] == volume
        and v.get("type") in ("configmap", "secret", "downward-api", "projected")
        for v in pod["volumes"]
    )


def main(args: argparse.Namespace) -> int:
    """`fusevol wait` and `fusevol mounts`."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if not args.root.is_dir():
        raise FusevolError(f"--root {args.root}: no such directory (is this the agent's root?)")
    if args.command == "mounts":
        print(mounts(args.root, args.pod, args.container, args.format))
        return 0
    timeout_s = parse_duration(args.timeout)
    problems = wait(args.root, args.pod, timeout_s=timeout_s)
    if problems:
        print(f"fusevol: {wait_message(args.pod, timeout_s, problems)}", file=sys.stderr)
        return 1
    return 0
