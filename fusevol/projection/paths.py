"""Path rules of kubelet's AtomicWriter.

Owns:
- `clean_path`: Go's `filepath.Clean`, which kubelet applies to every payload path.
- `validate_path` / `validate_payload`: AtomicWriter's `validatePath` and `validatePayload`
  (docs/kubelet.md fact 2). Validation runs on the path as given, cleaning afterwards, exactly as
  kubelet does, so `foo/../bar` is rejected while `foo//bar` and `./bar` are accepted.

Where kubelet would accept a payload and then fail (or silently misbehave) while writing it,
`validate_payload` fails cleanly instead, with `InvalidPayload`: a path that is both a file and a
directory (`a` and `a/b`), a path that names the volume directory itself once cleaned (`./`), a
path whose cleaned form is reserved (`./..data`), and names the kernel cannot carry (NUL, text that
is not UTF-8). Paths that clean to the same name keep the last one given (kubelet's Go map makes
that choice at random).

Lengths are UTF-8 bytes, as Go's `len()` measures them. Messages quote paths and keys, never file
contents. Excluded: anything that reads or writes files, and the API server's input validation
(`IsConfigMapKey`, `ValidateLocalNonReservedPath`), which belongs to a source that has no API
server in front of it (`fusevol.decode.manifest`).
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from fusevol.base.errors import InvalidPayload

if TYPE_CHECKING:
    from collections.abc import Mapping

    from fusevol.model import FileProjection

MAX_PATH_BYTES = 4096
"""AtomicWriter `maxPathLength`."""

MAX_NAME_BYTES = 255
"""AtomicWriter `maxFileNameLength`: the longest single path element."""

MAX_KEY_BYTES = 253
"""`IsConfigMapKey`: `DNS1123SubdomainMaxLength`."""

_KEY_CHARS = re.compile(r"[-._a-zA-Z0-9]+")
_QUOTE_MAX_CHARS = 80


def clean_path(path: str) -> str:
    """Return the shortest path equivalent to `path`, by Go's `filepath.Clean` rules.

    Repeated slashes collapse, `.` elements go, `..` removes the element before it (or stays at
    the start of a relative path, or goes at the start of a rooted one); empty becomes `.`.
    """
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
    for element in elements:
        if element == "..":
            raise InvalidPayload(f"invalid path {_quote(path)}: must not contain '..'")
        if _nbytes(element) > MAX_NAME_BYTES:
            raise InvalidPayload(
                f"invalid path {_quote(path)}: file names must be no more than "
                f"{MAX_NAME_BYTES} bytes, not {_nbytes(element)} ({_quote(element)})"
            )
    if elements[0].startswith(".."):
        raise InvalidPayload(f"invalid path {_quote(path)}: must not start with '..'")


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


def _reject_file_as_directory(paths: Mapping[str, object]) -> None:
    """Fail on a path that is a file and also a directory of another path (`a` and `a/b`)."""
    for path in paths:
        elements = path.split("/")
        for end in range(1, len(elements)):
            prefix = "/".join(elements[:end])
            if prefix in paths:
                raise InvalidPayload(
                    f"invalid payload: {_quote(prefix)} is a file, "
                    f"but {_quote(path)} needs it to be a directory"
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
