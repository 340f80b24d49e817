"""The FUSE side: the one mount that serves configMap, secret, downwardAPI and projected volumes
from memory, in kubelet's AtomicWriter layout.

`tree` (the pure in-memory inode tree; a version is never changed once visible) with `nodes` (a
node and a directory's entries), `building` (new nodes, and a version built whole) and `order` (a
directory's entries in inode order, for READDIR), `publish` (a new version switched in by real VFS
operations on the agent's own mount, made by the `vfs_helper` processes; `pins`, with the
`pin_helper` process, keeps the kernel's entries of what is visible), `ops` (the pyfuse3
handlers over the tree; read-only but for the publisher), `answering` (every failure of a handler
an answer: no request ends a server), `naming` (node ids, generations and subtree names no
container can guess, in the one superblock every pod shares) and `session` (pyfuse3's one session
per process); `snapshot` (the tree's state in a memfd, so that a successor takes the live
connection over); `follow` (the follow file system: subPath views that follow a volume's current
version) and `audit` (the audit file system: audited volumes, every open of their files recorded,
by `audit_records`, with what `audit_index` and `callers` say of it), two side file systems served
by processes of their own (`servers`: started, found, stopped; `side_serve`: their serving loop).
The only package that imports pyfuse3. The kernel facts it relies on: docs/fuse.md.
"""
