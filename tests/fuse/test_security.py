"""Modes are enforced, and nobody but the agent can change a volume."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from tests.fuse.conftest import POD_UID

if TYPE_CHECKING:
    from pathlib import Path

    from tests.agent import AgentProcess

# Like a container that has the volume bound: the directory is reached as root, the file opened
# as uid 1000 (the test's temporary directories above the volume are 0700).
AS_USER = """
import os, sys
directory = os.open(os.path.dirname(sys.argv[1]), os.O_RDONLY | os.O_DIRECTORY)
os.setgroups([]); os.setgid(1000); os.setuid(1000)
try:
    os.close(os.open(os.path.basename(sys.argv[1]), os.O_RDONLY, dir_fd=directory))
except OSError as exc:
    print(exc.errno)
else:
    print(0)
"""


def _read_as_uid_1000(path: Path) -> int:
    out = subprocess.run(
        [sys.executable, "-c", AS_USER, str(path)], capture_output=True, text=True, check=True
    ).stdout
    return int(out)


def test_mode_excludes_other_uids(agent: AgentProcess) -> None:
    secret = agent.volume(POD_UID, "secret", "creds") / "token"
    config = agent.volume(POD_UID, "configmap", "config") / "a"
    assert oct(secret.stat().st_mode & 0o777) == oct(0o400)
    assert _read_as_uid_1000(secret) == errno.EACCES
    assert _read_as_uid_1000(config) == 0
    assert secret.read_bytes() == b"t0ken"  # root may


WRITES = [
    pytest.param(lambda d: (d / "a").write_text("x"), id="write-existing"),
    pytest.param(lambda d: (d / "new").write_text("x"), id="create"),
    pytest.param(lambda d: (d / "a").unlink(), id="unlink"),
    pytest.param(lambda d: (d / "a").rename(d / "z"), id="rename"),
    pytest.param(lambda d: (d / "newdir").mkdir(), id="mkdir"),
    pytest.param(lambda d: (d / "..data").unlink(), id="unlink-data"),
    pytest.param(lambda d: os.symlink("x", d / "..data_tmp"), id="symlink"),
    pytest.param(lambda d: os.chmod(d / "..data" / "a", 0o777), id="chmod"),
]


@pytest.mark.parametrize("change", WRITES)
@pytest.mark.parametrize("via", ["pod-volume-dir", "fuse-mount"])
def test_no_process_but_the_agent_can_change_a_volume(
    agent: AgentProcess, change: object, via: str
) -> None:
    volume = agent.volume(POD_UID, "configmap", "config")
    if via == "fuse-mount":
        volume = agent.fuse_subtree(volume)
    with pytest.raises(OSError, match="Read-only file system") as raised:
        change(volume)  # type: ignore[operator]
    assert raised.value.errno == errno.EROFS
    assert (volume / "a").read_text() == "1"
