"""Local git repositories for the gitRepo tests, made with the real git."""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

_IDENTITY = ["-c", "user.name=fusevol tests", "-c", "user.email=tests@localhost"]
_ENV = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "PATH": "/usr/bin:/bin"}


def git(cwd: Path, *args: str) -> str:
    result = subprocess.run(
        ["git", *_IDENTITY, "-c", "init.defaultBranch=main", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
        env=_ENV,
    )
    return result.stdout.strip()


def make_repository(path: Path, commits: list[dict[str, str]]) -> list[str]:
    """A repository at `path` with one commit per mapping (file -> content); their hashes."""
    path.mkdir(parents=True)
    git(path, "init", "-q")
    hashes = []
    for i, files in enumerate(commits):
        for name, content in files.items():
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            (path / name).write_text(content)
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", f"commit {i}")
        hashes.append(git(path, "rev-parse", "HEAD"))
    return hashes


def head(path: Path) -> str:
    return git(path, "rev-parse", "HEAD")
