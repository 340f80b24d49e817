"""A dict of sets for indexes where almost every key has one member.

`SetMultimap` holds a key's lone member bare and makes a set only for the second: an empty set
costs 216 bytes, a set of one as much, and the reconciler's indexes hold one per pod volume or
watched object (the users of a subtree, the subtrees built from an object), nearly all of one
member. Members are hashable, and never None nor a set (that is how a missing key and a held set
are told from a bare member).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from collections.abc import Collection, Hashable

K = TypeVar("K", bound="Hashable")
V = TypeVar("V", bound="Hashable")


class SetMultimap(Generic[K, V]):
    __slots__ = ("_members",)

    def __init__(self) -> None:
        self._members: dict[K, V | set[V]] = {}

    def add(self, key: K, member: V) -> None:
        held = self._members.get(key)
        if held is None:
            self._members[key] = member
        elif isinstance(held, set):
            held.add(member)
        elif held != member:
            self._members[key] = {held, member}

    def discard(self, key: K, member: V) -> None:
        """Remove `member` from `key`'s; the key goes with its last member."""
        held = self._members.get(key)
        if isinstance(held, set):
            held.discard(member)
            if len(held) == 1:
                self._members[key] = next(iter(held))
        elif held is not None and held == member:
            del self._members[key]

    def get(self, key: K) -> Collection[V]:
        """`key`'s members (empty if none); not to be changed, nor kept across a change."""
        held = self._members.get(key)
        if held is None:
            return ()
        if isinstance(held, set):
            return held
        return (held,)

    def __contains__(self, key: object) -> bool:
        """True if `key` has a member."""
        return key in self._members

    def __len__(self) -> int:
        """The keys with a member."""
        return len(self._members)
