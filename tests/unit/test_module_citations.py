"""Every module of fusevol that the repository's text names exists, under the name it is given.

Docs, the README, the chart, comments and docstrings name modules as paths
(`fusevol/fuse/publish.py`, `fuse/publish.py` inside a sentence that already said fusevol) and as
dotted names (`fusevol.agent.handover`, `fusevol.fuse.snapshot.Journal.tidy`). After modules move,
a stale name misleads the next reader; this fails on it. A path must be a file or directory of
the repository; a dotted name must import (its longest importable prefix), and what follows that
prefix must be defined in it (`Journal` in `fusevol.fuse.snapshot`). A dotted name counts when
its second part is a module's name, present or former (`fusevol.io`, the CSI driver, does not).
"""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SKIPPED_DIRS = {".git", ".venv", "node_modules", "__pycache__", "build", "dist", ".hypothesis"}
PATH = re.compile(r"(?<![\w./<>-])(fusevol/[\w/]+\.py)(?![\w/])")
DOTTED = re.compile(r"(?<![\w./-])(fusevol(?:\.\w+)+)")
FORMER_MODULES = frozenset(
    {
        "agent_metrics", "app", "cache", "collector", "errors", "fsutil", "handover", "heap",
        "helper", "helper_process", "launcher", "layout", "lock", "log", "metrics", "mountinfo",
        "populator", "preflight", "quantity", "reconciler", "runtime", "sdnotify", "server",
        "settings", "sources", "status", "subpath", "teardown",
    }
)  # fmt: skip
"""Top-level modules fusevol had before they were grouped into packages: a name under one of
them is a stale citation, not some other `fusevol.x` (a variable, a Helm template's name)."""


def _text_files() -> list[Path]:
    files = []
    for directory, subdirectories, names in os.walk(REPO):
        subdirectories[:] = [
            d for d in subdirectories if d not in SKIPPED_DIRS and (d == ".ci" or d[0] != ".")
        ]
        for name in names:
            path = Path(directory, name)
            if path == Path(__file__).resolve():
                continue  # its own tests name stale modules on purpose
            if path.suffix in (".py", ".md", ".yaml", ".yml", ".toml", ".tpl", ".txt", ".service"):
                files.append(path)
    return sorted(files)


def _module_words() -> frozenset[str]:
    package = REPO / "fusevol"
    current = {p.stem for p in package.glob("*.py")} | {
        p.name for p in package.iterdir() if (p / "__init__.py").is_file()
    }
    return frozenset(current) | FORMER_MODULES


def _citations() -> list[tuple[str, str]]:
    words = _module_words()
    found = []
    for path in _text_files():
        text = path.read_text(errors="replace")
        where = str(path.relative_to(REPO))
        found += [(where, m) for m in PATH.findall(text)]
        found += [(where, m.rstrip(".")) for m in DOTTED.findall(text) if m.split(".")[1] in words]
    return found


def _dotted_exists(name: str) -> bool:
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        rest = parts[end:]
        return not rest or hasattr(module, rest[0])
    return False


def test_every_module_named_exists() -> None:
    stale = []
    for where, cited in _citations():
        ok = (REPO / cited).exists() if "/" in cited else _dotted_exists(cited)
        if not ok:
            stale.append(f"{where}: {cited}")
    assert not stale, "\n".join(sorted(set(stale)))


def test_citations_are_found() -> None:
    citations = _citations()
    assert len(citations) > 100
    assert ("docs/architecture.md", "fusevol/agent/app.py") in citations


@pytest.mark.parametrize(
    ("name", "exists"),
    [
        ("fusevol.agent.handover", True),
        ("fusevol.fuse.snapshot.Journal.tidy", True),
        ("fusevol.handover", False),
        ("fusevol.fuse.snapshot.NoSuchThing", False),
    ],
)
def test_a_dotted_name_is_resolved_through_its_module(name: str, exists: bool) -> None:
    assert _dotted_exists(name) is exists
