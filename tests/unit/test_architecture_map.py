"""docs/architecture.md names every module of fusevol: the map has no blank rooms.

A maintainer finds a module from the map; one it does not name is one they will not find, and a
module split in two would leave half of itself off the map. Named means its path from its package
(`fuse/tree.py`, `kube/http2/pool.py`, the longer `fusevol/fuse/tree.py` too) or its dotted name
(`fusevol.fuse.tree`) appears in the page; generated modules (`*_pb2`), `__init__` and `__main__`
are exempt.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "fusevol"
ARCHITECTURE = REPO / "docs/architecture.md"


def _modules() -> list[Path]:
    return sorted(
        path.relative_to(PACKAGE)
        for path in PACKAGE.rglob("*.py")
        if path.stem not in ("__init__", "__main__") and not path.stem.endswith("_pb2")
    )


def _named(module: Path, text: str) -> bool:
    in_package = "/".join(module.parts[-2:])  # a top-level module has no package: its own name
    dotted = ".".join(("fusevol", *module.with_suffix("").parts))
    return bool(
        re.search(rf"(?<![\w.]){re.escape(in_package)}(?![\w])", text)
        or re.search(rf"(?<![\w.]){re.escape(dotted)}(?![\w])", text)
    )


def test_the_architecture_page_names_every_module() -> None:
    text = ARCHITECTURE.read_text()
    missing = [str(module) for module in _modules() if not _named(module, text)]
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_a_module_is_named_only_by_its_own_path() -> None:
    text = "the tree (`fuse/tree.py`) and `fusevol.kube.http2.pool`; not state.py alone"
    assert _named(Path("fuse/tree.py"), text)
    assert _named(Path("kube/http2/pool.py"), text)
    assert not _named(Path("csi/state.py"), text)
    assert not _named(Path("mount/tree.py"), text)
    assert len(_modules()) > 100
