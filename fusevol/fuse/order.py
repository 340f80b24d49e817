"""A directory's entries in order of inode number, the order READDIR lists them in.

Readdir offsets must be stable ids (the pyfuse3 examples say so), so the tree lists a directory
by inode number and resumes after the last inode a request returned (`Orders.entries`). A small
directory is sorted on each request; a large one's order is kept between requests and follows
its changes, for the few large directories listed lately: a listing of a tenant's 100,000 keys
takes thousands of READDIR requests.

This is a cache of what the directory's `fusevol.fuse.nodes.Entries` hold, never the truth: the
tree (`fusevol.fuse.tree`) tells it every entry that comes and goes, and it changes no node.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

    from fusevol.fuse.nodes import Entries, Node


class Orders:
    """Large directories' entries in inode order, while they do not change (`entries`)."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: dict[int, _Order] = {}

    def entries(self, directory: Node, after: int) -> Iterator[tuple[bytes, Node]]:
        """Entries ordered by inode number, starting after inode `after`: stable readdir offsets.

        A large directory's order is kept (`_ORDERS_KEPT` of them), and follows its changes
        (`entered`, `left`): a listing takes a READDIR request for every few dozen entries, and
        sorting all of them in each request made a listing of a tenant's 100,000 keys cost
        seconds of the trio thread (and minutes, while its entries change)."""
        assert directory.children is not None
        if len(directory.children) <= _ORDERED:
            for name, node in sorted(directory.children.items(), key=lambda item: item[1].inode):
                if node.inode > after:
                    yield name, node
            return
        order = self._kept.pop(directory.inode, None) or _Order.of(directory.children)
        self._kept[directory.inode] = order  # the most recently used last
        if len(self._kept) > _ORDERS_KEPT:
            del self._kept[next(iter(self._kept))]
        yield from order.after(after)

    def entered(self, directory: Node, name: bytes, node: Node) -> None:
        """`node` is now `directory`'s entry `name`: in the kept order, if there is one."""
        order = self._kept.get(directory.inode)
        if order is not None:
            order.insert(name, node)

    def left(self, directory: Node, node: Node) -> None:
        """`node` is no longer an entry of `directory`: out of the kept order, if there is one."""
        order = self._kept.get(directory.inode)
        if order is not None:
            order.remove(node)


_ORDERED = 64
"""Entries beyond which a directory's order by inode number is kept once sorted (`entries`)."""
_ORDERS_KEPT = 8
"""Directories whose order is kept at once: 24 bytes an entry each (100,000 keys: 2.4 MB)."""


@dataclass(frozen=True, slots=True)
class _Order:
    """A directory's entries in order of inode number: three lists, no tuple per entry."""

    inodes: list[int]
    names: list[bytes]
    nodes: list[Node]

    @classmethod
    def of(cls, children: Entries) -> _Order:
        ordered = sorted(children.items(), key=lambda item: item[1].inode)
        nodes = [node for _, node in ordered]
        return cls([node.inode for node in nodes], [name for name, _ in ordered], nodes)

    def after(self, inode: int) -> Iterator[tuple[bytes, Node]]:
        """The entries after `inode`, found by bisection, not by a walk from the first."""
        for at in range(bisect.bisect_right(self.inodes, inode), len(self.inodes)):
            yield self.names[at], self.nodes[at]

    def insert(self, name: bytes, node: Node) -> None:
        at = bisect.bisect_right(self.inodes, node.inode)
        self.inodes.insert(at, node.inode)
        self.names.insert(at, name)
        self.nodes.insert(at, node)

    def remove(self, node: Node) -> None:
        at = bisect.bisect_left(self.inodes, node.inode)
        if at < len(self.nodes) and self.nodes[at] is node:
            del self.inodes[at], self.names[at], self.nodes[at]
