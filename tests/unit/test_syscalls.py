"""The mount backend's read-only bind (`fusevol.mount.syscalls.bind`) on a kernel without the new
mount API: it binds, then remounts read-only, as before (the real calls: tests/security)."""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING

from fusevol.mount import syscalls

if TYPE_CHECKING:
    from pathlib import Path

    import pytest


def test_without_the_new_mount_api_a_read_only_bind_is_bound_then_remounted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_such_call(path: str, number: int, *args: object) -> int:
        raise OSError(errno.ENOSYS, "Function not implemented", path)

    calls: list[tuple[str | None, str, int]] = []
    monkeypatch.setattr(syscalls, "_syscall", no_such_call)
    monkeypatch.setattr(syscalls, "_new_mount_api", True)
    monkeypatch.setattr(syscalls, "mount2", lambda *call: calls.append(call))
    source, target = tmp_path / "source", tmp_path / "target"
    source.mkdir()
    syscalls.bind(str(source), str(target), True, False, 0o750, None)
    assert [(s, flags & ~syscalls.MS_NOSUID & ~syscalls.MS_NODEV) for s, _, flags in calls] == [
        (str(source), syscalls.MS_BIND),
        (None, syscalls.MS_REMOUNT | syscalls.MS_BIND | syscalls.MS_RDONLY),
    ]
    assert syscalls._new_mount_api is False  # asked once, not for every bind
