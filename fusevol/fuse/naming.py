"""What a container could guess of the mount, made unguessable: node ids, generations, and the
names of the volumes' subtrees.

One FUSE superblock serves every pod (docs/fuse.md fact 1), so what the kernel keeps per superblock
is shared by all pods. A file handle is one such thing: `open_by_handle_at(2)`, for a caller with
CAP_DAC_READ_SEARCH (a container given it, as backup and monitoring charts do), opens whatever
node of the superblock a handle names, through any bind of it, its own pod's included; a handle
is (node id, generation), in the kernel's `fuse_fh_to_dentry` (docs/security.md). kubelet's
per-pod tmpfs copies have no such reach. Here:

- The connection never negotiates export support (`fusevol.fuse.ops`): the kernel decodes a handle
  only to a node it holds already, and asks the server nothing.
- A node id is its number in order of making with 31 random bits below it (`numbered`), and
  each node's generation is a keyed hash of its id (`ConnectionKey.generation`): a handle to
  another pod's node cannot be guessed (2^63 tries for each node); ids still grow in order of
  making (readdir's order and offsets) and are never handed out twice.
- The handle of the mount's root, which the kernel gives node id 1 and generation 0 whatever the
  server says, cannot be made unguessable: the root lists nothing for a caller outside the
  agent's mount namespace (`fusevol.fuse.ops`), and the subtrees' names are keyed hashes too
  (`ConnectionKey.subtree_name`, used by the reconciler), so that what the kernel has cached below
  the root is reached by no name a container can know but its own volume's (its mountinfo shows
  it).

The key belongs to the connection: made when the agent mounts (`<root>/fusevol/fuse.key`, 0600),
read by an agent that takes the connection over. A connection made by an agent that had no key
keeps its subtrees' readable names (`keyed_names` False) until the next fresh mount, and its nodes
from before (ids below 2^32, numbered in order) keep generation 0, which is what the kernel holds.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fusevol.base.fsutil import replace_file

if TYPE_CHECKING:
    from pathlib import Path

log = logging.getLogger(__name__)

SEQUENTIAL_LIMIT = 1 << 32
"""Node ids below this were numbered in order (by an agent before these ones): their generation
is 0. `numbered` ones are above it (numbers from 2 on)."""
_RANDOM_BITS = 31

_KEY_BYTES = 32
_KEYED_NAMES = b"K"
_READABLE_NAMES = b"R"


def numbered(number: int) -> int:
    """The node id of the `number`th node made (2 and up): nobody can guess it, and it is above
    every id of a node made before."""
    return number << _RANDOM_BITS | _random_bits()


_POOLED = 256
"""Random numbers drawn from the system at once (`_random_bits`)."""
_pool: list[int] = []


def _random_bits() -> int:
    """`_RANDOM_BITS` bits of the system's CSPRNG (`secrets`), drawn `_POOLED` at a time. Each
    draw is a getrandom(2), which lets go of the GIL: drawn one by one, every node the trio
    thread made waited for any busy thread (gRPC's, a worker) to give the GIL back, 180 us a
    node beside one busy thread against 0.7 us alone; drawn from the pool, 0.2 us either way."""
    while True:
        try:
            return _pool.pop()
        except IndexError:  # empty (another thread may have taken the last one meanwhile)
            data = secrets.token_bytes(4 * _POOLED)
            _pool.extend(n >> (32 - _RANDOM_BITS) for n in struct.unpack(f"<{_POOLED}I", data))


os.register_at_fork(after_in_child=_pool.clear)  # a child draws its own


def number_after(inode: int) -> int:
    """The first number whose ids (`numbered`) are above `inode`, whichever way it was made."""
    return (inode >> _RANDOM_BITS) + 1 if inode >= SEQUENTIAL_LIMIT else inode + 1


@dataclass(frozen=True, slots=True)
class ConnectionKey:
    key: bytes
    keyed_names: bool
    """False on a connection an agent without keys made: its subtrees keep their readable names
    (`<pod uid>_<volume>`, `shared-<spec digest>`), which a successor must find again."""

    @classmethod
    def for_connection(cls, path: Path, *, fresh: bool) -> ConnectionKey:
        """The key of our connection: a new one for a `fresh` mount (written to `path`, 0600),
        else the one at `path`; a connection taken over from an agent that had none gets a key for
        the nodes made from now on, and keeps readable names."""
        if not fresh:
            with contextlib.suppress(FileNotFoundError):
                data = path.read_bytes()
                if len(data) == _KEY_BYTES + 1 and data[-1:] in (_KEYED_NAMES, _READABLE_NAMES):
                    return cls(data[:_KEY_BYTES], keyed_names=data[-1:] == _KEYED_NAMES)
                log.error("%s is not a key fusevol wrote: made anew, names kept readable", path)
        made = cls(secrets.token_bytes(_KEY_BYTES), keyed_names=fresh)
        replace_file(path, made.key + (_KEYED_NAMES if made.keyed_names else _READABLE_NAMES))
        return made

    def generation(self, inode: int) -> int:
        """The node's generation: 0 for the nodes numbered in order, else a keyed hash of its id."""
        if inode < SEQUENTIAL_LIMIT:
            return 0
        digest = hashlib.blake2b(inode.to_bytes(8, "little"), key=self.key, digest_size=4)
        return int.from_bytes(digest.digest(), "little")

    def subtree_name(self, readable: bytes) -> bytes:
        """The name of the subtree whose readable name is `readable`: a keyed hash of it, with
        its prefix kept (`shared-`, or none for a pod's own), or `readable` itself on a
        connection that keeps readable names."""
        if not self.keyed_names:
            return readable
        prefix = readable[: readable.index(b"-") + 1] if readable.startswith(b"shared-") else b""
        digest = hashlib.blake2b(readable, key=self.key, digest_size=16, person=b"subtree")
        return prefix + digest.hexdigest().encode()
