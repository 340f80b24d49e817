"""Typed reads of manifest fields, each failure a `ManifestError` naming file, object and field.

Owns `Reader` (one per object being converted) and the field-level rules several kinds share: type
checks with Go's null-is-default decoding, modes, user ids, `IsConfigMapKey`, DNS names, base64,
`KeyToPath` items, `ValidateLocalNonReservedPath`, and the light check of resource quantities.

Quantities are checked against the pattern apimachinery's own error message states, plus their sign;
the exact parse (`fusevol.base.quantity`) happens where a quantity is used, when a downwardAPI file
reads it (`fusevol.projection.downward`). So a string such as `1i` that fits the pattern but is no
quantity is accepted here and fails when a downwardAPI file reads it; and the few strings
`ParseQuantity` takes without a leading number (`e3`, `Ki`) are refused here.

Excludes: which fields an object has (`fusevol.decode.manifest`, `fusevol.decode.volume_sources`).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import sys
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, cast

from fusevol.base.errors import ManifestError
from fusevol.model import KeyToPath

if TYPE_CHECKING:
    from collections.abc import Mapping

MAX_DATA_BYTES = 1024 * 1024
"""`MaxConfigMapSize` and `MaxSecretSize`: the sum of the lengths of every key and value."""

MAX_ID = 2**31 - 1

CONFIG_KEY = re.compile(r"[-._a-zA-Z0-9]+")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(rf"{DNS_LABEL.pattern}(\.{DNS_LABEL.pattern})*")
_KEY_MESSAGE = "a valid config key must consist of alphanumeric characters, '-', '_' or '.'"
# The API's pattern (the message below), written so that every string has one parse: digits after
# the number belong to it unless a suffix letter or sign came first. The API's own form backtracks
# quadratically on a long non-quantity (30,000 digits and an `x`: seconds, holding the GIL).
_QUANTITY = re.compile(r"[+-]?[0-9.]+(?:[eEinumkKMGTP]+[-+]?[0-9]*|[-+][0-9]*)?")
_QUANTITY_MESSAGE = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)
_NEGATIVE = re.compile(r"-[0.]*[1-9]")
_TYPE_NAMES = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}
_T = TypeVar("_T")

NO_ENTRIES: Mapping[str, Any] = MappingProxyType({})
"""The map of every object that has no entries (labels, annotations, resources, binary data):
one for all, read-only, where each held an empty dict of its own (64 bytes, thousands of pods)."""


@dataclass(frozen=True, slots=True)
class Reader:
    """Reads typed fields of one object; every failure names the file, the object and the field."""

    origin: str
    subject: str

    def fail(self, path: str, message: str) -> NoReturn:
        raise ManifestError(
            f"{self.origin}: {self.subject}: {path}: {message}", field=f"{path}: {message}"
        )

    def expect(self, value: object, path: str, default: _T) -> _T:
        """`value` if it has the type of `default`; `default` if it is null, as Go decodes null."""
        if value is None:
            return default
        if not isinstance(value, type(default)):
            self.fail(path, f"must be {_TYPE_NAMES[type(default)]}, not {describe_type(value)}")
        return value

    def mapping(self, value: object, path: str) -> Mapping[object, object]:
        return self.expect(value, path, cast("dict[object, object]", {}))

    def sequence(self, value: object, path: str = "items") -> list[object]:
        return self.expect(value, path, cast("list[object]", []))

    def string(self, value: object, path: str, *, required: bool = False) -> str:
        value = self.expect(value, path, "")
        if required and not value:
            self.fail(path, "Required value")
        if not value.isascii() and value.encode(errors="replace").decode() != value:
            self.fail(path, "must be valid Unicode (a lone surrogate escape)")  # JSON's "\\ud800"
        return value

    def term(self, value: object, path: str, *, required: bool = False) -> str:
        """A string many objects repeat (a namespace, a node, a volume's or an object's name, a
        key, a mount path): one copy for all of them (`sys.intern`), where each object read from
        JSON would hold its own. The pods of one Deployment repeat nearly every string of their
        spec; a node of thousands of pods holds each once."""
        return sys.intern(self.string(value, path, required=required))

    def boolean(self, value: object, path: str) -> bool:
        return self.expect(value, path, False)

    def integer(self, value: object, path: str, *, maximum: int, message: str) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"must be an integer, not {describe_type(value)}")
        if not 0 <= value <= maximum:
            self.fail(path, message)
        return value

    def mode(self, value: object, path: str) -> int | None:
        message = "must be a number between 0 and 0777 (octal), both inclusive"
        return self.integer(value, path, maximum=0o777, message=message)

    def user_id(self, value: object, path: str) -> int | None:
        message = f"must be between 0 and {MAX_ID}, inclusive"
        return self.integer(value, path, maximum=MAX_ID, message=message)

    def string_map(self, value: object, path: str, *, terms: bool = False) -> Mapping[str, str]:
        """Keys are `term`s (labels, annotations and data keys repeat from object to object);
        values too with `terms` (labels)."""
        result: dict[str, str] = {}
        read = self.term if terms else self.string
        for key, item in self.mapping(value, path).items():
            if not isinstance(key, str):
                self.fail(path, f"key {key!r} must be a string")
            result[sys.intern(key)] = read(item, f"{path}[{quote(key)}]")
        return result or NO_ENTRIES

    def quantity_map(self, value: object, path: str) -> Mapping[str, str]:
        """Resource name -> quantity text; YAML numbers are taken as written (`0.5`, `2`)."""
        result: dict[str, str] = {}
        for key, item in self.mapping(value, path).items():
            if not isinstance(key, str):
                self.fail(path, f"key {key!r} must be a string")
            at = f"{path}[{quote(key)}]"
            if isinstance(item, (int, float)) and not isinstance(item, bool):
                item = str(item)
            text = self.string(item, at, required=True)
            if not _QUANTITY.fullmatch(text):
                self.fail(at, f"invalid value {quote(_shortened(text))}: {_QUANTITY_MESSAGE}")
            if _NEGATIVE.match(text):
                self.fail(at, f"invalid value {quote(text)}: must be greater than or equal to 0")
            result[key] = text
        return result or NO_ENTRIES

    def decode_base64(self, text: str, path: str) -> bytes:
        # Go's StdEncoding skips CR and LF (folded YAML) but is otherwise strict and padded.
        try:
            return base64.b64decode(text.replace("\n", "").replace("\r", ""), validate=True)
        except (binascii.Error, ValueError) as exc:
            self.fail(path, f"illegal base64 data: {exc}")

    def config_key(self, key: str, path: str) -> None:
        """`IsConfigMapKey`; keys pass the regex first, so their length in bytes is `len()`."""
        if not CONFIG_KEY.fullmatch(key):
            self.fail(path, _KEY_MESSAGE)
        if len(key) > 253:
            self.fail(path, "must be no more than 253 bytes")
        if key in (".", ".."):
            self.fail(path, f"must not be '{key}'")
        if key.startswith(".."):
            self.fail(path, "must not start with '..'")

    def total_size(self, size: int) -> None:
        if size > MAX_DATA_BYTES:
            self.fail("data", f"Too long: must have at most {MAX_DATA_BYTES} bytes (has {size})")

    def dns_name(self, name: str, path: str, *, subdomain: bool) -> None:
        pattern, limit = (DNS_SUBDOMAIN, 253) if subdomain else (DNS_LABEL, 63)
        if len(name) > limit:
            self.fail(path, f"must be no more than {limit} characters")
        if not pattern.fullmatch(name):
            kind = "subdomain" if subdomain else "label"
            self.fail(path, f"must be a lowercase RFC 1123 {kind} (regex {pattern.pattern!r})")

    def items(self, value: object, path: str) -> tuple[KeyToPath, ...]:
        items: list[KeyToPath] = []
        for index, raw in enumerate(self.sequence(value, path)):
            item_path = f"{path}[{index}]"
            item = self.mapping(raw, item_path)
            key = self.term(item.get("key"), f"{item_path}.key", required=True)
            target = self.term(item.get("path"), f"{item_path}.path", required=True)
            self.local_path(target, f"{item_path}.path")
            items.append(KeyToPath(key, target, self.mode(item.get("mode"), f"{item_path}.mode")))
        return tuple(items)

    def local_path(self, target: str, path: str) -> None:
        """`ValidateLocalNonReservedPath`: relative, no `..` element, not starting with `..`."""
        if target.startswith("/"):
            self.fail(path, f"invalid value {quote(target)}: must be a relative path")
        if ".." in target.split("/"):
            self.fail(path, f"invalid value {quote(target)}: must not contain '..'")
        if target.startswith(".."):
            self.fail(path, f"invalid value {quote(target)}: must not start with '..'")


def quote(key: str) -> str:
    """A key or value in double quotes, JSON-escaped, for an error message."""
    return json.dumps(key)


def describe_type(value: object) -> str:
    """How an error message names the YAML/JSON type of `value`."""
    return "null" if value is None else type(value).__name__


def _shortened(text: str, limit: int = 64) -> str:
    """`text`, cut to `limit` characters for an error message (a field can be megabytes long)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
