"""gitRepo volumes: kubelet's git_repo plugin (`pkg/volume/git_repo/git_repo.go`).

A gitRepo volume is an emptyDir (a plain directory, 0777) into which git clones, once per pod:

    (1) the `ready` marker in `<root>/pods/<uid>/plugins/kubernetes.io~git-repo/<name>/` says the
        volume is set up already: nothing to do (after an agent restart too: adopted as it is);
    (2) kubelet's `validateVolume`: repository, revision and directory must not start with '-'
        (git would take them for options); with a revision, the directory must be one level;
    (3) the wrapped emptyDir, made aside: `STAGING` in that metadata directory (the same file
        system as the pod directory), 0777; with fsGroup, its root gets the group and the setgid
        bit (the emptyDir's ownership walk, on the empty root);
    (4) `git clone -- <repository> [<directory>]` in it;
    (5) with a revision: the directory to check out in is its root for directory ".", else the
        one entry the clone made (more entries: "unexpected directory contents"), where
        `git checkout <revision>` and `git reset --hard` run; then the fsGroup walk over it all
        (kubelet runs `SetVolumeOwnership` only on this path);
    (6) rename it to the volume directory: the volume appears complete, at once (kubelet clones
        in place, so a reader can see the clone before its revision is checked out);
    (7) the `ready` marker.
A failure at any step leaves nothing behind (no directory, no marker: kubelet would leave the
half-done clone), and carries git's own message; the reconciler retries with its backoff.

Git runs without a shell, in its own session (no controlling terminal), with stdin empty,
`GIT_TERMINAL_PROMPT=0` and ssh in batch mode (no credential prompt can hang it), with hooks
disabled through the environment (so the argv stays kubelet's), and under a timeout.

Excludes: the other mount-backed types (`fusevol.mount.plugins`), which dispatch here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import stat
from typing import TYPE_CHECKING

import trio

from fusevol.base.errors import VolumeSetupError
from fusevol.base.fsutil import mkdir_all

if TYPE_CHECKING:
    from pathlib import Path

    from fusevol.model import GitRepoVolumeSource

log = logging.getLogger(__name__)

READY_FILE = "ready"
STAGING = "staging"
"""Where the volume is cloned and checked out before it is renamed into place (3)-(6)."""
EMPTY_DIR_MODE = 0o777
"""kubelet's emptyDir `perm`: the volume directory, whatever the umask."""
RW_MASK = 0o660
EXEC_MASK = 0o110

GIT_UMASK = 0o022
"""git's umask: kubelet's git inherits kubelet's (022 under systemd), so a clone is readable by a
container's non-root user; fusevol's own is tighter (`fusevol.node.layout.UMASK`)."""

GIT_ENVIRONMENT = {
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_SSH_COMMAND": "ssh -o BatchMode=yes",
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "core.hooksPath",
    "GIT_CONFIG_VALUE_0": "/dev/null",
}
"""Added to the agent's environment for every git command."""


def validate(source: GitRepoVolumeSource) -> None:
    """(2) kubelet's `validateVolume`, with its messages."""
    for value, name in (
        (source.repository, "repository"),
        (source.revision, "revision"),
        (source.directory, "directory"),
    ):
        if value.startswith("-"):
            raise VolumeSetupError(f"{_go_quote(value)} is an invalid value for {name}")
    if source.revision and source.directory and "/" in os.path.normpath(source.directory):
        raise VolumeSetupError(
            f"{_go_quote(source.directory)} is not a valid directory, "
            "it must not contain a directory separator"
        )


def is_ready(meta_dir: Path) -> bool:
    """kubelet's `IsReady`: a regular file `ready` in the volume's metadata directory."""
    try:
        return stat.S_ISREG(os.stat(meta_dir / READY_FILE).st_mode)
    except OSError:
        return False


class GitRepo:
    def __init__(self, *, timeout_s: float) -> None:
        self._timeout_s = timeout_s

    async def set_up(
        self, target: Path, meta_dir: Path, source: GitRepoVolumeSource, *, fs_group: int | None
    ) -> None:
        """Steps (1)-(7) of the module docstring. Idempotent."""
        if is_ready(meta_dir):  # (1)
            return
        validate(source)  # (2)
        # Not ready: whatever is there is a set-up that did not finish (an agent killed mid-clone).
        await trio.to_thread.run_sync(remove, target, meta_dir)
        staging = meta_dir / STAGING
        try:
            await trio.to_thread.run_sync(_make_root, staging, fs_group)  # (3)
            args = ["clone", "--", source.repository]
            if source.directory:
                args.append(source.directory)
            await self._git(args, cwd=staging)  # (4)
            if source.revision:  # (5)
                checkout = await trio.to_thread.run_sync(_checkout_dir, staging, source.directory)
                await self._git(["checkout", source.revision], cwd=checkout)
                await self._git(["reset", "--hard"], cwd=checkout)
                if fs_group is not None:
                    await trio.to_thread.run_sync(set_ownership, staging, fs_group)
            await trio.to_thread.run_sync(_move_into_place, staging, target)  # (6)
            await trio.to_thread.run_sync(_set_ready, meta_dir)  # (7)
        except BaseException:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(remove, target, meta_dir)
            raise

    async def _git(self, args: list[str], *, cwd: Path) -> None:
        shown = " ".join(["git", *args])
        log.debug("running %s cwd=%s", shown, cwd)
        try:
            with trio.fail_after(self._timeout_s):
                result = await trio.run_process(
                    ["git", *args],
                    cwd=cwd,
                    env={**os.environ, **GIT_ENVIRONMENT},
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                    start_new_session=True,
                    umask=GIT_UMASK,
                )
        except trio.TooSlowError:
            raise VolumeSetupError(
                f"failed to exec '{shown}': timed out after {self._timeout_s:g}s"
            ) from None
        except OSError as exc:
            raise VolumeSetupError(f"failed to exec '{shown}': {exc}") from None
        if result.returncode != 0:
            output = (result.stderr + result.stdout).decode(errors="replace").strip()
            raise VolumeSetupError(
                f"failed to exec '{shown}': {output}: exit status {result.returncode}"
            )


def remove(target: Path, meta_dir: Path) -> None:
    """Tear down: the volume directory with its content, then the metadata directory. The caller
    has checked that nothing is mounted below `target`. Idempotent."""
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(target)
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(meta_dir)


def _make_root(target: Path, fs_group: int | None) -> None:
    mkdir_all(target.parent, 0o750)
    os.mkdir(target, EMPTY_DIR_MODE)
    os.chmod(target, EMPTY_DIR_MODE)  # umask-proof, as kubelet's emptyDir
    if fs_group is not None:
        _change(str(target), os.lstat(target), fs_group)


def _move_into_place(staging: Path, target: Path) -> None:
    mkdir_all(target.parent, 0o750)
    try:
        os.rename(staging, target)  # target is absent: removed before (3)
    except OSError as exc:
        raise VolumeSetupError(f"cannot move the clone to {target}: {exc.strerror}") from None


def _checkout_dir(target: Path, directory: str) -> Path:
    if directory and os.path.normpath(directory) == ".":
        return target
    entries = sorted(os.listdir(target))
    if len(entries) != 1:
        raise VolumeSetupError(f"unexpected directory contents: {entries}")
    return target / entries[0]


def _set_ready(meta_dir: Path) -> None:
    """kubelet's `SetReady`: `MkdirAll(dir, 0750)`, then create `ready`."""
    mkdir_all(meta_dir, 0o750)
    with open(meta_dir / READY_FILE, "wb"):
        pass


def set_ownership(root: Path, fs_group: int) -> None:
    """kubelet's `SetVolumeOwnership` walk for a read-write volume: everything gets group
    `fs_group` (symlinks too, not followed); files `| 0660`, directories `| 0660 | 0110 | setgid`.
    """
    _change(str(root), os.lstat(root), fs_group)
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            _change(path, os.lstat(path), fs_group)


def _change(path: str, info: os.stat_result, fs_group: int) -> None:
    os.lchown(path, -1, fs_group)
    if stat.S_ISLNK(info.st_mode):
        return
    mask = RW_MASK
    if stat.S_ISDIR(info.st_mode):
        mask |= stat.S_ISGID | EXEC_MASK
    os.chmod(path, stat.S_IMODE(info.st_mode) | mask)


def _go_quote(value: str) -> str:
    """Go's `%q` for the strings these messages carry (JSON's escapes agree on printable text)."""
    return json.dumps(value, ensure_ascii=False)
