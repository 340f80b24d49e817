"""What a reflector mirrors, and where the mirror goes: the `Query` (a kind, a namespace, a field
and a label selector, or one named object) and the `Handler` its items and events go to
(`Callbacks`: one made of two functions).

Excludes: the listing and watching (`reflector`), what the items mean (the handlers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from fusevol.kube.client import Obj
    from fusevol.kube.listing import Items
    from fusevol.model import Kind


@dataclass(frozen=True, slots=True)
class Query:
    kind: Kind
    namespace: str | None
    fields: str
    """The field selector, unless `name` is given."""
    label_selector: str = ""
    name: str = ""
    """One object's: the field selector is `metadata.name=<name>`, made for each request (the
    name is the object key's own string; thousands of selectors kept would be 64 bytes each)."""

    @property
    def field_selector(self) -> str:
        return f"metadata.name={self.name}" if self.name else self.fields

    def __str__(self) -> str:
        where = f" namespace={self.namespace}" if self.namespace else ""
        labels = f" labelSelector={self.label_selector}" if self.label_selector else ""
        return f"{self.kind.value.lower()}s{where} fieldSelector={self.field_selector}{labels}"


class Handler(Protocol):
    """What a reflector's items and events go to: an object with these two methods (a watched
    object's own, with no bound method kept for each of thousands), or `Callbacks`."""

    def on_replace(self, items: Items, /) -> Awaitable[None]:
        """The complete current state (1); the list is the handler's: it may empty it."""

    def on_event(self, kind: str, obj: Obj, /) -> Awaitable[None]:
        """One ADDED, MODIFIED or DELETED event (2)."""


@dataclass(frozen=True, slots=True)
class Callbacks:
    """A `Handler` made of two functions."""

    on_replace: Callable[[Items], Awaitable[None]]
    on_event: Callable[[str, Obj], Awaitable[None]]
