"""Every document the repository cites is in the repository, and so is every fact number and anchor.

Scans the repository's text files (code, scripts, charts, units, patches, docs) for `*.md` paths,
as written in comments (`docs/fuse.md fact 4`, `docs/kubelet.md facts 3, 7`) and in Markdown links
(`[x](kubelet.md#1-where-a-volume-lives-and-what-a-container-gets)`). A path is resolved against
the citing file's directory, then against the repository root; it must name a file there. A fact
number must be a numbered heading of that document (`## 4. Caching...`), an anchor the slug of
one of its headings (GitHub's rule). Paths out of the repository (`../shared`, absolute paths) are
refused: a reader of a clone could not follow them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SKIPPED_DIRS = {".git", ".venv", "node_modules", "__pycache__", "build", "dist"}
"""Not the repository's own text: tools' caches and installed packages (every `.*` directory but
`.ci` is skipped too)."""
MD_PATH = re.compile(r"(?<![\w/.~-])((?:\.\.?/|/)?[\w~-][\w./~-]*\.md)(?:#([\w-]+))?(?![\w])")
FACTS = re.compile(r"\bfacts? (\d+(?:(?:,| and|, and) \d+)*)")
OUTSIDE = re.compile(r"\.\./shared\b|/work/shared\b")


def _text_files() -> list[Path]:
    files = []
    for directory, subdirectories, names in os.walk(REPO):
        subdirectories[:] = sorted(
            name
            for name in subdirectories
            if name not in SKIPPED_DIRS and (name == ".ci" or not name.startswith("."))
        )
        for name in sorted(names):
            path = Path(directory, name)
            if path == Path(__file__).resolve():
                continue  # its docstring and tests show citations on purpose
            try:
                path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue  # binary
            files.append(path)
    return files


def _resolve(cited: str, citing: Path) -> Path | None:
    if cited.startswith("/"):
        return None
    for base in (citing.parent, REPO):
        candidate = (base / cited).resolve()
        if candidate.is_file() and candidate.is_relative_to(REPO):
            return candidate
    return None


def _headings(doc: Path) -> list[str]:
    return [line.lstrip("#").strip() for line in doc.read_text().splitlines() if line[:1] == "#"]


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _broken_citations(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
    broken = []
    for number, line in enumerate(text.splitlines(), 1):
        if OUTSIDE.search(line):
            broken.append(f"{where}:{number}: cites a path outside the repository: {line.strip()}")
        for match in MD_PATH.finditer(line):
            cited, anchor = match[1], match[2]
            if "://" in line[line.rfind(" ", 0, match.start()) + 1 : match.start()]:
                continue  # part of a URL
            if path.name == "Containerfile" and cited.startswith("/"):
                continue  # a path inside the image being built, not a citation
            doc = _resolve(cited, path)
            if doc is None:
                broken.append(f"{where}:{number}: {cited} is not in the repository")
                continue
            headings = _headings(doc)
            if anchor is not None and anchor not in {_slug(h) for h in headings}:
                broken.append(f"{where}:{number}: {cited} has no heading for #{anchor}")
            if re.fullmatch(r" facts?", line[match.end() :]):
                broken.append(f"{where}:{number}: {cited}: the fact number is on the next line")
            facts = FACTS.match(line, match.end() + 1) if line[match.end() :][:1] == " " else None
            for fact in re.findall(r"\d+", facts[1]) if facts else ():
                if not any(re.match(rf"{fact}\. ", h) for h in headings):
                    broken.append(f"{where}:{number}: {cited} has no fact {fact}")
    return broken


def test_every_cited_document_and_fact_exists() -> None:
    files = _text_files()
    assert len(files) > 100, files  # the scan does see the repository
    broken = [line for path in files for line in _broken_citations(path)]
    assert broken == []


def test_the_scan_sees_citations_of_each_form(tmp_path: Path) -> None:
    """The patterns catch what they must: a good citation of each form passes, a bad one fails."""
    docs = sorted(p.relative_to(REPO) for p in (REPO / "docs").glob("*.md"))
    assert docs, "no docs/ in the repository"
    fuse = REPO / "docs" / "fuse.md"
    good = (
        "# docs/fuse.md fact 4, docs/fuse.md facts 1, 2 and 4, [x](docs/fuse.md#1-one-fuse-"
        "session-per-process), README.md\n"
    )
    bad = (
        "# docs/fuse.md fact 99\n# FUSE.md fact 4\n# ../shared/STYLE.md\n"
        "# [x](docs/fuse.md#no-such-heading)\n# docs/fuse.md facts 2 and 98\n"
        "# see docs/fuse.md fact\n"
    )
    assert _headings(fuse)[1].startswith("1. ")
    sample = tmp_path / "sample.py"
    sample.write_text(good)
    assert _broken_citations(sample) == []
    sample.write_text(bad)
    found = _broken_citations(sample)
    assert [line.split(": ", 1)[1] for line in found] == [
        "docs/fuse.md has no fact 99",
        "FUSE.md is not in the repository",
        "cites a path outside the repository: # ../shared/STYLE.md",
        "../shared/STYLE.md is not in the repository",
        "docs/fuse.md has no heading for #no-such-heading",
        "docs/fuse.md has no fact 98",
        "docs/fuse.md: the fact number is on the next line",
    ]
