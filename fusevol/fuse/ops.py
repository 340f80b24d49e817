"""pyfuse3 request handlers: a thin adapter over `fusevol.fuse.tree`.

Each handler converts its arguments, calls the tree, and converts the result to pyfuse3 types;
only `FUSEError` escapes. The file system is read-only for everyone but the agent itself: the
structural operations the agent performs through the mount to publish a version (mkdir, symlink,
rename, unlink, rmdir: `fusevol.fuse.publish`) are accepted only from the agent's publisher
(`is_agent(pid, uid, gid)`: its helper processes, `fusevol.fuse.vfs_helper`), and answered EROFS
for any other process. Everything that would write file data or attributes is EROFS for all.

No request ends the server: a handler that raises anything but an OSError (which answers its
errno) answers EIO and logs one line (`fusevol.fuse.answering`), whatever the input behind it.

What one pod's container could reach of another's through the one superblock they share is closed
here and in `fusevol.fuse.naming`: no export support (the kernel decodes no file handle to a node
it does not hold), unguessable node ids and generations for the handles of those it holds, and
the mount's root, whose handle is fixed, lists its entries only to callers in the agent's own
mount namespace (docs/security.md).

Permission checks are the kernel's (`default_permissions`), from the modes and owners in the tree.
Entries and attributes may be cached for long: a visible node never changes (tree.py), and every
structural change goes through the VFS, which keeps the kernel's caches right by itself, but the
creation of a name the kernel holds nothing of (docs/fuse.md fact 14).

The fast read path (docs/fuse.md fact 4) needs fusevol's patched pyfuse3 (`patches/pyfuse3`,
installed by `.ci/install-pyfuse3`); with stock pyfuse3 everything works as before, only slower. It
lets the kernel cache symlink targets, and open files without asking: once `open` has answered
ENOSYS, the kernel sends no more open or release requests for any file, and `read` is given the
inode, which is also the handle `open` returns otherwise. A hot open+read+close of `vol/key` then
costs no request at all. The kernel no longer asks before a write open either: through the pods'
read-only binds such opens still fail (the VFS refuses them); through the agent's own mount an open
with O_TRUNC fails in `setattr`, and any other write open succeeds and then fails in `write`. All
answer EROFS, and no byte can change.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
from typing import TYPE_CHECKING

import pyfuse3

from fusevol.fuse.answering import Failures, answering_errors
from fusevol.fuse.tree import ROOT_INODE

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from fusevol.fuse.naming import ConnectionKey
    from fusevol.fuse.nodes import Node
    from fusevol.fuse.tree import Tree

log = logging.getLogger(__name__)

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT


def own_mount_namespace() -> str:
    return os.readlink("/proc/self/ns/mnt")


def in_mount_namespace(pid: int, namespace: str) -> bool:
    """True if the process (or thread) `pid`, as our PID namespace numbers it, is in mount
    namespace `namespace`; False for pid 0 (a process our PID namespace does not see)."""
    try:
        return pid > 0 and os.readlink(f"/proc/{pid}/ns/mnt") == namespace
    except OSError:
        return False


def negotiated_capabilities() -> frozenset[str]:
    """The optional FUSE capabilities in effect (`cache_symlinks`, `no_open_support`, ...).

    Empty with stock pyfuse3, which cannot tell, and before the kernel's INIT request."""
    negotiated = getattr(pyfuse3, "negotiated_capabilities", None)
    return frozenset() if negotiated is None else frozenset(negotiated())


class Operations(pyfuse3.Operations):
    supports_dot_lookup = False
    """Also what makes pyfuse3 ask for export support: without it the kernel decodes no file
    handle to a node it does not hold (module docstring)."""
    enable_writeback_cache = False
    enable_acl = False
    enable_symlink_cache = True
    """Symlinks never change (a new version brings new symlink inodes): the kernel may keep their
    targets. Read by the patched pyfuse3 only, like `enable_no_open`."""
    enable_no_open = True
    """`open` may answer ENOSYS, after which the kernel opens files by itself (module docstring)."""
    refuse_locks = True
    """Every lock request answers ENOLCK (patched pyfuse3 only): a served file's inode is shared
    by the pods of a subtree, so a lock the kernel kept would let one pod block another's, a
    channel between pods kubelet's per-pod copies do not have (docs/security.md)."""

    def __init__(
        self,
        tree: Tree,
        *,
        is_agent: Callable[[int, int, int], bool],
        entry_timeout_s: float,
        attr_timeout_s: float,
        key: ConnectionKey | None = None,
    ) -> None:
        """`key`: the connection's (`fusevol.fuse.naming`), which may also be given once the
        agent has read it, before it serves; without one, every generation is 0."""
        super().__init__()
        self._tree = tree
        self._is_agent = is_agent
        self.key = key
        self._mount_namespace = own_mount_namespace()
        self._entry_timeout_s = entry_timeout_s
        self._attr_timeout_s = attr_timeout_s
        self.requests: collections.Counter[str] = collections.Counter()
        """Requests answered, by handler name: plain integers, read by the metrics at scrape."""
        self.read_bytes = 0
        self.capabilities: frozenset[str] = frozenset()
        """The optional FUSE capabilities negotiated at INIT (`init`); empty with stock pyfuse3."""
        self.failures = Failures()
        """Requests answered EIO for an unexpected exception (`fusevol.fuse.answering`)."""

    def init(self) -> None:
        """Called by pyfuse3 once the kernel's INIT request has fixed the capabilities."""
        self.capabilities = negotiated_capabilities()
        log.info(
            "FUSE capabilities negotiated %s",
            " ".join(sorted(self.capabilities)) or "(none known: stock pyfuse3)",
        )

    # -- reading -----------------------------------------------------------------------------------

    @answering_errors
    async def lookup(
        self, parent_inode: pyfuse3.InodeT, name: pyfuse3.FileNameT, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        self.requests["lookup"] += 1
        return self._attributes(self._tree.lookup(parent_inode, name))

    async def forget(self, inode_list: Sequence[tuple[pyfuse3.InodeT, int]]) -> None:
        """Has no answer: pyfuse3 would end `main()` on any exception, a FUSEError included."""
        self.requests["forget"] += 1
        for inode, nlookup in inode_list:
            try:
                self._tree.forget(inode, nlookup)
            except Exception as exc:
                self.failures.record("forget", exc)

    @answering_errors
    async def getattr(
        self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        self.requests["getattr"] += 1
        return self._attributes(self._tree[inode])

    @answering_errors
    async def readlink(self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext) -> bytes:
        self.requests["readlink"] += 1
        return self._tree[inode].target

    @answering_errors
    async def open(
        self, inode: pyfuse3.InodeT, flags: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.FileInfo:
        self.requests["open"] += 1
        if flags & _WRITE_FLAGS:
            raise pyfuse3.FUSEError(errno.EROFS)
        self._tree[inode]
        if "no_open_support" in self.capabilities:
            raise pyfuse3.FUSEError(errno.ENOSYS)  # the kernel opens files itself from now on
        return pyfuse3.FileInfo(fh=inode, keep_cache=True)

    @answering_errors
    async def read(self, fh: pyfuse3.FileHandleT, off: int, size: int) -> bytes:
        """`fh` is the inode: the handle `open` returns, or what pyfuse3 passes without an open."""
        self.requests["read"] += 1
        data = self._tree[fh].data[off : off + size]
        self.read_bytes += len(data)
        return data

    @answering_errors
    async def release(self, fh: pyfuse3.FileHandleT) -> None:
        self.requests["release"] += 1
        pass

    @answering_errors
    async def opendir(
        self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.FileHandleT:
        self.requests["opendir"] += 1
        node = self._tree[inode]
        if not node.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        if inode == ROOT_INODE and not in_mount_namespace(ctx.pid, self._mount_namespace):
            # The root's handle is fixed (1, 0): a container that has it must not learn the
            # names of other pods' subtrees (fusevol.fuse.naming).
            raise pyfuse3.FUSEError(errno.EACCES)
        return pyfuse3.FileHandleT(inode)

    @answering_errors
    async def readdir(
        self, fh: pyfuse3.FileHandleT, start_id: int, token: pyfuse3.ReaddirToken
    ) -> None:
        self.requests["readdir"] += 1
        directory = self._tree[fh]
        for name, node in self._tree.entries(directory, after=start_id):
            if not pyfuse3.readdir_reply(token, name, self._attributes(node), node.inode):
                return
            self._tree.remember(node)

    @answering_errors
    async def releasedir(self, fh: pyfuse3.FileHandleT) -> None:
        self.requests["releasedir"] += 1
        pass

    @answering_errors
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        self.requests["statfs"] += 1
        stats = pyfuse3.StatvfsData()
        stats.f_bsize = stats.f_frsize = 4096
        stats.f_files = self._tree.statistics().nodes
        stats.f_namemax = 255
        return stats

    # -- the agent's publishing operations ---------------------------------------------------------

    @answering_errors
    async def mkdir(
        self,
        parent_inode: pyfuse3.InodeT,
        name: pyfuse3.FileNameT,
        mode: int,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        self.requests["mkdir"] += 1
        self._require_agent(ctx)
        return self._attributes(self._tree.mkdir(parent_inode, name))

    @answering_errors
    async def symlink(
        self,
        parent_inode: pyfuse3.InodeT,
        name: pyfuse3.FileNameT,
        target: pyfuse3.FileNameT,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        self.requests["symlink"] += 1
        self._require_agent(ctx)
        return self._attributes(self._tree.symlink(parent_inode, name, target))

    @answering_errors
    async def rename(
        self,
        parent_inode_old: pyfuse3.InodeT,
        name_old: pyfuse3.FileNameT,
        parent_inode_new: pyfuse3.InodeT,
        name_new: pyfuse3.FileNameT,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> None:
        self.requests["rename"] += 1
        self._require_agent(ctx)
        if flags:
            raise pyfuse3.FUSEError(errno.EINVAL)
        self._tree.rename(parent_inode_old, name_old, parent_inode_new, name_new)

    @answering_errors
    async def unlink(
        self, parent_inode: pyfuse3.InodeT, name: pyfuse3.FileNameT, ctx: pyfuse3.RequestContext
    ) -> None:
        self.requests["unlink"] += 1
        self._require_agent(ctx)
        self._tree.unlink(parent_inode, name)

    @answering_errors
    async def rmdir(
        self, parent_inode: pyfuse3.InodeT, name: pyfuse3.FileNameT, ctx: pyfuse3.RequestContext
    ) -> None:
        self.requests["rmdir"] += 1
        self._require_agent(ctx)
        self._tree.rmdir(parent_inode, name)

    # -- refused to everyone -----------------------------------------------------------------------

    @answering_errors
    async def setattr(self, *args: object) -> pyfuse3.EntryAttributes:
        self.requests["setattr"] += 1
        raise pyfuse3.FUSEError(errno.EROFS)

    @answering_errors
    async def create(self, *args: object) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        self.requests["create"] += 1
        raise pyfuse3.FUSEError(errno.EROFS)

    @answering_errors
    async def mknod(self, *args: object) -> pyfuse3.EntryAttributes:
        self.requests["mknod"] += 1
        raise pyfuse3.FUSEError(errno.EROFS)

    @answering_errors
    async def link(self, *args: object) -> pyfuse3.EntryAttributes:
        self.requests["link"] += 1
        raise pyfuse3.FUSEError(errno.EROFS)

    @answering_errors
    async def write(self, fh: pyfuse3.FileHandleT, off: int, buf: bytes) -> int:
        self.requests["write"] += 1
        raise pyfuse3.FUSEError(errno.EROFS)

    @answering_errors
    async def setxattr(self, *args: object) -> None:
        self.requests["setxattr"] += 1
        raise pyfuse3.FUSEError(errno.EROFS)

    @answering_errors
    async def removexattr(self, *args: object) -> None:
        self.requests["removexattr"] += 1
        raise pyfuse3.FUSEError(errno.EROFS)

    # -- helpers -----------------------------------------------------------------------------------

    def _require_agent(self, ctx: pyfuse3.RequestContext) -> None:
        if not self._is_agent(ctx.pid, ctx.uid, ctx.gid):
            raise pyfuse3.FUSEError(errno.EROFS)

    def _attributes(self, node: Node) -> pyfuse3.EntryAttributes:
        attrs = pyfuse3.EntryAttributes()
        attrs.st_ino = node.inode
        attrs.st_mode = node.mode
        attrs.st_nlink = node.nlink
        attrs.st_uid = node.uid
        attrs.st_gid = node.gid
        attrs.st_size = node.size
        attrs.st_blksize = 4096
        attrs.st_blocks = (node.size + 511) // 512
        attrs.st_atime_ns = attrs.st_mtime_ns = attrs.st_ctime_ns = node.mtime_ns
        attrs.entry_timeout = self._entry_timeout_s
        attrs.attr_timeout = self._attr_timeout_s
        if self.key is not None:
            attrs.generation = self.key.generation(node.inode)
        return attrs
