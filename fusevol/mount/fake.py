"""A mount backend that mounts nothing: an in-memory mount table and a log of what was asked.

For unit tests of what sits above the backend (volume plugins, reconstruction, the reconciler):
they check the exact actions without root, and the Protocol's idempotency rules hold as they do
for the real backend (`fusevol.mount.linux`), which tests/fuse/test_mount_plugins.py checks on
real mounts.
mypy proves the fake conforms to `MountBackend` (the `_check` below), as mount-utils'
`var _ Interface = &FakeMounter{}` does.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fusevol.base.fsutil import mkdir_all
from fusevol.mount.mountinfo import MountPoint

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from fusevol.base.errors import MountError
    from fusevol.mount.backend import MountBackend


@dataclass(frozen=True, slots=True)
class Action:
    """One call that changed the table: `verb` is mount, bind or unmount."""

    verb: str
    target: str
    source: str = ""
    fstype: str = ""
    options: tuple[str, ...] = ()


@dataclass
class FakeMountBackend:
    actions: list[Action] = field(default_factory=list)
    """Every call that changed the table, in order (sensitive options are never recorded)."""
    fail_next: MountError | None = None
    """Raised, once, by the next mount or bind (the table unchanged), as a failing mount(8)."""
    _table: list[MountPoint] = field(default_factory=list)
    _next_id: int = 100

    async def mount(
        self,
        source: str,
        target: Path,
        *,
        fstype: str | None = None,
        options: Sequence[str] = (),
        sensitive_options: Sequence[str] = (),
    ) -> None:
        if self.is_mount_point(target):
            return
        self._fail_if_asked()
        self._add(source=source, target=target, root="/", fstype=fstype or "none", options=options)
        self.actions.append(Action("mount", str(target), source, fstype or "", tuple(options)))

    async def bind(
        self,
        source: Path,
        target: Path,
        *,
        read_only: bool,
        stack: bool = False,
        make_target: int | None = None,
    ) -> None:
        top = self._top(target)
        if top is not None and (not stack or top.root == str(source)):
            return
        self._fail_if_asked()
        if make_target is not None and top is None:
            mkdir_all(target, make_target)
        options = ("ro",) if read_only else ("rw",)
        self._add(source="bind", target=target, root=str(source), fstype="bind", options=options)
        self.actions.append(Action("bind", str(target), str(source), "", options))

    def bind_later(self, source: Path, target: Path, *, make_target: int) -> Callable[[], str]:
        def bind() -> str:  # the table changes on the trio thread only: `bound`
            self._fail_if_asked()
            mkdir_all(target, make_target)
            return "0:0"

        return bind

    def bound(self, source: Path, target: Path, device: str) -> None:
        self._add(source="bind", target=target, root=str(source), fstype="bind", options=("ro",))
        self.actions.append(Action("bind", str(target), str(source), "", ("ro",)))

    async def unmount(
        self, target: Path, *, force: bool = False, remove_target: bool = False
    ) -> None:
        if self.is_mount_point(target):
            self._table = [mp for mp in self._table if mp.path != str(target)]
            options = ("force",) if force else ()
            self.actions.append(Action("unmount", str(target), options=options))
        if remove_target:
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(target)

    def mount_points(self) -> tuple[MountPoint, ...]:
        return tuple(self._table)

    def is_mount_point(self, path: Path) -> bool:
        return self._top(path) is not None

    def _top(self, path: Path) -> MountPoint | None:
        stacked = [mp for mp in self._table if mp.path == str(path)]
        return stacked[-1] if stacked else None

    def _add(
        self, *, source: str, target: Path, root: str, fstype: str, options: Sequence[str]
    ) -> None:
        self._next_id += 1
        parent = self._top(target)
        self._table.append(
            MountPoint(
                mount_id=self._next_id,
                parent_id=parent.mount_id if parent else 1,
                root=root,
                path=str(target),
                options=tuple(options),
                fstype=fstype,
                source=source,
            )
        )

    def _fail_if_asked(self) -> None:
        error, self.fail_next = self.fail_next, None
        if error is not None:
            raise error


if TYPE_CHECKING:
    _check: MountBackend = FakeMountBackend()
