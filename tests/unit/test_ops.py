"""The FUSE handlers, awaited directly over a real Tree: no kernel, no mount.

pyfuse3.RequestContext can be constructed from Python, but its `pid` is always 0 and read-only, so
it stands for "some other process" here and a small dataclass with the same attributes stands for a
request made by one of the agent's own threads.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import pyfuse3
import pytest

from fusevol.fuse import naming
from fusevol.fuse.naming import SEQUENTIAL_LIMIT, ConnectionKey, numbered
from fusevol.fuse.ops import Operations
from fusevol.fuse.tree import ROOT_INODE, Tree
from fusevol.model import FileProjection

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from fusevol.fuse.nodes import Node

    Operation = Callable[["Mount", pyfuse3.RequestContext], Awaitable[object]]

AGENT_PID = 4242
ENTRY_TIMEOUT_S = 300.0
ATTR_TIMEOUT_S = 60.0
VOL = b"pod-uid_cfg"
V1 = b"..2026_01_01_00_00_00.1"
PAYLOAD = {
    "app.conf": FileProjection(b"listen 80\n", 0o640, fs_user=1000),
    "sub/x": FileProjection(b"x", 0o644),
}


@dataclass(frozen=True)
class FakeContext:
    pid: int
    uid: int = 0
    gid: int = 0
    umask: int = 0o022


AGENT = cast("pyfuse3.RequestContext", FakeContext(AGENT_PID))
OTHER = pyfuse3.RequestContext()  # pid 0: not a thread of the agent


def ino(inode: int) -> pyfuse3.InodeT:
    return pyfuse3.InodeT(inode)


def fname(name: bytes) -> pyfuse3.FileNameT:
    return pyfuse3.FileNameT(name)


def fh(inode: int) -> pyfuse3.FileHandleT:
    return pyfuse3.FileHandleT(inode)


def walk(node: Node) -> list[Node]:
    return [node, *(n for c in (node.children or {}).values() for n in walk(c))]


@dataclass
class Mount:
    tree: Tree
    ops: Operations
    volume: Node
    version: Node

    def entry(self, name: bytes) -> Node:
        assert self.volume.children is not None
        return self.volume.children[name]

    def file(self) -> Node:
        assert self.version.children is not None
        return self.version.children[b"app.conf"]


@pytest.fixture
def mount() -> Mount:
    tree = Tree(clock_ns=lambda: 1_234_567_890)
    tree.stage(tree.root, VOL, tree.new_dir(mode=0o777))
    volume = tree.mkdir(ROOT_INODE, VOL)
    tree.stage(volume, V1, tree.build_version(PAYLOAD, gid=2000))
    version = tree.mkdir(volume.inode, V1)
    tree.symlink(volume.inode, b"..data", V1)
    tree.symlink(volume.inode, b"app.conf", b"..data/app.conf")
    for node in walk(tree.root):
        tree.forget(node.inode, node.nlookup)
    ops = Operations(
        tree,
        is_agent=lambda pid, uid, gid: pid == AGENT_PID,
        entry_timeout_s=ENTRY_TIMEOUT_S,
        attr_timeout_s=ATTR_TIMEOUT_S,
    )
    return Mount(tree, ops, volume, version)


@pytest.fixture
def no_open(mount: Mount, monkeypatch: pytest.MonkeyPatch) -> Mount:
    """`mount` after an INIT that negotiated the fast read path (patched pyfuse3, recent kernel)."""
    negotiated = frozenset({"export_support", "cache_symlinks", "no_open_support"})
    monkeypatch.setattr(pyfuse3, "negotiated_capabilities", lambda: negotiated, raising=False)
    mount.ops.init()
    return mount


async def fuse_errno(call: Awaitable[object]) -> int:
    with pytest.raises(pyfuse3.FUSEError) as info:
        await call
    return info.value.errno


# -- reading ---------------------------------------------------------------------------------------


ATTRIBUTES = (
    "st_ino",
    "st_mode",
    "st_uid",
    "st_gid",
    "st_size",
    "st_nlink",
    "st_mtime_ns",
    "entry_timeout",
    "attr_timeout",
)


def expected_attributes(node: Node) -> dict[str, object]:
    return {
        "st_ino": node.inode,
        "st_mode": node.mode,
        "st_uid": node.uid,
        "st_gid": node.gid,
        "st_size": node.size,
        "st_nlink": node.nlink,
        "st_mtime_ns": 1_234_567_890,
        "entry_timeout": ENTRY_TIMEOUT_S,
        "attr_timeout": ATTR_TIMEOUT_S,
    }


def attributes(attrs: pyfuse3.EntryAttributes) -> dict[str, object]:
    return {key: getattr(attrs, key) for key in ATTRIBUTES}


LOOKUPS = [
    pytest.param(lambda m: m.version, b"app.conf", id="file-with-owner-and-group"),
    pytest.param(lambda m: m.version, b"sub", id="nested-directory"),
    pytest.param(lambda m: m.volume, b"..data", id="symlink"),
    pytest.param(lambda m: m.volume, b".", id="dot"),
    pytest.param(lambda m: m.tree.root, VOL, id="volume-root"),
]


@pytest.mark.parametrize(("parent", "name"), LOOKUPS)
async def test_lookup_returns_the_node_attributes_and_counts(
    mount: Mount, parent: Callable[[Mount], Node], name: bytes
) -> None:
    directory = parent(mount)
    node = mount.tree.lookup(directory.inode, name)  # what the handler must find
    mount.tree.forget(node.inode, 1)

    attrs = await mount.ops.lookup(ino(directory.inode), fname(name), OTHER)

    assert attributes(attrs) == expected_attributes(node)
    assert node.nlookup == 1


async def test_file_attributes_are_the_payload_file(mount: Mount) -> None:
    attrs = await mount.ops.lookup(ino(mount.version.inode), fname(b"app.conf"), OTHER)
    assert (attrs.st_mode, attrs.st_uid, attrs.st_gid) == (stat.S_IFREG | 0o640, 1000, 2000)
    assert (attrs.st_size, attrs.st_blocks, attrs.st_nlink) == (10, 1, 1)


async def test_getattr_does_not_count_a_lookup(mount: Mount) -> None:
    node = mount.file()
    attrs = await mount.ops.getattr(ino(node.inode), OTHER)
    assert attributes(attrs) == expected_attributes(node)
    assert node.nlookup == 0


async def test_forget_drops_a_detached_node(mount: Mount) -> None:
    node = await mount.ops.lookup(ino(mount.volume.inode), fname(b"app.conf"), OTHER)
    await mount.ops.lookup(ino(mount.volume.inode), fname(b"app.conf"), OTHER)
    await mount.ops.unlink(ino(mount.volume.inode), fname(b"app.conf"), AGENT)
    await mount.ops.forget([(node.st_ino, 1)])
    assert (await mount.ops.getattr(node.st_ino, OTHER)).st_ino == node.st_ino
    await mount.ops.forget([(node.st_ino, 1)])
    assert await fuse_errno(mount.ops.getattr(node.st_ino, OTHER)) == errno.ENOENT


async def test_readlink_returns_the_target(mount: Mount) -> None:
    assert await mount.ops.readlink(ino(mount.entry(b"app.conf").inode), OTHER) == (
        b"..data/app.conf"
    )


WRITE_FLAGS = [
    pytest.param(os.O_WRONLY, id="O_WRONLY"),
    pytest.param(os.O_RDWR, id="O_RDWR"),
    pytest.param(os.O_RDONLY | os.O_TRUNC, id="O_TRUNC"),
    pytest.param(os.O_RDONLY | os.O_APPEND, id="O_APPEND"),
    pytest.param(os.O_WRONLY | os.O_CREAT, id="O_CREAT"),
]


@pytest.mark.parametrize("flags", WRITE_FLAGS)
async def test_open_for_writing_is_erofs(mount: Mount, flags: int) -> None:
    assert await fuse_errno(mount.ops.open(ino(mount.file().inode), flags, OTHER)) == errno.EROFS


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param(os.O_RDONLY, id="O_RDONLY"),
        pytest.param(os.O_RDONLY | os.O_NOATIME | os.O_CLOEXEC, id="O_RDONLY-with-harmless-flags"),
    ],
)
async def test_open_read_only_keeps_the_page_cache(mount: Mount, flags: int) -> None:
    info = await mount.ops.open(ino(mount.file().inode), flags, OTHER)
    assert (info.fh, info.keep_cache) == (mount.file().inode, True)


async def test_init_records_the_negotiated_capabilities(no_open: Mount) -> None:
    assert no_open.ops.capabilities == {"export_support", "cache_symlinks", "no_open_support"}


async def test_stock_pyfuse3_negotiates_nothing_known(
    mount: Mount, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(pyfuse3, "negotiated_capabilities", raising=False)
    mount.ops.init()
    assert mount.ops.capabilities == frozenset()
    assert (await mount.ops.open(ino(mount.file().inode), os.O_RDONLY, OTHER)).fh == (
        mount.file().inode
    )


async def test_with_no_open_a_read_only_open_hands_opening_to_the_kernel(no_open: Mount) -> None:
    node = no_open.file()
    assert await fuse_errno(no_open.ops.open(ino(node.inode), os.O_RDONLY, OTHER)) == errno.ENOSYS
    assert await no_open.ops.read(fh(node.inode), 0, 6) == b"listen"  # pyfuse3 passes the inode


@pytest.mark.parametrize("flags", WRITE_FLAGS)
async def test_with_no_open_an_open_for_writing_is_still_erofs(no_open: Mount, flags: int) -> None:
    node = no_open.file()
    assert await fuse_errno(no_open.ops.open(ino(node.inode), flags, OTHER)) == errno.EROFS


async def test_with_no_open_a_missing_inode_is_still_enoent(no_open: Mount) -> None:
    assert await fuse_errno(no_open.ops.open(ino(MISSING), os.O_RDONLY, OTHER)) == errno.ENOENT


@pytest.mark.parametrize(
    ("off", "size", "expected"),
    [
        pytest.param(0, 4096, b"listen 80\n", id="whole-file"),
        pytest.param(0, 6, b"listen", id="prefix"),
        pytest.param(7, 2, b"80", id="middle"),
        pytest.param(7, 100, b"80\n", id="past-the-end"),
        pytest.param(10, 10, b"", id="at-eof"),
        pytest.param(50, 10, b"", id="beyond-eof"),
    ],
)
async def test_read_slices(mount: Mount, off: int, size: int, expected: bytes) -> None:
    assert await mount.ops.read(fh(mount.file().inode), off, size) == expected


async def test_opendir(mount: Mount) -> None:
    assert await mount.ops.opendir(ino(mount.volume.inode), OTHER) == mount.volume.inode
    assert await fuse_errno(mount.ops.opendir(ino(mount.file().inode), OTHER)) == errno.ENOTDIR


async def test_statfs_counts_the_inode_table(mount: Mount) -> None:
    stats = await mount.ops.statfs(OTHER)
    assert (stats.f_files, stats.f_namemax) == (mount.tree.statistics().nodes, 255)


# -- readdir ---------------------------------------------------------------------------------------


@dataclass
class ReaddirReplies:
    """Stands in for `pyfuse3.readdir_reply`: accepts `room` entries, then reports a full buffer."""

    room: int
    entries: list[tuple[bytes, int, int]]
    """(name, st_ino, next_id) of every accepted entry."""

    def __call__(
        self, token: object, name: bytes, attr: pyfuse3.EntryAttributes, next_id: int
    ) -> bool:
        if len(self.entries) == self.room:
            return False
        self.entries.append((name, attr.st_ino, next_id))
        return True


@pytest.fixture
def replies(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], ReaddirReplies]:
    def install(room: int) -> ReaddirReplies:
        fake = ReaddirReplies(room, [])
        monkeypatch.setattr(pyfuse3, "readdir_reply", fake)
        return fake

    return install


TOKEN = cast("pyfuse3.ReaddirToken", object())
VOLUME_ENTRIES = [V1, b"..data", b"app.conf"]  # creation order is inode order


@pytest.mark.parametrize(
    ("room", "start_index", "expected"),
    [
        pytest.param(10, None, VOLUME_ENTRIES, id="all-in-inode-order"),
        pytest.param(2, None, VOLUME_ENTRIES[:2], id="stops-when-reply-buffer-full"),
        pytest.param(10, 0, VOLUME_ENTRIES[1:], id="resumes-after-offset"),
        pytest.param(0, None, [], id="no-room"),
    ],
)
async def test_readdir(
    mount: Mount,
    replies: Callable[[int], ReaddirReplies],
    room: int,
    start_index: int | None,
    expected: list[bytes],
) -> None:
    fake = replies(room)
    start = 0 if start_index is None else mount.entry(VOLUME_ENTRIES[start_index]).inode

    await mount.ops.readdir(fh(mount.volume.inode), start, TOKEN)

    inodes = [mount.entry(name).inode for name in expected]
    assert fake.entries == [(n, i, i) for n, i in zip(expected, inodes, strict=True)]
    counts = {name: mount.entry(name).nlookup for name in VOLUME_ENTRIES}
    assert counts == {name: int(name in expected) for name in VOLUME_ENTRIES}


# -- the agent's publishing operations -------------------------------------------------------------


def stage_v2(m: Mount) -> None:
    m.tree.stage(m.volume, b"..v2", m.tree.new_dir(mode=0o755))


def children(m: Mount) -> set[bytes]:
    return set(m.volume.children or {})


PUBLISHING = [
    pytest.param(
        lambda m, ctx: m.ops.mkdir(ino(m.volume.inode), fname(b"..v2"), 0o755, ctx),
        lambda m: children(m) == {V1, b"..v2", b"..data", b"app.conf"},
        id="mkdir",
    ),
    pytest.param(
        lambda m, ctx: m.ops.symlink(ino(m.volume.inode), fname(b"new"), fname(b"..data/n"), ctx),
        lambda m: children(m) == {V1, b"..data", b"app.conf", b"new"},
        id="symlink",
    ),
    pytest.param(
        lambda m, ctx: m.ops.rename(
            ino(m.volume.inode), fname(b"app.conf"), ino(m.volume.inode), fname(b"b"), 0, ctx
        ),
        lambda m: children(m) == {V1, b"..data", b"b"},
        id="rename",
    ),
    pytest.param(
        lambda m, ctx: m.ops.unlink(ino(m.volume.inode), fname(b"app.conf"), ctx),
        lambda m: children(m) == {V1, b"..data"},
        id="unlink",
    ),
    pytest.param(
        lambda m, ctx: m.ops.rmdir(ino(m.volume.inode), fname(V1), ctx),
        lambda m: children(m) == {b"..data", b"app.conf"},
        id="rmdir",
    ),
]


@pytest.mark.parametrize(("operation", "applied"), PUBLISHING)
async def test_publishing_operation_from_the_agent_is_applied(
    mount: Mount, operation: Operation, applied: Callable[[Mount], bool]
) -> None:
    stage_v2(mount)
    await operation(mount, AGENT)
    assert applied(mount)


@pytest.mark.parametrize(
    "ctx",
    [
        pytest.param(OTHER, id="real-request-context-pid-0"),
        pytest.param(cast("pyfuse3.RequestContext", FakeContext(AGENT_PID + 1)), id="other-pid"),
    ],
)
@pytest.mark.parametrize(("operation", "applied"), PUBLISHING)
async def test_publishing_operation_from_another_process_is_erofs(
    mount: Mount,
    operation: Operation,
    applied: Callable[[Mount], bool],
    ctx: pyfuse3.RequestContext,
) -> None:
    stage_v2(mount)
    assert await fuse_errno(operation(mount, ctx)) == errno.EROFS
    assert children(mount) == {V1, b"..data", b"app.conf"}
    assert mount.tree.statistics().staged == 1


async def test_mkdir_returns_the_staged_directory_and_counts_it(mount: Mount) -> None:
    stage_v2(mount)
    attrs = await mount.ops.mkdir(ino(mount.volume.inode), fname(b"..v2"), 0o700, AGENT)
    node = mount.entry(b"..v2")
    assert (attrs.st_ino, attrs.st_mode) == (node.inode, stat.S_IFDIR | 0o755)
    assert node.nlookup == 1


@pytest.mark.parametrize(
    ("operation", "code"),
    [
        pytest.param(
            lambda m, ctx: m.ops.mkdir(ino(m.volume.inode), fname(b"unstaged"), 0o755, ctx),
            errno.EROFS,
            id="mkdir-unstaged",
        ),
        pytest.param(
            lambda m, ctx: m.ops.symlink(ino(m.volume.inode), fname(b"..data"), fname(b"x"), ctx),
            errno.EEXIST,
            id="symlink-existing",
        ),
        pytest.param(
            lambda m, ctx: m.ops.rename(
                ino(m.volume.inode),
                fname(b"app.conf"),
                ino(m.volume.inode),
                fname(b"b"),
                pyfuse3.RENAME_NOREPLACE,
                ctx,
            ),
            errno.EINVAL,
            id="rename-with-flags",
        ),
        pytest.param(
            lambda m, ctx: m.ops.unlink(ino(m.volume.inode), fname(V1), ctx),
            errno.EISDIR,
            id="unlink-directory",
        ),
        pytest.param(
            lambda m, ctx: m.ops.rmdir(ino(m.volume.inode), fname(b"..data"), ctx),
            errno.ENOTDIR,
            id="rmdir-symlink",
        ),
        pytest.param(
            lambda m, ctx: m.ops.rmdir(ino(999), fname(b"x"), ctx), errno.ENOENT, id="no-parent"
        ),
    ],
)
async def test_tree_errors_reach_the_agent_as_fuse_errors(
    mount: Mount, operation: Operation, code: int
) -> None:
    assert await fuse_errno(operation(mount, AGENT)) == code
    assert children(mount) == {V1, b"..data", b"app.conf"}


# -- refused to everyone ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "operation",
    [
        pytest.param(
            lambda m, ctx: m.ops.setattr(
                ino(m.file().inode), pyfuse3.EntryAttributes(), pyfuse3.SetattrFields(), None, ctx
            ),
            id="setattr",
        ),
        pytest.param(
            lambda m, ctx: m.ops.create(ino(m.volume.inode), fname(b"n"), 0o644, os.O_WRONLY, ctx),
            id="create",
        ),
        pytest.param(lambda m, ctx: m.ops.write(fh(m.file().inode), 0, b"x"), id="write"),
        pytest.param(
            lambda m, ctx: m.ops.mknod(ino(m.volume.inode), fname(b"n"), 0o644, 0, ctx),
            id="mknod",
        ),
        pytest.param(
            lambda m, ctx: m.ops.link(ino(m.file().inode), ino(m.volume.inode), fname(b"n"), ctx),
            id="link",
        ),
        pytest.param(
            lambda m, ctx: m.ops.setxattr(ino(m.file().inode), b"user.a", b"v", ctx),
            id="setxattr",
        ),
        pytest.param(
            lambda m, ctx: m.ops.removexattr(ino(m.file().inode), b"user.a", ctx),
            id="removexattr",
        ),
    ],
)
async def test_writes_are_erofs_even_for_the_agent(mount: Mount, operation: Operation) -> None:
    nodes = mount.tree.statistics().nodes
    assert await fuse_errno(operation(mount, AGENT)) == errno.EROFS
    assert mount.tree.statistics().nodes == nodes
    assert mount.file().data == b"listen 80\n"


# -- missing inodes --------------------------------------------------------------------------------

MISSING = 999


@pytest.mark.parametrize(
    "operation",
    [
        pytest.param(lambda m: m.ops.lookup(ino(MISSING), fname(b"x"), OTHER), id="lookup-parent"),
        pytest.param(
            lambda m: m.ops.lookup(ino(m.volume.inode), fname(b"missing"), OTHER),
            id="lookup-name",
        ),
        pytest.param(lambda m: m.ops.getattr(ino(MISSING), OTHER), id="getattr"),
        pytest.param(lambda m: m.ops.readlink(ino(MISSING), OTHER), id="readlink"),
        pytest.param(lambda m: m.ops.open(ino(MISSING), os.O_RDONLY, OTHER), id="open"),
        pytest.param(lambda m: m.ops.read(fh(MISSING), 0, 10), id="read"),
        pytest.param(lambda m: m.ops.opendir(ino(MISSING), OTHER), id="opendir"),
        pytest.param(lambda m: m.ops.readdir(fh(MISSING), 0, TOKEN), id="readdir"),
    ],
)
async def test_missing_inode_is_enoent(
    mount: Mount, operation: Callable[[Mount], Awaitable[object]]
) -> None:
    assert await fuse_errno(operation(mount)) == errno.ENOENT


# -- what no request may do ------------------------------------------------------------------------


class _Broken(Exception):
    pass


async def test_an_unexpected_exception_answers_eio_logs_once_and_counts(
    mount: Mount, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object) -> object:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(mount.tree, "lookup", broken)
    for _ in range(3):
        assert await fuse_errno(mount.ops.lookup(ino(mount.volume.inode), fname(b"x"), OTHER)) == (
            errno.EIO
        )
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1
    assert "lookup" in errors[0].getMessage()
    assert "RecursionError" in errors[0].getMessage()
    assert mount.ops.failures.counts["lookup"] == 3
    caplog.clear()  # expected: the autouse check fails on anything left at WARNING or above


async def test_a_failing_forget_raises_nothing(
    mount: Mount, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object) -> None:
        raise _Broken("no")

    monkeypatch.setattr(mount.tree, "forget", broken)
    await mount.ops.forget([(ino(mount.file().inode), 1)])  # pyfuse3 would end main() on a raise
    assert mount.ops.failures.counts["forget"] == 1
    caplog.clear()


def test_no_export_support_is_asked_for() -> None:
    assert Operations.supports_dot_lookup is False  # what makes pyfuse3 ask for it


async def test_the_root_lists_only_to_the_agents_mount_namespace(mount: Mount) -> None:
    assert await fuse_errno(mount.ops.opendir(ino(ROOT_INODE), OTHER)) == errno.EACCES
    ours = cast("pyfuse3.RequestContext", FakeContext(os.getpid()))
    assert await mount.ops.opendir(ino(ROOT_INODE), ours) == ROOT_INODE
    assert await mount.ops.opendir(ino(mount.volume.inode), OTHER) == mount.volume.inode


async def test_generations_are_keyed_for_random_node_ids_only(mount: Mount, tmp_path: Path) -> None:
    mount.ops.key = key = ConnectionKey.for_connection(tmp_path / "key", fresh=True)
    entry = await mount.ops.lookup(ino(mount.volume.inode), fname(b"app.conf"), AGENT)
    assert entry.generation == key.generation(entry.st_ino) != 0
    assert key.generation(SEQUENTIAL_LIMIT - 1) == 0  # as the kernel holds an older agent's
    random_ids = [numbered(n) for n in range(2, 66)]
    generations = {key.generation(i) for i in random_ids}
    assert len(generations) > 60
    assert 0 not in generations
    assert all(i >= SEQUENTIAL_LIMIT for i in random_ids)
    again = ConnectionKey.for_connection(tmp_path / "key", fresh=False)
    assert again == key  # a successor that takes the connection over answers the same
    assert stat.S_IMODE((tmp_path / "key").stat().st_mode) == 0o600


def test_node_ids_keep_their_number_above_random_bits_past_a_pool_refill() -> None:
    ids = [numbered(n) for n in range(2, 2 + 3 * naming._POOLED)]  # the pool refilled twice
    assert [i >> naming._RANDOM_BITS for i in ids] == list(range(2, 2 + 3 * naming._POOLED))
    low = [i & ((1 << naming._RANDOM_BITS) - 1) for i in ids]
    assert len(set(low)) > len(low) - 3  # 768 draws of 31 bits: a repeat is ~1 in 7,000
    assert max(low) > 1 << (naming._RANDOM_BITS - 2)  # the high bits are drawn too
