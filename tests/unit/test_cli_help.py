"""The CLI's help and the README's usage say the same, with the defaults.
Through the real CLI (`python -m fusevol ... --help`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from fusevol.cli.parser import build_parser

README = Path(__file__).parents[2] / "README.md"


def help_text(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "fusevol", *args, "--help"],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"},  # no FUSEVOL_* from the caller
    )
    return " ".join(result.stdout.split())


def test_run_help_shows_the_defaults_and_the_environment_variables() -> None:
    text = help_text("run")
    for shown in [
        "--root DIR the agent's root: pod volumes under DIR/pods/ (default: /var/lib/fusevol)",
        "(default: 9842)",
        "loopback (default: 127.0.0.1)",
        "--log-level LEVEL debug, info, warning or error (default: info)",
        "(default: Watch)",
        "Every flag is also an environment variable FUSEVOL_<FLAG>",
        "Pods, ConfigMaps, Secrets, PersistentVolumes, PersistentVolumeClaims, StorageClasses",
    ]:
        assert shown in text


def test_the_description_says_what_fusevol_is() -> None:
    text = help_text()
    assert text.startswith(
        "usage: fusevol [-h] [--version] {run,teardown,status,wait,mounts,hold,webhook,convert} ..."
    )
    assert "A Kubernetes node agent for pod volumes" in text
    assert "->" not in text
    assert "argv" not in text


def test_the_readme_usage_has_every_command_and_every_flag() -> None:
    readme = README.read_text()
    usage = readme.split("## Using it", 1)[1].split("```", 2)[1]
    commands = set(re.findall(r"^fusevol (\w+)", usage, re.M))
    parser = build_parser()
    [subparsers] = [a for a in parser._actions if a.dest == "command"]
    assert commands == set(subparsers.choices)  # type: ignore[arg-type]
    run = subparsers.choices["run"]  # type: ignore[index]
    flags = {s for action in run._actions for s in action.option_strings if s != "-h"}
    missing = {
        flag for flag in flags - {"--help"} if flag not in usage and f"`{flag}" not in readme
    }
    assert missing == set()
