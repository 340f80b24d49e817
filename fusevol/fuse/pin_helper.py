"""The pin holder: a helper process that keeps the kernel's entries of served names alive.

The kernel forgets a FUSE file system's unused entries and inodes when memory runs short (or at
`echo 2 > /proc/sys/vm/drop_caches`), and each forgotten name costs its next reader a lookup
request. A tmpfs cannot forget its own: its entries are the storage. An entry that is in use
cannot be forgotten either, and an `O_PATH` descriptor keeps one in use (and its parents, which
it holds), so this process holds one for each name of a served version, as kubelet's tmpfs copy
would hold it: a cold `stat` or `open` of a key then costs the readlink of its link, one request,
where it cost three (docs/fuse.md fact 17). An `O_PATH` open reads nothing and takes no lock;
the kernel answers it from the entries that warming left (`fusevol.fuse.vfs_helper`), else with
a lookup each.

Another process than the agent, for the reason the publisher's helpers are (`vfs_helper`): its
lookups are requests the agent answers. It holds descriptors of the agent's mount only, never
of a pod's bind, so no pod's unmount waits on it; the agent's lazy unmount of its own mount does
not wait on it either, and the descriptors close with the process (at its parent's death too).

Protocol (`fusevol.base.helper_child`), one JSON line each way: first `["limit", n]` -> `[0, the
bound taken]` (fewer than n if the process may not open that many), then `["apply", ops]` ->
`[0, held]`, the descriptors held after the batch. Each op, for a volume's root path:
- `["pin", root, names, listed]`: hold `root/name` for each name (relative, at most `limit` in
  all; a name held already is held anew: `..data` names another version after each switch),
  with `listed` after listing the directories that hold them (`Holder.pin`);
- `["unpin", root, names]`: let go of each name and of everything below it (a version name
  lets go of the version's files);
- `["drop", root]`: let go of everything under root.
A name that cannot be opened (gone already: a later update removed it) is skipped.
"""

from __future__ import annotations

import contextlib
import os
import resource
from typing import Any, cast

from fusevol.base import helper_child

_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_SPARE_FDS = 64
"""Descriptors left to the process itself (its pipes, Python's own)."""


class Holder:
    def __init__(self, limit: int) -> None:
        """Hold at most `limit` descriptors (fewer if the process may not open that many)."""
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = limit + _SPARE_FDS
        if soft != resource.RLIM_INFINITY and soft < wanted:
            raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft != resource.RLIM_INFINITY:
            limit = max(0, min(limit, soft - _SPARE_FDS))
        self.limit = limit
        self._volumes: dict[str, dict[str, dict[str, int]]] = {}
        """root -> the first component of each held name (a link, `..data`, a version) -> the
        names held below it, each with its descriptor: a version is let go of in one step."""
        self.held = 0

    def pin(self, root: str, names: list[str], listed: bool = False) -> None:
        """Hold each of `names`; `listed` lists each directory that holds one first, so that the
        kernel has their entries from a few READDIRPLUS requests, not a lookup each (a version
        that was not warmed)."""
        if listed and self.held < self.limit:
            for directory in sorted({os.path.dirname(name) for name in names}):
                with contextlib.suppress(OSError):
                    os.listdir(os.path.join(root, directory))
        volume = self._volumes.setdefault(root, {})
        for name in names:
            group = volume.setdefault(name.split("/", 1)[0], {})
            previous = group.pop(name, None)
            if previous is not None:
                os.close(previous)
                self.held -= 1
            if self.held >= self.limit:
                continue
            try:
                group[name] = os.open(os.path.join(root, name), _FLAGS)
            except OSError:
                continue
            self.held += 1
        self._tidy(root)

    def unpin(self, root: str, names: list[str]) -> None:
        """Let go of each of `names` and of everything below it."""
        volume = self._volumes.get(root, {})
        for name in names:
            first = name.split("/", 1)[0]
            group = volume.get(first, {})
            below = name + "/"
            for each in [n for n in group if name == first or n == name or n.startswith(below)]:
                os.close(group.pop(each))
                self.held -= 1
        self._tidy(root)

    def drop(self, root: str) -> None:
        for group in self._volumes.pop(root, {}).values():
            for fd in group.values():
                os.close(fd)
                self.held -= 1

    def _tidy(self, root: str) -> None:
        volume = self._volumes.get(root)
        if volume is None:
            return
        for first in [first for first, group in volume.items() if not group]:
            del volume[first]
        if not volume:
            del self._volumes[root]

    def apply(self, ops: list[list[Any]]) -> None:
        for op, root, *names in ops:
            if op == "pin":
                self.pin(root, *names)
            elif op == "unpin":
                self.unpin(root, *names)
            elif op == "drop":
                self.drop(root)
            else:
                raise ValueError(f"unknown op {op!r}")


_holder: Holder | None = None


def answer(request: object) -> list[object]:
    """`["limit", n]` first (the holder's bound), then `["apply", ops]`: `[0, held]`."""
    global _holder
    op, argument = cast("list[Any]", request)
    if op == "limit":
        _holder = Holder(int(argument))
        return [0, _holder.limit]
    assert _holder is not None, "limit not set"
    _holder.apply(argument)
    return [0, _holder.held]


if __name__ == "__main__":
    helper_child.main(answer)
