"""Path rules of kubelet's AtomicWriter.

Owns:
- `clean_path`: Go's `filepath.Clean`, which kubelet applies to every payload path.
- `validate_path` / `validate_payload`: AtomicWriter's `validatePath` and `validatePayload`
  (docs/kubelet.md fact 2). Validation runs on the path as given, cleaning afterwards, exactly as
  kubelet does, so `foo/../bar` is rejected while `foo//bar` and `./bar` are accepted.
  `validate_field` is `validate_path` whose error names the field the path came from
  (`items[3].path`).
- `check_written_under`: the kernel's limit on the paths kubelet would write (PATH_MAX), which
  depends on the volume's directory: beyond it kubelet's write fails with ENAMETOOLONG.

Where kubelet would accept a payload and then fail (or silently misbehave) while writing it,
`validate_payload` fails cleanly instead, with `InvalidPayload`: a path that is both a file and a
directory (`a` and `a/b`), a path that names the volume directory itself once cleaned (`./`), a
path whose cleaned form is reserved (`./..data`), and names the kernel cannot carry (NUL, text that
is not UTF-8). Paths that clean to the same name keep the last one given (kubelet's Go map makes
that choice at random).

Lengths are UTF-8 bytes, as Go's `len()` measures them. Messages quote paths and keys, never file
contents, and a long path is shortened in them (its size given). Every check costs time in
proportion to the paths' length, however deep they are: a tenant chooses them.

Excluded: anything that reads or writes files, and the API server's input validation
(`IsConfigMapKey`, `ValidateLocalNonReservedPath`), which belongs to a source that has no API
server in front of it (`fusevol.decode.manifest`).
"""

from __future__ import annotations

import itertools
import json
import re
from typing import TYPE_CHECKING

from fusevol.base.errors import InvalidPayload

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from fusevol.model import FileProjection

MAX_PATH_BYTES = 4096
"""AtomicWriter `maxPathLength`."""

MAX_NAME_BYTES = 255
"""AtomicWriter `maxFileNameLength`: the longest single path element."""

MAX_KEY_BYTES = 253
"""`IsConfigMapKey`: `DNS1123SubdomainMaxLength`."""

PATH_MAX = 4096
"""The kernel's limit on a path given to a system call, its terminating NUL included: a path of
4096 bytes or more fails with ENAMETOOLONG ("file name too long")."""

VERSION_NAME_BYTES = len("..2006_01_02_15_04_05.") + 10
"""The longest name of an AtomicWriter version directory: `os.MkdirTemp`'s UTC prefix and a
random uint32 in decimal (up to 10 digits)."""

_KEY_CHARS = re.compile(r"[-._a-zA-Z0-9]+")
_QUOTE_MAX_CHARS = 80


def clean_path(path: str) -> str:
    """Return the shortest path equivalent to `path`, by Go's `filepath.Clean` rules.

    Repeated slashes collapse, `.` elements go, `..` removes the element before it (or stays at
    the start of a relative path, or goes at the start of a rooted one); empty becomes `.`.
    A path that is clean already (nearly every one) is returned as it is, without a loop over
    its elements.
    """
    if _is_clean(path):
        return path
    rooted = path.startswith("/")
    elements: list[str] = []
    for element in path.split("/"):
        if element in ("", "."):
            continue
        if element == "..":
            if elements and elements[-1] != "..":
                elements.pop()
            elif not rooted:
                elements.append("..")
            continue
        elements.append(element)
    joined = "/".join(elements)
    if rooted:
        return "/" + joined
    return joined or "."


def _is_clean(path: str) -> bool:
    """True if `clean_path` would return `path` as it is: no `.`, `..` or empty element, no
    trailing slash (searches in C, where a loop over 2048 elements took a millisecond)."""
    return (
        path not in ("", ".", "..")
        and "//" not in path
        and "/./" not in path
        and "/../" not in path
        and not path.startswith(("./", "../"))
        and not path.endswith(("/", "/.", "/.."))
    )


def validate_path(path: str) -> None:
    """Raise `InvalidPayload` unless AtomicWriter's `validatePath` accepts `path`."""
    _require_encodable(path)
    if not path:
        raise InvalidPayload(f"invalid path {_quote(path)}: must not be empty")
    if path.startswith("/"):
        raise InvalidPayload(f"invalid path {_quote(path)}: must be a relative path")
    size = _nbytes(path)
    if size > MAX_PATH_BYTES:
        raise InvalidPayload(
            f"invalid path {_quote(path)}: must be no more than {MAX_PATH_BYTES} bytes, not {size}"
        )
    elements = path.split("/")
    # Element by element only if one may be wrong: 2048 elements take 2048 encodings (a name of
    # at most 63 characters has at most 252 bytes).
    long_names = max(map(len, elements)) > MAX_NAME_BYTES // 4
    for element in elements if long_names or ".." in elements else ():
        if element == "..":
            raise InvalidPayload(f"invalid path {_quote(path)}: must not contain '..'")
        if _nbytes(element) > MAX_NAME_BYTES:
            raise InvalidPayload(
                f"invalid path {_quote(path)}: file names must be no more than "
                f"{MAX_NAME_BYTES} bytes, not {_nbytes(element)} ({_quote(element)})"
            )
    if elements[0].startswith(".."):
        raise InvalidPayload(f"invalid path {_quote(path)}: must not start with '..'")


def validate_field(path: str, field: str) -> None:
    """`validate_path`, its error starting with the `field` that gave `path` (`items[3].path`)."""
    try:
        validate_path(path)
    except InvalidPayload as exc:
        raise InvalidPayload(f"{field}: {exc}") from None


def check_written_under(
    directory: str, paths: Iterable[str], *, field_of: Callable[[str], str] = lambda _: ""
) -> None:
    """Raise `InvalidPayload` with kubelet's ENAMETOOLONG error if AtomicWriter, writing `paths`
    (cleaned, valid) into the volume directory `directory`, would hand the kernel a path of
    `PATH_MAX` bytes or more: `os.MkdirAll` of the file's directory fails at the first such
    prefix ("mkdir ...: file name too long"), else the file's own `open`. The version directory's
    name is taken at its longest (`VERSION_NAME_BYTES`), so the verdict never depends on a random
    number, as kubelet's does within 10 bytes of the limit. `field_of(path)` names the field
    that gave the path, if it can, at the start of the error."""
    base = _nbytes(directory) + 1 + VERSION_NAME_BYTES + 1  # <directory>/<version>/
    paths = list(paths)
    if base + 4 * max(map(len, paths), default=0) < PATH_MAX:  # 4: UTF-8's longest character
        return  # nearly always: no path is near the limit, and none was encoded
    for path in paths:
        if base + _nbytes(path) < PATH_MAX:
            continue
        end, size = _first_too_long(path, base)
        op = "open" if end == len(path) else "mkdir"
        head = path[:end] if end <= _QUOTE_MAX_CHARS else path[:_QUOTE_MAX_CHARS] + "..."
        field = field_of(path)
        raise InvalidPayload(
            f"{field + ': ' if field else ''}invalid path {_quote(path)}: {op} {directory}/"
            f"..<version>/{head}: file name too long ({size} bytes where kubelet writes it, the "
            f"kernel takes {PATH_MAX - 1})"
        )


def _first_too_long(path: str, base: int) -> tuple[int, int]:
    """(where it ends, its full size) of the first prefix of `path` (a directory `MkdirAll`
    makes, or the whole path) whose full path, `base` bytes added, reaches `PATH_MAX`."""
    size, start = base, 0
    for element in path.split("/"):
        size += _nbytes(element)
        end = start + len(element)
        if size >= PATH_MAX:
            return end, size
        size, start = size + 1, end + 1
    return len(path), size - 1


def validate_payload(payload: Mapping[str, FileProjection]) -> dict[str, FileProjection]:
    """Validate every path, then return a new payload keyed by the cleaned paths.

    Any invalid path aborts the whole payload, as it aborts kubelet's write: nothing is returned.
    """
    for path in payload:
        validate_path(path)
    cleaned: dict[str, FileProjection] = {}
    for path, projection in payload.items():
        clean = clean_path(path)
        if clean == ".":
            raise InvalidPayload(
                f"invalid path {_quote(path)}: names the volume directory itself, not a file"
            )
        if clean.startswith(".."):
            raise InvalidPayload(
                f"invalid path {_quote(path)}: must not start with '..' "
                f"once cleaned to {_quote(clean)}"
            )
        cleaned[clean] = projection
    _reject_file_as_directory(cleaned)
    return cleaned


def _reject_file_as_directory(paths: Iterable[str]) -> None:
    """Fail on a path that is a file and also a directory of another path (`a` and `a/b`).

    Sorted with each `/` read as NUL (which no valid path holds), every path comes right before
    the paths below it: only neighbours are compared. Time in proportion to the paths' total
    length, where checking every prefix of every path against the others was quadratic in
    their depth (a 2048-level path has 2048 prefixes of up to 4 KiB each)."""
    ordered = sorted(path.replace("/", "\0") for path in paths)
    for before, after in itertools.pairwise(ordered):
        if after.startswith(before) and after[len(before) : len(before) + 1] == "\0":
            raise InvalidPayload(
                f"invalid payload: {_quote(before.replace(chr(0), '/'))} is a file, "
                f"but {_quote(after.replace(chr(0), '/'))} needs it to be a directory"
            )


def _require_encodable(path: str) -> None:
    """Reject what no file name can carry: NUL, and text without a UTF-8 form (lone surrogates)."""
    if "\0" in path:
        raise InvalidPayload(f"invalid path {_quote(path)}: must not contain NUL")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidPayload(f"invalid path {_quote(path)}: must be valid UTF-8") from None


def _nbytes(text: str) -> int:
    """Length in UTF-8 bytes, as Go's `len()`; never raises."""
    return len(text.encode("utf-8", "surrogatepass"))


def _quote(text: str) -> str:
    """Quote like Go's `%q` (double quotes, escapes); long text is shortened with its size."""
    if len(text) <= _QUOTE_MAX_CHARS:
        return json.dumps(text, ensure_ascii=False)
    head = json.dumps(text[:_QUOTE_MAX_CHARS], ensure_ascii=False)
    return f'{head[:-1]}..." ({_nbytes(text)} bytes)'
