"""pyfuse3 request handlers: a thin adapter over `fusevol.fuse.tree`.

Each handler converts its arguments, calls the tree, and converts the result to pyfuse3 types;
only `FUSEError` escapes. The file system is read-only for everyone but the agent itself: the
structural operations the agent performs through the mount to publish a version (mkdir, symlink,
rename, unlink, rmdir: `fusevol.fuse.publish`) are accepted only from the agent's publisher
(`is_agent(pid, uid, gid)`: its helper processes, `fusevol.fuse.vfs_helper`), and answered EROFS
for any other process. Everything that would write file data or attributes is EROFS for all.

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
from typing import TYPE_CHECKING, ParamSpec, TypeVar

import pyfuse3

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from fusevol.fuse.tree import Node, Tree

log = logging.getLogger(__name__)

_P = ParamSpec("_P")
_R = TypeVar("_R")

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT


def negotiated_capabilities() -> frozenset[str]:
    """The optional FUSE capabilities in effect (`cache_symlinks`, `no_open_support`, ...).

    Empty with stock pyfuse3, which cannot tell, and before the kernel's INIT request."""
    negotiated = getattr(pyfuse3, "negotiated_capabilities", None)
    return frozenset() if negotiated is None else frozenset(negotiated())


class Operations(pyfuse3.Operations):
    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False
    enable_symlink_cache = True
    """Symlinks never change (a new version brings new symlink inodes): the kernel may keep their
    targets. Read by the patched pyfuse3 only, like `enable_no_open`."""
    enable_no_open = True
    """`open` may answer ENOSYS, after which the kernel opens files by itself (module docstring)."""

    def __init__(
        self,
        tree: Tree,
        *,
        is_agent: Callable[[int, int, int], bool],
        entry_timeout_s: float,
        attr_timeout_s: float,
    ) -> None:
        super().__init__()
        self._tree = tree
        self._is_agent = is_agent
        self._entry_timeout_s = entry_timeout_s
        self._attr_timeout_s = attr_timeout_s
        self.requests: collections.Counter[str] = collections.Counter()
        """Requests answered, by handler name: plain integers, read by the metrics at scrape."""
        self.read_bytes = 0
        self.capabilities: frozenset[str] = frozenset()
        """The optional FUSE capabilities negotiated at INIT (`init`); empty with stock pyfuse3."""

    def init(self) -> None:
        """Called by pyfuse3 once the kernel's INIT request has fixed the capabilities."""
        self.capabilities = negotiated_capabilities()
        log.info(
            "FUSE capabilities negotiated %s",
            " ".join(sorted(self.capabilities)) or "(none known: stock pyfuse3)",
        )

    # -- reading -----------------------------------------------------------------------------------

    async def lookup(
        self, parent_inode: pyfuse3.InodeT, name: pyfuse3.FileNameT, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        self.requests["lookup"] += 1
        return self._attributes(_call(self._tree.lookup, parent_inode, name))

    async def forget(self, inode_list: Sequence[tuple[pyfuse3.InodeT, int]]) -> None:
        self.requests["forget"] += 1
        for inode, nlookup in inode_list:
            self._tree.forget(inode, nlookup)

    async def getattr(
        self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        self.requests["getattr"] += 1
        return self._attributes(_call(self._tree.__getitem__, inode))

    async def readlink(self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext) -> bytes:
        self.requests["readlink"] += 1
        return _call(self._tree.__getitem__, inode).target

    async def open(
        self, inode: pyfuse3.InodeT, flags: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.FileInfo:
        self.requests["open"] += 1
        if flags & _WRITE_FLAGS:
            raise pyfuse3.FUSEError(errno.EROFS)
        _call(self._tree.__getitem__, inode)
        if "no_open_support" in self.capabilities:
            raise pyfuse3.FUSEError(errno.ENOSYS)  # the kernel opens files itself from now on
        return pyfuse3.FileInfo(fh=inode, keep_cache=True)

    async def read(self, fh: pyfuse3.FileHandleT, off: int, size: int) -> bytes:
        """`fh` is the inode: the handle `open` returns, or what pyfuse3 passes without an open."""
        self.requests["read"] += 1
        data = _call(self._tree.__getitem__, fh).data[off : off + size]
        self.read_bytes += len(data)
        return data

    async def release(self, fh: pyfuse3.FileHandleT) -> None:
        self.requests["release"] += 1
        pass

    async def opendir(
        self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.FileHandleT:
        self.requests["opendir"] += 1
        node = _call(self._tree.__getitem__, inode)
        if not node.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return pyfuse3.FileHandleT(inode)

    async def readdir(
        self, fh: pyfuse3.FileHandleT, start_id: int, token: pyfuse3.ReaddirToken
    ) -> None:
        self.requests["readdir"] += 1
        directory = _call(self._tree.__getitem__, fh)
        for name, node in self._tree.entries(directory, after=start_id):
            if not pyfuse3.readdir_reply(token, name, self._attributes(node), node.inode):
                return
            self._tree.remember(node)

    async def releasedir(self, fh: pyfuse3.FileHandleT) -> None:
        self.requests["releasedir"] += 1
        pass

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        self.requests["statfs"] += 1
        stats = pyfuse3.StatvfsData()
        stats.f_bsize = stats.f_frsize = 4096
        stats.f_files = self._tree.statistics().nodes
        stats.f_namemax = 255
        return stats

    # -- the agent's publishing operations ---------------------------------------------------------

    async def mkdir(
        self,
        parent_inode: pyfuse3.InodeT,
        name: pyfuse3.FileNameT,
        mode: int,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        self.requests["mkdir"] += 1
        self._require_agent(ctx)
        return self._attributes(_call(self._tree.mkdir, parent_inode, name))

    async def symlink(
        self,
        parent_inode: pyfuse3.InodeT,
        name: pyfuse3.FileNameT,
        target: pyfuse3.FileNameT,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        self.requests["symlink"] += 1
        self._require_agent(ctx)
        return self._attributes(_call(self._tree.symlink, parent_inode, name, target))

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
        _call(self._tree.rename, parent_inode_old, name_old, parent_inode_new, name_new)

    async def unlink(
        self, parent_inode: pyfuse3.InodeT, name: pyfuse3.FileNameT, ctx: pyfuse3.RequestContext
    ) -> None:
        self.requests["unlink"] += 1
        self._require_agent(ctx)
        _call(self._tree.unlink, parent_inode, name)

    async def rmdir(
        self, parent_inode: pyfuse3.InodeT, name: pyfuse3.FileNameT, ctx: pyfuse3.RequestContext
    ) -> None:
        self.requests["rmdir"] += 1
        self._require_agent(ctx)
        _call(self._tree.rmdir, parent_inode, name)

    # -- refused to everyone -----------------------------------------------------------------------

    async def setattr(self, *args: object) -> pyfuse3.EntryAttributes:
        self.requests["setattr"] += 1
        raise pyfuse3.FUSEError(errno.EROFS)

    async def create(self, *args: object) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        self.requests["create"] += 1
        raise pyfuse3.FUSEError(errno.EROFS)

    async def mknod(self, *args: object) -> pyfuse3.EntryAttributes:
        self.requests["mknod"] += 1
        raise pyfuse3.FUSEError(errno.EROFS)

    async def link(self, *args: object) -> pyfuse3.EntryAttributes:
        self.requests["link"] += 1
        raise pyfuse3.FUSEError(errno.EROFS)

    async def write(self, fh: pyfuse3.FileHandleT, off: int, buf: bytes) -> int:
        self.requests["write"] += 1
        raise pyfuse3.FUSEError(errno.EROFS)

    async def setxattr(self, *args: object) -> None:
        self.requests["setxattr"] += 1
        raise pyfuse3.FUSEError(errno.EROFS)

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
        return attrs


def _call(fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
    try:
        return fn(*args, **kwargs)
    except OSError as exc:
        raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
