"""The mount backend contract: what the reconciler may ask of the host's mount table.

Every verb is idempotent, as kubelet requires of volume plugins (`pkg/volume/volume.go`): mounting
what is already mounted there and unmounting what is not mounted are no-ops, so a retried or
repeated operation never fails for having half-succeeded before. Sensitive mount options (NFS
credentials, say) travel apart from the others and are never logged (mount-utils'
`MountSensitive`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from fusevol.mount.mountinfo import MountPoint


class MountBackend(Protocol):
    async def mount(
        self,
        source: str,
        target: Path,
        *,
        fstype: str | None = None,
        options: Sequence[str] = (),
        sensitive_options: Sequence[str] = (),
    ) -> None:
        """`mount [-t fstype] [-o options] source target`. No-op if `target` is a mount point."""

    async def bind(
        self,
        source: Path,
        target: Path,
        *,
        read_only: bool,
        stack: bool = False,
        make_target: int | None = None,
    ) -> None:
        """Bind-mount `source` at `target`, read-only if asked.

        No-op if `target` is a mount point. With `stack`, the bind goes on top of whatever is
        mounted at `target` (a dead or live bind of a previous agent's FUSE mount), no-op only if
        the top mount there already is a bind of `source`; and the new mount is made shared, so
        that the next one stacked on it propagates into containers' rslave copies of it. Stacked
        binds are of fusevol's own file systems, which always answer (the real backend runs them
        in batches). `make_target`: if `target` is not a mount point, create it and its missing
        parents with this mode (Go's `MkdirAll`)."""

    def bind_later(self, source: Path, target: Path, *, make_target: int) -> Callable[[], str]:
        """`bind(source, target, read_only=True, stack=True, make_target=make_target)` as a call
        for a thread that is not the trio thread, to make later (a publish answered in gRPC's
        thread: `fusevol.csi.preparing`); the call returns the bind's device, and raises OSError
        if the bind failed. `bound` then records the bind, on the trio thread."""

    def bound(self, source: Path, target: Path, device: str) -> None:
        """Record the bind a `bind_later` call made, and that it returned `device`."""

    async def unmount(
        self, target: Path, *, force: bool = False, remove_target: bool = False
    ) -> None:
        """Unmount everything mounted at `target` (a stack of mounts included); a corrupted mount
        (its server is gone) is detached lazily. With `force`, abort the file system first (for
        FUSE: its connection, so every mount of it turns dead and a server stuck on it is
        released), then detach. With `remove_target`, then remove the directory `target` if it
        is empty (the counterpart of `bind`'s `make_target`).

        No-op if `target` is not a mount point or does not exist (but for `remove_target`).
        """

    def mount_points(self) -> tuple[MountPoint, ...]:
        """The current mount table of this process's namespace."""

    def is_mount_point(self, path: Path) -> bool:
        """True if `path` is a mount point (by the mount table: bind mounts of the same file system
        and dead FUSE mounts included)."""
