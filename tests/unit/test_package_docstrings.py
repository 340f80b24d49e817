"""Every package of fusevol says in its docstring what each of its modules is.

A package's `__init__` docstring is where a reader starts: a module it does not name is one a
reader will not find. Checked by name: each module's (or subpackage's) name must appear in the
docstring as a word (`tree`, `tree.py` or `fusevol.fuse.tree` all count); generated modules
(`*_pb2`) and the package's own `__main__` are exempt.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "fusevol"
PACKAGES = sorted(init.parent for init in PACKAGE.rglob("__init__.py"))


def _members(package: Path) -> list[str]:
    names = [
        path.stem
        for path in package.glob("*.py")
        if path.stem not in ("__init__", "__main__") and not path.stem.endswith("_pb2")
    ]
    names += [path.name for path in package.iterdir() if (path / "__init__.py").is_file()]
    return sorted(names)


@pytest.mark.parametrize(
    "package", PACKAGES, ids=[str(p.relative_to(PACKAGE.parent)) for p in PACKAGES]
)
def test_a_package_docstring_names_each_of_its_modules(package: Path) -> None:
    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    missing = [
        name
        for name in _members(package)
        if not re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", docstring)
    ]
    assert not missing, f"{package.relative_to(PACKAGE.parent)}/__init__.py does not name {missing}"


def test_every_package_is_checked() -> None:
    assert len(PACKAGES) >= 15
    assert PACKAGE in PACKAGES
