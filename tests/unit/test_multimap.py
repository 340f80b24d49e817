"""`SetMultimap`: a dict of sets that holds a lone member bare."""

from __future__ import annotations

import sys

from fusevol.base.multimap import SetMultimap


def test_members_come_and_go_with_their_key() -> None:
    index: SetMultimap[str, tuple[str, str]] = SetMultimap()
    assert "a" not in index
    assert index.get("a") == ()
    index.add("a", ("pod", "x"))
    index.add("a", ("pod", "x"))  # already a member
    assert list(index.get("a")) == [("pod", "x")]
    index.add("a", ("pod", "y"))
    index.add("b", ("pod", "z"))
    assert set(index.get("a")) == {("pod", "x"), ("pod", "y")}
    assert len(index) == 2
    index.discard("a", ("pod", "x"))
    assert list(index.get("a")) == [("pod", "y")]
    index.discard("a", ("pod", "other"))  # not a member: nothing changes
    assert list(index.get("a")) == [("pod", "y")]
    index.discard("a", ("pod", "y"))
    assert "a" not in index
    index.discard("a", ("pod", "y"))  # no key: nothing to do
    assert list(index.get("b")) == [("pod", "z")]
    assert len(index) == 1


def test_a_lone_member_costs_no_set() -> None:
    index: SetMultimap[int, bytes] = SetMultimap()
    plain: dict[int, set[bytes]] = {}
    for key in range(100):
        index.add(key, b"shared-%d" % key)
        plain.setdefault(key, set()).add(b"shared-%d" % key)
    held = sum(sys.getsizeof(member) for member in index._members.values())
    assert held < sum(sys.getsizeof(members) for members in plain.values()) / 3
