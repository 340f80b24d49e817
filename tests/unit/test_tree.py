"""The in-memory inode tree: version building, the agent's structural operations, lookup counts.

Every test starts from a tree with one published volume and no kernel lookups held (the `published`
fixture), so each one shows exactly the lookups it takes and the detachments they survive.
"""

from __future__ import annotations

import contextlib
import errno
import stat
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from fusevol.fuse.nodes import Entries, Node
from fusevol.fuse.tree import ROOT_INODE, Tree
from fusevol.model import FileProjection

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

PAYLOAD = {
    "a.conf": FileProjection(b"alpha", 0o644),
    "dir/b.txt": FileProjection(b"bravo!", 0o600, fs_user=1000),
    "dir/sub/c": FileProjection(b"", 0o400),
}
VOL = b"pod-uid_cfg"
V1 = b"..2026_01_01_00_00_00.1"
V2 = b"..2026_01_01_00_00_01.2"


def errno_is(code: int) -> pytest.RaisesExc[OSError]:
    return pytest.raises(OSError, match=rf"^\[Errno {code}\] ")


class Clock:
    """A `clock_ns` that ticks by one on every reading, so each write has its own time."""

    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        self.now += 1
        return self.now


def walk(node: Node) -> Iterator[Node]:
    yield node
    for child in (node.children or {}).values():
        yield from walk(child)


def resolve(tree: Tree, top: Node, path: bytes) -> Node:
    node = top
    for name in path.split(b"/"):
        found = tree.child(node, name)
        assert found is not None, path
        node = found
    return node


def in_table(tree: Tree, node: Node) -> bool:
    try:
        return tree[node.inode] is node
    except OSError:
        return False


@dataclass
class Published:
    """A volume as `fusevol.fuse.publish` leaves it: `..data` -> V1, `a.conf`/`dir` -> `..data/`."""

    volume: Node
    version: Node

    def entry(self, name: bytes) -> Node:
        assert self.volume.children is not None
        return self.volume.children[name]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def tree(clock: Clock) -> Tree:
    return Tree(clock_ns=clock)


@pytest.fixture
def published(tree: Tree) -> Published:
    tree.stage(tree.root, VOL, tree.new_dir(mode=0o777))
    volume = tree.mkdir(ROOT_INODE, VOL)
    tree.stage(volume, V1, tree.build_version(PAYLOAD))
    version = tree.mkdir(volume.inode, V1)
    tree.symlink(volume.inode, b"..data_tmp", V1)
    tree.rename(volume.inode, b"..data_tmp", volume.inode, b"..data")
    tree.symlink(volume.inode, b"a.conf", b"..data/a.conf")
    tree.symlink(volume.inode, b"dir", b"..data/dir")
    for node in walk(tree.root):  # the kernel has dropped every dentry
        tree.forget(node.inode, node.nlookup)
    return Published(volume, version)


# -- building versions -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "mode", "uid", "data"),
    [
        pytest.param(b"a.conf", stat.S_IFREG | 0o644, 0, b"alpha", id="top-level-file"),
        pytest.param(b"dir", stat.S_IFDIR | 0o755, 0, b"", id="implied-directory"),
        pytest.param(b"dir/b.txt", stat.S_IFREG | 0o600, 1000, b"bravo!", id="file-with-fs-user"),
        pytest.param(b"dir/sub", stat.S_IFDIR | 0o755, 0, b"", id="nested-implied-directory"),
        pytest.param(b"dir/sub/c", stat.S_IFREG | 0o400, 0, b"", id="empty-nested-file"),
    ],
)
def test_build_version_layout_modes_and_owners(
    tree: Tree, path: bytes, mode: int, uid: int, data: bytes
) -> None:
    top = tree.build_version(PAYLOAD, gid=2000)
    node = resolve(tree, top, path)
    assert (node.mode, node.uid, node.gid, node.data) == (mode, uid, 2000, data)


def test_a_node_is_96_bytes_its_mode_and_owner_one_value_for_all(tree: Tree) -> None:
    first, second = tree.build_version(PAYLOAD, gid=2000), tree.build_version(PAYLOAD, gid=2000)
    a, b = resolve(tree, first, b"dir/b.txt"), resolve(tree, second, b"dir/b.txt")
    assert (a.mode, a.uid, a.gid) == (b.mode, b.uid, b.gid) == (stat.S_IFREG | 0o600, 1000, 2000)
    assert sys.getsizeof(a) == 96  # pymalloc's 96-byte class, GC header included
    assert a._attributes is b._attributes


def test_build_version_top_holds_only_top_level_names(tree: Tree) -> None:
    top = tree.build_version(PAYLOAD)
    assert top.mode == stat.S_IFDIR | 0o755
    assert sorted(top.children or {}) == [b"a.conf", b"dir"]
    assert sorted(resolve(tree, top, b"dir").children or {}) == [b"b.txt", b"sub"]
    assert top.nlink == 3  # ".", its entry in the parent, "dir/.."


@pytest.mark.parametrize(
    ("gid", "dir_mode", "expected_gid", "expected_dir_mode"),
    [
        pytest.param(None, 0o755, 0, 0o755, id="no-fs-group"),
        pytest.param(3000, 0o755, 3000, 0o755, id="fs-group-on-every-node"),
        pytest.param(None, 0o750, 0, 0o750, id="custom-dir-mode"),
    ],
)
def test_build_version_group_and_directory_mode(
    tree: Tree, gid: int | None, dir_mode: int, expected_gid: int, expected_dir_mode: int
) -> None:
    top = tree.build_version(PAYLOAD, dir_mode=dir_mode, gid=gid)
    assert {n.gid for n in walk(top)} == {expected_gid}
    assert {stat.S_IMODE(n.mode) for n in walk(top) if n.is_dir} == {expected_dir_mode}


def test_built_version_is_invisible_until_attached(tree: Tree) -> None:
    top = tree.build_version(PAYLOAD)
    assert not any(in_table(tree, n) or n.attached for n in walk(top))
    assert tree.statistics().nodes == 1


# -- mkdir of staged directories -------------------------------------------------------------------


def test_mkdir_attaches_the_staged_subtree_whole(tree: Tree, published: Published) -> None:
    version = tree.build_version(PAYLOAD)
    tree.stage(published.volume, V2, version)
    assert tree.statistics().staged == 1

    created = tree.mkdir(published.volume.inode, V2)

    assert created is version
    assert published.entry(V2) is version
    assert all(n.attached and in_table(tree, n) for n in walk(version))
    assert version.nlookup == 1
    assert all(n.nlookup == 0 for n in walk(version) if n is not version)
    assert tree.statistics().staged == 0


def test_mkdir_touches_the_parent(tree: Tree, published: Published, clock: Clock) -> None:
    tree.stage(published.volume, V2, tree.build_version(PAYLOAD))
    tree.mkdir(published.volume.inode, V2)
    assert published.volume.mtime_ns == clock.now


MKDIR_REFUSALS: list[object] = [
    pytest.param(lambda t, p: (p.volume.inode, V2), errno.EROFS, id="not-staged"),
    pytest.param(
        lambda t, p: (t.stage(t.root, V2, t.new_dir(mode=0o755)), (p.volume.inode, V2))[1],
        errno.EROFS,
        id="staged-under-another-parent",
    ),
    pytest.param(
        lambda t, p: (
            t.stage(p.volume, V2, t.new_dir(mode=0o755)),
            t.unstage(p.volume, V2),
            (p.volume.inode, V2),
        )[2],
        errno.EROFS,
        id="unstaged-again",
    ),
    pytest.param(
        lambda t, p: (t.stage(p.volume, V1, t.new_dir(mode=0o755)), (p.volume.inode, V1))[1],
        errno.EEXIST,
        id="name-exists",
    ),
    pytest.param(
        lambda t, p: (p.version.children[b"a.conf"].inode, b"x"), errno.ENOTDIR, id="parent-is-file"
    ),
    pytest.param(lambda t, p: (999, b"x"), errno.ENOENT, id="unknown-parent"),
]


@pytest.mark.parametrize(("prepare", "code"), MKDIR_REFUSALS)
def test_mkdir_refused(
    tree: Tree,
    published: Published,
    prepare: Callable[[Tree, Published], tuple[int, bytes]],
    code: int,
) -> None:
    parent, name = prepare(tree, published)
    nodes = tree.statistics().nodes
    with errno_is(code):
        tree.mkdir(parent, name)
    assert tree.statistics().nodes == nodes


# -- symlink, rename, unlink, rmdir ----------------------------------------------------------------


def test_symlink_creates_an_attached_link(tree: Tree, published: Published, clock: Clock) -> None:
    link = tree.symlink(published.volume.inode, b"new", b"..data/new")
    assert published.entry(b"new") is link
    assert (link.mode, link.target, link.size) == (stat.S_IFLNK | 0o777, b"..data/new", 10)
    assert (link.attached, link.nlookup, link.nlink) == (True, 1, 1)
    assert tree[link.inode] is link
    assert published.volume.mtime_ns == clock.now


@pytest.mark.parametrize(
    ("dir_mode", "expected_gid"),
    [
        pytest.param(0o775, 0, id="plain-directory"),
        pytest.param(stat.S_ISGID | 0o775, 7, id="setgid-directory-passes-its-group"),
    ],
)
def test_symlink_group(tree: Tree, dir_mode: int, expected_gid: int) -> None:
    tree.stage(tree.root, VOL, tree.new_dir(mode=dir_mode, gid=7))
    volume = tree.mkdir(ROOT_INODE, VOL)
    assert tree.symlink(volume.inode, b"l", b"t").gid == expected_gid


def test_symlink_onto_existing_name_is_eexist(tree: Tree, published: Published) -> None:
    before = published.entry(b"a.conf")
    with errno_is(errno.EEXIST):
        tree.symlink(published.volume.inode, b"a.conf", b"elsewhere")
    assert published.entry(b"a.conf") is before


@pytest.mark.parametrize(
    ("held", "still_known"),
    [
        pytest.param(0, False, id="unknown-to-kernel-dropped-at-once"),
        pytest.param(1, True, id="held-by-kernel-kept-until-forgotten"),
    ],
)
def test_rename_onto_data_detaches_the_old_link(
    tree: Tree, published: Published, held: int, still_known: bool
) -> None:
    old = published.entry(b"..data")
    for _ in range(held):
        tree.lookup(published.volume.inode, b"..data")
    tree.stage(published.volume, V2, tree.build_version(PAYLOAD))
    tree.mkdir(published.volume.inode, V2)
    new = tree.symlink(published.volume.inode, b"..data_tmp", V2)

    tree.rename(published.volume.inode, b"..data_tmp", published.volume.inode, b"..data")

    assert published.entry(b"..data") is new
    assert b"..data_tmp" not in (published.volume.children or {})
    assert new.parent is published.volume
    assert not old.attached
    assert in_table(tree, old) is still_known
    assert tree.statistics().detached_known == int(still_known)
    tree.forget(old.inode, held)
    assert not in_table(tree, old)


def test_rename_touches_both_parents(tree: Tree, published: Published, clock: Clock) -> None:
    tree.stage(tree.root, b"other", tree.new_dir(mode=0o755))
    other = tree.mkdir(ROOT_INODE, b"other")
    tree.rename(published.volume.inode, b"a.conf", other.inode, b"moved")
    assert published.volume.mtime_ns == other.mtime_ns == clock.now
    assert b"a.conf" not in (published.volume.children or {})
    assert resolve(tree, other, b"moved").parent is other


def test_rename_onto_an_empty_directory_replaces_it(tree: Tree, published: Published) -> None:
    tree.stage(published.volume, b"empty", tree.new_dir(mode=0o755))
    empty = tree.mkdir(published.volume.inode, b"empty")
    tree.forget(empty.inode, 1)
    tree.rename(published.volume.inode, V1, published.volume.inode, b"empty")
    assert published.entry(b"empty") is published.version
    assert not in_table(tree, empty)


@pytest.mark.parametrize(
    ("old", "new", "code"),
    [
        pytest.param(b"missing", b"x", errno.ENOENT, id="missing-source"),
        pytest.param(b"a.conf", V1, errno.ENOTEMPTY, id="onto-non-empty-directory"),
    ],
)
def test_rename_refused_changes_nothing(
    tree: Tree, published: Published, old: bytes, new: bytes, code: int
) -> None:
    before = dict(published.volume.children or {})
    with errno_is(code):
        tree.rename(published.volume.inode, old, published.volume.inode, new)
    assert dict(published.volume.children or {}) == before


@pytest.mark.parametrize(
    ("remove", "name"),
    [
        pytest.param(Tree.unlink, b"..data", id="unlink-symlink"),
        pytest.param(Tree.rmdir, V1, id="rmdir-directory"),
    ],
)
def test_unlink_and_rmdir_remove_the_entry(
    tree: Tree,
    published: Published,
    clock: Clock,
    remove: Callable[[Tree, int, bytes], None],
    name: bytes,
) -> None:
    node = published.entry(name)
    remove(tree, published.volume.inode, name)
    assert name not in (published.volume.children or {})
    assert not node.attached
    assert not in_table(tree, node)
    assert published.volume.mtime_ns == clock.now


@pytest.mark.parametrize(
    ("remove", "name", "code"),
    [
        pytest.param(Tree.unlink, V1, errno.EISDIR, id="unlink-directory"),
        pytest.param(Tree.rmdir, b"..data", errno.ENOTDIR, id="rmdir-symlink"),
        pytest.param(Tree.unlink, b"missing", errno.ENOENT, id="unlink-missing"),
        pytest.param(Tree.rmdir, b"missing", errno.ENOENT, id="rmdir-missing"),
    ],
)
def test_unlink_and_rmdir_refused_change_nothing(
    tree: Tree,
    published: Published,
    remove: Callable[[Tree, int, bytes], None],
    name: bytes,
    code: int,
) -> None:
    before = dict(published.volume.children or {})
    with errno_is(code):
        remove(tree, published.volume.inode, name)
    assert dict(published.volume.children or {}) == before


def test_rmdir_of_a_non_empty_directory_detaches_the_subtree(
    tree: Tree, published: Published
) -> None:
    held = tree.lookup(resolve(tree, published.version, b"dir").inode, b"b.txt")
    subtree = list(walk(published.version))
    nodes = tree.statistics().nodes

    tree.rmdir(published.volume.inode, V1)

    assert not any(n.attached for n in subtree)
    assert [n for n in subtree if in_table(tree, n)] == [held]
    assert tree.statistics().nodes == nodes - len(subtree) + 1
    assert tree.statistics().detached_known == 1
    tree.forget(held.inode, 1)
    assert not in_table(tree, held)
    assert tree.statistics().detached_known == 0


def test_lookup_in_a_held_detached_directory_returns_a_known_inode(
    tree: Tree, published: Published
) -> None:
    sub = tree.lookup(resolve(tree, published.version, b"dir").inode, b"sub")
    tree.rmdir(published.volume.inode, V1)
    found = None
    with contextlib.suppress(FileNotFoundError):  # answering ENOENT would be fine too
        found = tree.lookup(sub.inode, b"c")
    assert found is None or in_table(tree, found)


# -- lookups and forget ----------------------------------------------------------------------------


def test_lookup_counts_and_forget_releases(tree: Tree, published: Published) -> None:
    node = tree.lookup(published.volume.inode, b"a.conf")
    assert tree.lookup(published.volume.inode, b"a.conf") is node
    assert node.nlookup == 2
    tree.forget(node.inode, 1)
    assert node.nlookup == 1
    tree.forget(node.inode, 1)
    assert node.nlookup == 0
    assert in_table(tree, node)  # still attached: forgetting never drops a reachable node


def test_remember_counts_a_lookup(tree: Tree, published: Published) -> None:
    node = published.entry(b"a.conf")
    tree.remember(node)
    tree.unlink(published.volume.inode, b"a.conf")
    assert in_table(tree, node)
    tree.forget(node.inode, 1)
    assert not in_table(tree, node)


def test_detached_node_lives_while_looked_up(tree: Tree, published: Published) -> None:
    node = tree.lookup(published.volume.inode, b"a.conf")
    tree.lookup(published.volume.inode, b"a.conf")
    tree.unlink(published.volume.inode, b"a.conf")
    tree.forget(node.inode, 1)
    assert tree[node.inode] is node
    tree.forget(node.inode, 1)
    with errno_is(errno.ENOENT):
        tree[node.inode]


@pytest.mark.parametrize(
    "inode",
    [
        pytest.param(ROOT_INODE, id="root-is-never-forgotten"),
        pytest.param(999, id="unknown-inode-ignored"),
    ],
)
def test_forget_noops(tree: Tree, inode: int) -> None:
    tree.lookup(ROOT_INODE, b".")
    tree.forget(inode, 5)
    assert tree.root.nlookup == 1
    assert tree[ROOT_INODE] is tree.root
    assert tree.statistics().nodes == 1


def test_forget_more_than_held_clamps_at_zero(tree: Tree, published: Published) -> None:
    node = tree.lookup(published.volume.inode, b"a.conf")
    tree.forget(node.inode, 10)
    assert node.nlookup == 0


@pytest.mark.parametrize(
    ("parent", "name", "expected"),
    [
        pytest.param("volume", b".", "volume", id="dot-is-the-directory"),
        pytest.param("volume", b"..", "root", id="dotdot-is-the-parent"),
        pytest.param("root", b"..", "root", id="dotdot-of-root-is-root"),
        pytest.param("root", VOL, "volume", id="plain-name"),
    ],
)
def test_lookup_dot_entries(
    tree: Tree, published: Published, parent: str, name: bytes, expected: str
) -> None:
    nodes = {"root": tree.root, "volume": published.volume}
    before = nodes[expected].nlookup
    assert tree.lookup(nodes[parent].inode, name) is nodes[expected]
    assert nodes[expected].nlookup == before + 1


@pytest.mark.parametrize(
    ("where", "name", "code"),
    [
        pytest.param(lambda p: p.volume.inode, b"missing", errno.ENOENT, id="missing-name"),
        pytest.param(lambda p: p.entry(b"..data").inode, b"x", errno.ENOTDIR, id="not-a-dir"),
        pytest.param(lambda p: 999, b"x", errno.ENOENT, id="unknown-inode"),
    ],
)
def test_lookup_errors(
    tree: Tree, published: Published, where: Callable[[Published], int], name: bytes, code: int
) -> None:
    with errno_is(code):
        tree.lookup(where(published), name)


def test_inode_numbers_are_never_reused(tree: Tree, published: Published) -> None:
    seen = {n.inode for n in walk(tree.root)}
    tree.rmdir(ROOT_INODE, VOL)
    assert tree.statistics().nodes == 1
    fresh = tree.build_version(PAYLOAD)
    assert min(n.inode for n in walk(fresh)) > max(seen)


# -- readdir order and statistics ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("after_index", "expected"),
    [
        pytest.param(None, [b"zz", b"aa", b"mm"], id="from-start-in-inode-order"),
        pytest.param(0, [b"aa", b"mm"], id="after-first"),
        pytest.param(2, [], id="after-last"),
    ],
)
def test_entries_ordered_by_inode_from_offset(
    tree: Tree, after_index: int | None, expected: list[bytes]
) -> None:
    tree.stage(tree.root, VOL, tree.new_dir(mode=0o755))
    volume = tree.mkdir(ROOT_INODE, VOL)
    links = [tree.symlink(volume.inode, name, b"t") for name in (b"zz", b"aa", b"mm")]
    after = 0 if after_index is None else links[after_index].inode
    assert [name for name, _ in tree.entries(volume, after)] == expected


def test_statistics_counts_nodes_detached_and_staged(tree: Tree, published: Published) -> None:
    # root, volume, version (top, a.conf, dir, b.txt, sub, c), ..data, a.conf, dir links
    assert tree.statistics().nodes == 11
    tree.lookup(published.volume.inode, b"..data")
    tree.unlink(published.volume.inode, b"..data")
    tree.stage(published.volume, V2, tree.new_dir(mode=0o755))
    stats = tree.statistics()
    assert (stats.nodes, stats.detached_known, stats.staged) == (11, 1, 1)


# -- a directory's entries -------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 3, 8, 9, 40], ids=lambda n: f"{n}-entries")
def test_entries_behave_as_the_dict_they_stand_for(tree: Tree, count: int) -> None:
    entries, model = Entries(), {}
    nodes = [tree.new_file(b"", mode=0o644) for _ in range(count + 1)]
    for i in range(count):
        entries[b"n%d" % i] = model[b"n%d" % i] = nodes[i]
    entries[b"n0"] = model[b"n0"] = nodes[count]  # replaced where it stands
    assert list(entries.items()) == list(model.items())
    assert (list(entries), list(entries.values()), len(entries)) == (
        list(model),
        list(model.values()),
        len(model),
    )
    assert entries.get(b"n0") is nodes[count]
    assert entries.get(b"absent") is None
    assert b"n0" in entries
    assert nodes[1] not in entries  # a node is never taken for a name
    del entries[b"n0"], model[b"n0"]
    assert dict(entries) == model
    assert b"n0" not in entries
    with pytest.raises(KeyError):
        del entries[b"n0"]
    with pytest.raises(KeyError):
        entries[b"n0"]


def test_a_small_directory_costs_a_third_of_a_dict(tree: Tree) -> None:
    entries = Entries()
    for name in (b"..data", b"..2026_01_01_00_00_00.1", b"a.conf"):
        entries[name] = tree.new_file(b"", mode=0o644)
    held = sys.getsizeof(entries) + sys.getsizeof(entries._items)
    assert held <= sys.getsizeof(dict(entries)) * 2 // 3
