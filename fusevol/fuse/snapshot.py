"""The FUSE tree's state in a memfd, for a successor that takes the live connection over.

The kernel holds node ids (inode numbers) and file handles (also inode numbers, `fusevol.fuse.ops`)
that the agent handed out; a successor that answers the same connection must answer for the same
numbers with the same content, or a file opened before fails after. So every change the kernel
may know of is written here before its reply leaves: the agent's structural operations (mkdir of a
staged subtree, symlink, rename, unlink, rmdir) and the lookup counts (lookup, readdirplus,
forget). The
memfd is memory, never disk (secrets stay in memory); the launcher keeps a descriptor of it beside
the `/dev/fuse` one (`fusevol.agent.launcher`), so it outlives the agent.

Layout of the memfd:

    0     header: magic, format, INIT offset and length, base offset and length
    64    the kernel's INIT request, as the agent read it (`pyfuse3.init_request`)
    4096  the first base: the whole tree (pickled node records), then the journal
    ...   records: u32 length, then one pickled or packed record; a zero length ends them

Writes are ordered so that a kill -9 at any instant leaves a readable state: a record's body is
written before its length (a 4-byte write, which a signal cannot cut), a new base (`compact`, when
the journal has grown past the base) before the header that points to it. The reader
(`restore`) truncates whatever follows the last complete record, so the successor appends to a
clean end. Lookup counts may be over-counted (a lookup recorded whose reply never left): a node is
then kept a little longer, never dropped while the kernel holds it.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import os
import pickle
import stat
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fusevol.base.errors import FusevolError
from fusevol.fuse.nodes import Entries, Node, walk
from fusevol.fuse.session import Connection, can_take_over
from fusevol.fuse.tree import Tree

if TYPE_CHECKING:
    from collections.abc import Iterator

log = logging.getLogger(__name__)

MAGIC = b"FUSEVOL\x01"
_HEADER = struct.Struct("<8sQQQQ")  # magic, init offset, init length, base offset, base length
_INIT_OFFSET = 64
_INIT_MAX = 4096 - _INIT_OFFSET
_FIRST_BASE = 4096
_LENGTH = struct.Struct("<I")
_LOOKUP = struct.Struct("<cQ")
_FORGET = struct.Struct("<cQQ")
_SLACK = 1 << 20
"""Journal bytes beyond four bases that a busy agent lets accumulate before compacting ..."""
_TIDY_SLACK = 64 << 10
"""... and an idle one (`Journal.tidy`)."""
_FALLOC_FL_KEEP_SIZE = 1
_FALLOC_FL_PUNCH_HOLE = 2
_libc = ctypes.CDLL(None, use_errno=True)

_NodeRecord = tuple[int, int, int, int, int, bytes, bytes, "list[tuple[bytes, int]] | None", int]
"""inode, mode, uid, gid, mtime_ns, data, target, children (name, inode) or None, nlookup."""


class StateError(Exception):
    """The memfd holds no readable state."""


@dataclass(frozen=True, slots=True)
class Restored:
    tree: Tree
    init_request: bytes | None
    journal: Journal
    """Attached to `tree`: goes on writing into the same memfd."""


class Journal:
    """Writes the tree's state into a memfd; a `fusevol.fuse.tree.TreeObserver`."""

    def __init__(self, fd: int, *, end: int, base_length: int) -> None:
        self.fd = fd
        self._end = end
        self._base_length = base_length
        self._journal_bytes = 0
        self._tree: Tree | None = None
        self._map: mmap.mmap | None = None
        """The memfd mapped from 0 to its size: records are memory stores, not system calls."""

    @classmethod
    def create(cls, tree: Tree) -> Journal:
        """A new memfd holding `tree` (a fresh agent's, nearly empty)."""
        fd = os.memfd_create("fusevol-state", os.MFD_CLOEXEC)
        os.pwrite(fd, _HEADER.pack(MAGIC, 0, 0, 0, 0), 0)
        journal = cls(fd, end=_FIRST_BASE, base_length=0)
        journal.attach(tree)
        journal.compact()
        return journal

    def attach(self, tree: Tree) -> None:
        self._tree = tree
        tree.observer = self

    def write_init(self, request: bytes) -> None:
        """Keep the kernel's INIT request: what a successor negotiates again (`pyfuse3.resume`)."""
        if len(request) > _INIT_MAX:
            raise ValueError(f"INIT request of {len(request)} bytes: more than {_INIT_MAX}")
        os.pwrite(self.fd, request, _INIT_OFFSET)
        _, _, _, base, length = _HEADER.unpack(os.pread(self.fd, _HEADER.size, 0))
        os.pwrite(self.fd, _HEADER.pack(MAGIC, _INIT_OFFSET, len(request), base, length), 0)

    def compact(self) -> None:
        """Write the whole tree as a new base, point the header at it, and free the memory of the
        old base and journal. The new base goes after the journal, or back at the start of the
        memfd when it fits below the old base, so that offsets (and the mapping) stay within
        about twice what is alive. Outside the live base and journal the memfd reads as zeros."""
        assert self._tree is not None
        body = pickle.dumps(_dump(self._tree), protocol=pickle.HIGHEST_PROTOCOL)
        _, init, init_length, old_base, _ = _HEADER.unpack(os.pread(self.fd, _HEADER.size, 0))
        wrap = len(body) <= old_base - _FIRST_BASE
        base = _FIRST_BASE if wrap else self._end
        if wrap:  # zeros for sure (an earlier compaction cut short by a kill may have left some)
            _punch_hole(self.fd, _FIRST_BASE, old_base - _FIRST_BASE)
        os.pwrite(self.fd, body, base)
        os.pwrite(self.fd, _HEADER.pack(MAGIC, init, init_length, base, len(body)), 0)
        if wrap:
            _punch_hole(self.fd, old_base, self._end - old_base)
            os.ftruncate(self.fd, base + len(body))  # shrink the file, and the mapping with it,
            if self._map is not None:  # mapped again at once: it holds a descriptor, as many
                self._grow(base + len(body))  # at rest as after the next record
        elif old_base:
            _punch_hole(self.fd, old_base, base - old_base)
        self._end = base + len(body)
        self._base_length = len(body)
        self._journal_bytes = 0

    # -- TreeObserver ------------------------------------------------------------------------------

    def remembered(self, node: Node) -> None:
        self._append(_LOOKUP.pack(b"L", node.inode))

    def forgot(self, inode: int, nlookup: int) -> None:
        self._append(_FORGET.pack(b"F", inode, nlookup))

    def attached(self, parent: Node, name: bytes, node: Node) -> None:
        """`node` (a new subtree: mkdir, symlink) was attached at `parent/name`."""
        self._append(b"A" + pickle.dumps((parent.inode, name, [_record(n) for n in walk(node)])))

    def renamed(self, old_parent: Node, old: bytes, new_parent: Node, new: bytes) -> None:
        self._append(b"R" + pickle.dumps((old_parent.inode, old, new_parent.inode, new)))

    def removed(self, parent: Node, name: bytes) -> None:
        self._append(b"D" + pickle.dumps((parent.inode, name)))

    def _append(self, body: bytes) -> None:
        start, end = self._end + _LENGTH.size, self._end + _LENGTH.size + len(body)
        if self._map is None or len(self._map) < end:
            self._grow(end)
        assert self._map is not None
        self._map[start:end] = body
        self._map[self._end : start] = _LENGTH.pack(len(body))  # one aligned 4-byte store, last
        self._end = end
        self._journal_bytes += _LENGTH.size + len(body)
        if self._journal_bytes > 4 * self._base_length + _SLACK:  # amortised: O(1) a byte
            self.compact()

    def tidy(self) -> None:
        """Compact if the journal outweighs the base: what the agent calls when it is idle, so
        that at rest the memfd holds little more than the live tree. Busy, the journal may grow
        to four times the base and a MiB before it is compacted; at rest that history is memory
        kept for nothing (bench/soak.py saw the agent's RSS swing 0.1-0.8 MiB with it). Still
        O(1) a byte: each compaction follows at least a base's worth of records."""
        if self._journal_bytes > max(self._base_length, _TIDY_SLACK):
            self.compact()

    def _grow(self, needed: int) -> None:
        """Map the memfd up to at least `needed` bytes (twice that: amortised)."""
        size = max(os.fstat(self.fd).st_size, needed * 2, 1 << 20)
        size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        os.ftruncate(self.fd, size)  # grows only: what is beyond the end reads as zeros
        if self._map is not None:
            self._map.close()
        self._map = mmap.mmap(self.fd, size)


def fuse_state(
    take_over: tuple[int, int] | None, *, launched: bool
) -> tuple[Tree, Journal | None, Connection | None]:
    """An agent's FUSE tree, the journal of its state kept for a successor (launched agents with
    the patched pyfuse3 only), and the connection to take over: `take_over`, the (fuse fd, state
    fd) its launcher handed it after a crash or an upgrade-restart (`fusevol.agent.launcher`)."""
    if not launched or not can_take_over():
        return Tree(), None, None
    if take_over is None:
        tree = Tree()
        return tree, Journal.create(tree), None
    fuse_fd, state_fd = take_over
    restored = restore(state_fd)
    if restored.init_request is None:
        raise FusevolError("the FUSE state handed over has no INIT request")
    log.info("taking the FUSE connection over inodes=%d", restored.tree.statistics().nodes)
    return restored.tree, restored.journal, Connection(fuse_fd, restored.init_request)


def restore(fd: int) -> Restored:
    """The tree (and the INIT request) the memfd `fd` holds, with a `Journal` attached that goes on
    writing into it (its end truncated past the last complete record)."""
    header = os.pread(fd, _HEADER.size, 0)
    if len(header) < _HEADER.size:
        raise StateError("not a fusevol state memfd")
    magic, init, init_length, base, base_length = _HEADER.unpack(header)
    if magic != MAGIC or not base:
        raise StateError("not a fusevol state memfd")
    request = os.pread(fd, init_length, init) if init_length else None
    tree = _load(pickle.loads(_read(fd, base, base_length)))
    end = base + base_length
    for body, next_end in _records(fd, end):
        _replay(tree, body)
        end = next_end
    os.ftruncate(fd, end)
    journal = Journal(fd, end=end, base_length=base_length)
    journal.attach(tree)
    return Restored(tree, request, journal)


def _records(fd: int, offset: int) -> Iterator[tuple[bytes, int]]:
    size = os.fstat(fd).st_size
    while offset + _LENGTH.size <= size:
        (length,) = _LENGTH.unpack(os.pread(fd, _LENGTH.size, offset))
        if not length or offset + _LENGTH.size + length > size:
            return
        offset += _LENGTH.size + length
        yield _read(fd, offset - length, length), offset


def _replay(tree: Tree, body: bytes) -> None:
    kind = body[:1]
    if kind == b"L":
        tree.remember(tree[_LOOKUP.unpack(body)[1]])
    elif kind == b"F":
        _, inode, nlookup = _FORGET.unpack(body)
        tree.forget(inode, nlookup)
    elif kind == b"A":
        parent, name, records = pickle.loads(body[1:])
        nodes = _nodes(records)
        tree.adopt(tree[parent], name, nodes[records[0][0]])
    elif kind == b"R":
        tree.rename(*pickle.loads(body[1:]))
    elif kind == b"D":
        parent, name = pickle.loads(body[1:])
        node = tree.child(tree[parent], name)
        (tree.rmdir if node is not None and node.is_dir else tree.unlink)(parent, name)
    else:
        raise StateError(f"unknown record {kind!r}")


def _dump(tree: Tree) -> tuple[int, list[_NodeRecord], list[int]]:
    """(next inode, every node reachable or known to the kernel, the detached roots' inodes)."""
    known = tree.known_nodes()
    return tree.next_inode, [_record(n) for n in known], [n.inode for n in known if n.attached]


def _load(dumped: tuple[int, list[_NodeRecord], list[int]]) -> Tree:
    next_inode, records, attached = dumped
    nodes = _nodes(records)
    return Tree.restored(nodes, attached=set(attached), next_inode=next_inode)


def _nodes(records: list[_NodeRecord]) -> dict[int, Node]:
    nodes: dict[int, Node] = {}
    for inode, mode, uid, gid, mtime_ns, data, target, _, nlookup in records:
        nodes[inode] = Node(
            inode,
            mode,
            uid,
            gid,
            mtime_ns,
            content=target if stat.S_ISLNK(mode) else data,
            children=Entries() if stat.S_ISDIR(mode) else None,
            nlookup=nlookup,
        )
    for inode, *_, children, _ in records:
        for name, child in children or ():
            if child in nodes:  # a child neither attached nor known is not recorded
                nodes[inode].children[name] = nodes[child]  # type: ignore[index]
                nodes[child].parent = nodes[inode]
    return nodes


def _record(node: Node) -> _NodeRecord:
    children = None
    if node.children is not None:
        children = [(name, child.inode) for name, child in node.children.items()]
    return (
        node.inode,
        node.mode,
        node.uid,
        node.gid,
        node.mtime_ns,
        node.data,
        node.target,
        children,
        node.nlookup,
    )


def _read(fd: int, offset: int, length: int) -> bytes:
    chunks = []
    while length:
        chunk = os.pread(fd, length, offset)
        if not chunk:
            raise StateError("the state memfd ends early")
        chunks.append(chunk)
        offset += len(chunk)
        length -= len(chunk)
    return b"".join(chunks)


def _punch_hole(fd: int, offset: int, length: int) -> None:
    """Free the memory of a region no longer read (it reads as zeros)."""
    with contextlib.suppress(OSError):
        mode = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE
        if _libc.fallocate(fd, mode, ctypes.c_int64(offset), ctypes.c_int64(length)) != 0:
            raise OSError(ctypes.get_errno(), "fallocate")
