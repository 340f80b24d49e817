"""Manifest text -> fusevol model objects: the manifest source's decoder.

Owns: decoding one manifest file (`*.json`: one JSON value; anything else: multi-document YAML,
strictly: no tags, no deep nesting, no oversized numbers), unrolling `kind: List`, and refusing an
object defined twice in a file. Each document then goes through `fusevol.decode.objects`, the
converter the API source uses too.

Shaped as one pure function over bytes so that tests and the watcher (`fusevol.source.local`) feed
it alike. One bad object rejects the whole file with a `ManifestError` naming the file, the object
and the field: the watcher then keeps the file's previous objects, so a half-finished edit never
tears anything down. Error messages carry keys and paths, never values (Secret data stays out of
logs, and so do YAML snippets).

Excludes: file I/O and watching (`fusevol.source.local`), resourceVersion assignment (the watcher
numbers what it delivers), the objects' fields (`fusevol.decode.objects`).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from fusevol.base.errors import ManifestError
from fusevol.decode.objects import convert
from fusevol.decode.reader import Reader, describe_type

if TYPE_CHECKING:
    from collections.abc import Hashable, Iterator, Mapping

    from fusevol.model import KubeObject, ObjectKey

try:
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]

log = logging.getLogger(__name__)

_MAX_DEPTH = 500  # Kubernetes objects need a few dozen levels
_MERGE_TAG = "tag:yaml.org,2002:merge"


def parse_manifest(text: bytes, *, origin: str) -> list[KubeObject]:
    """The Pods, ConfigMaps and Secrets in one manifest file, in file order.

    `origin` is the file's path: it selects the format (`.json` or YAML) and starts every error
    message. Other kinds and empty documents are skipped (logged at DEBUG). Raises `ManifestError`
    if any document or object is invalid, or if the file defines the same object twice.
    """
    objects: list[KubeObject] = []
    seen: dict[ObjectKey, str] = {}
    for where, document in _documents(_load(text, origin=origin), origin=origin):
        obj = convert(document, origin=origin, where=where)
        if obj is None:
            continue
        if obj.key in seen:
            raise ManifestError(f"{origin}: {obj.key}: defined twice ({seen[obj.key]}, {where})")
        seen[obj.key] = where
        objects.append(obj)
    return objects


# -- decoding --------------------------------------------------------------------------------------


class _StrictLoader(_SafeLoader):
    """The safe loader, refusing duplicate mapping keys as kubectl does ("already set in map")."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        if not isinstance(node, yaml.MappingNode):  # `!!set |`, `!!omap x`: the base class says so
            return super().construct_mapping(node, deep=deep)
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # unhashable: the base class reports it
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """PyYAML's constructors fail on a bad tagged scalar (`!!int ''`, `!!bool x`,
        `!!timestamp 2024-13-01`) with whatever Python raises, its message quoting the value: that
        becomes a ConstructorError at the node, naming the tag only (the value may be a secret)."""
        try:
            return super().construct_object(node, deep=deep)
        except _CONSTRUCTOR_FAILURES:
            raise yaml.constructor.ConstructorError(
                None, None, f"not a valid {node.tag} value", node.start_mark
            ) from None


_CONSTRUCTOR_FAILURES = (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError)


def _load(text: bytes, *, origin: str) -> list[object]:
    try:
        source = text.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{origin}: not valid UTF-8 (byte {exc.start})") from None
    if origin.endswith(".json"):
        try:
            return [json.loads(source)]
        except RecursionError:
            raise ManifestError(f"{origin}: invalid JSON: nested too deeply") from None
        except json.JSONDecodeError as exc:
            where = f"line {exc.lineno} column {exc.colno}"
            raise ManifestError(f"{origin}: {where}: invalid JSON: {exc.msg}") from None
        except ValueError:  # int()'s limit: a number of over 4300 digits
            raise ManifestError(f"{origin}: invalid JSON: a number has too many digits") from None
    try:
        _check_depth(source, origin=origin)
        return list(yaml.load_all(source, Loader=_StrictLoader))
    except yaml.MarkedYAMLError as exc:
        # Built from the parts, not str(exc): the pure-Python loader's snippet would quote the line.
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
        raise ManifestError(
            f"{origin}: {where}invalid YAML: {exc.problem or exc.context}"
        ) from None
    except RecursionError:
        raise _too_deep(origin, None) from None
    except yaml.YAMLError as exc:  # unmarked: the reader's "unacceptable character #x0000"
        raise ManifestError(f"{origin}: invalid YAML: {exc}") from None
    except _CONSTRUCTOR_FAILURES:  # in the second half of a collection's constructor: no node
        raise ManifestError(
            f"{origin}: invalid YAML: a tagged value cannot be constructed"
        ) from None


def _check_depth(source: str, *, origin: str) -> None:
    """Refuse YAML nested deeper than `_MAX_DEPTH`, from libyaml's events (its parser uses a heap
    stack). Its C composer recurses without limit: a deep file would crash the whole process.
    The libyaml of PyYAML 6.0.4 refuses 1000 levels itself, in its scanner, which reads a line of
    `[[[...` ahead of the events: its error says the same as ours."""
    depth = 0
    try:
        for event in yaml.parse(source, Loader=_StrictLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > _MAX_DEPTH:
                    raise _too_deep(origin, event.start_mark)
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.MarkedYAMLError as exc:
        if "maximum nesting depth" not in (exc.problem or ""):
            raise
        raise _too_deep(origin, exc.problem_mark) from None


class _Mark(Protocol):
    """Where libyaml is in the text: its C and its Python marks alike."""

    line: int


def _too_deep(origin: str, mark: _Mark | None) -> ManifestError:
    line = f"line {mark.line + 1}: " if mark else ""
    return ManifestError(f"{origin}: {line}invalid YAML: nested too deeply")


def _documents(
    loaded: list[object], *, origin: str
) -> Iterator[tuple[str, Mapping[object, object]]]:
    """(where, mapping) for every non-empty document, with the items of `kind: List` unrolled."""
    for index, document in enumerate(loaded, start=1):
        where = f"document {index}"
        if document is None:
            continue
        if not isinstance(document, dict):
            raise ManifestError(
                f"{origin}: {where}: must be a mapping, not {describe_type(document)}"
            )
        if document.get("kind") != "List":
            yield where, document
            continue
        for item_index, item in enumerate(Reader(origin, where).sequence(document.get("items"))):
            if not isinstance(item, dict):
                raise ManifestError(f"{origin}: {where}: items[{item_index}]: must be a mapping")
            yield f"{where} items[{item_index}]", item
