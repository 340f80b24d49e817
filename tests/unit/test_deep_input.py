"""Tenant input as deep, as long or as wide as it may be: the tree, its journal and the payload
rules take it in time and stack in proportion to its size, and refuse what kubelet refuses,
naming the field.

A configMap item path of 1500 levels (3001 characters) is what kubelet writes; Python's recursion
stops at 1000 frames, so anything that walks such a tree by recursion fails in the middle of it.
The tree here is built deeper still (100,000 levels, by hand: no path rule allows it) to show that
nothing recurses at all.
"""

from __future__ import annotations

import os
import stat

import pytest

from fusevol.base.errors import InvalidPayload, VolumeSetupError
from fusevol.fuse import order, snapshot
from fusevol.fuse.nodes import Entries, Node, walk
from fusevol.fuse.tree import ROOT_INODE, Tree
from fusevol.model import (
    ConfigMap,
    ConfigMapProjection,
    ConfigMapVolumeSource,
    DownwardAPIProjection,
    DownwardAPIVolumeFile,
    FileProjection,
    KeyToPath,
    ObjectFieldSelector,
    Pod,
    PodUID,
    ProjectedVolumeSource,
    ResourceVersion,
    ServiceAccountTokenProjection,
)
from fusevol.projection import configmap, downward, projected
from fusevol.projection.downward import NodeAllocatable
from fusevol.projection.paths import check_written_under, validate_payload

DEEP = "/".join(["d"] * 1500 + ["f"])
"""The finding's path: 1500 levels, 3001 characters."""
VOLUME_DIR = (
    "/var/lib/kubelet/pods/11111111-2222-4333-8444-555555555555/volumes/kubernetes.io~configmap/cfg"
)
ALLOCATABLE = NodeAllocatable(
    cpu_millis=1000, memory_bytes=1 << 30, ephemeral_storage_bytes=1 << 30
)
POD = Pod(
    PodUID("11111111-2222-4333-8444-555555555555"),
    "ns",
    "web",
    ResourceVersion("1"),
    annotations={"big": "x" * 4096},
)


def chain(tree: Tree, depth: int) -> tuple[Node, Node]:
    """A directory `depth` levels deep, built unattached: (its top, the file at the bottom)."""
    top = node = tree.new_dir(mode=0o755)
    for _ in range(depth - 1):
        below = tree.new_dir(mode=0o755)
        tree.link(node, b"d", below)
        node = below
    file = tree.new_file(b"deep", mode=0o644)
    tree.link(node, b"f", file)
    return top, file


def test_a_subtree_of_100000_levels_is_attached_walked_and_removed_without_recursion() -> None:
    tree = Tree()
    top, file = chain(tree, 100_000)
    tree.stage(tree.root, b"vol", top)

    tree.mkdir(ROOT_INODE, b"vol")

    assert tree[file.inode] is file
    assert file.attached
    assert sum(1 for _ in walk(top)) == 100_001
    assert len(tree.known_nodes()) == 100_002  # the root too
    tree.rmdir(ROOT_INODE, b"vol")
    assert not file.attached
    assert tree.statistics().nodes == 2  # the root, and the volume the kernel holds (mkdir)
    tree.forget(top.inode, 1)
    assert tree.statistics().nodes == 1


def test_the_journal_compacts_and_restores_a_deep_tree() -> None:
    tree = Tree()
    journal = snapshot.Journal.create(tree)
    top, file = chain(tree, 20_000)
    tree.stage(tree.root, b"vol", top)
    tree.mkdir(ROOT_INODE, b"vol")
    held = tree.lookup(file.parent.inode, b"f")  # type: ignore[union-attr]

    journal.compact()
    restored = snapshot.restore(os.dup(journal.fd))

    assert restored.tree[held.inode].data == b"deep"
    assert restored.tree[held.inode].nlookup == 1
    assert len(restored.tree.known_nodes()) == len(tree.known_nodes())


def test_a_1500_level_item_path_builds_a_version_with_the_file_at_its_full_path() -> None:
    tree = Tree()
    version = tree.build_version({DEEP: FileProjection(b"v1", 0o644)})
    node = version
    for name in DEEP.encode().split(b"/"):
        child = tree.child(node, name)
        assert child is not None
        node = child
    assert (node.data, stat.S_IMODE(node.mode)) == (b"v1", 0o644)


class FailingObserver:
    """A journal that cannot record an attach (its memory exhausted, say)."""

    def remembered(self, node: Node) -> None:
        pass

    def forgot(self, inode: int, nlookup: int) -> None:
        pass

    def attached(self, parent: Node, name: bytes, node: Node) -> None:
        raise MemoryError

    def renamed(self, old_parent: Node, old: bytes, new_parent: Node, new: bytes) -> None:
        pass

    def removed(self, parent: Node, name: bytes) -> None:
        pass


def test_an_attach_the_journal_cannot_record_leaves_nothing_attached() -> None:
    tree = Tree()
    top, file = chain(tree, 3)
    before = (tree.statistics(), tree.root.mtime_ns)
    tree.observer = FailingObserver()
    tree.stage(tree.root, b"vol", top)

    with pytest.raises(MemoryError):
        tree.mkdir(ROOT_INODE, b"vol")

    assert tree.child(tree.root, b"vol") is None
    assert not any(n.attached for n in walk(top))
    assert (top.nlookup, top.parent) == (0, None)
    with pytest.raises(OSError, match="no inode"):
        tree[file.inode]
    assert (tree.statistics(), tree.root.mtime_ns) == before


# -- the payload rules -----------------------------------------------------------------------------


def test_deep_paths_are_valid_and_a_file_below_a_deep_file_is_refused() -> None:
    files = {"/".join(["d"] * i + ["f"]): FileProjection(b"", 0o644) for i in range(1, 2000)}
    assert len(validate_payload(files)) == 1999
    files[DEEP + "/g"] = FileProjection(b"", 0o644)
    with pytest.raises(InvalidPayload, match=r'\(3001 bytes\) is a file, but "d/d/d/[^"]*" \(3003'):
        validate_payload(files)


def test_a_3001_character_path_fits_below_kubelets_volume_directory() -> None:
    assert len(DEEP) == 3001
    check_written_under(VOLUME_DIR, [DEEP, "k"])  # no error


@pytest.mark.parametrize(
    ("path", "operation"),
    [
        pytest.param("/".join(["d"] * 2047 + ["f"]), "mkdir", id="a-directory-too-long"),
        pytest.param("/".join(["d" * 254] * 15 + ["f" * 200]), "open", id="the-file-too-long"),
    ],
)
def test_a_path_beyond_path_max_where_kubelet_writes_it_fails_as_kubelets_write(
    path: str, operation: str
) -> None:
    assert len(path) <= 4096  # AtomicWriter's own limit lets it through
    with pytest.raises(InvalidPayload) as failed:
        check_written_under(
            VOLUME_DIR, ["k", path], field_of=lambda p: "items[1].path" if p == path else ""
        )
    message = str(failed.value)
    assert message.startswith('items[1].path: invalid path "')
    assert f"{operation} {VOLUME_DIR}/..<version>/" in message
    assert "file name too long" in message
    assert len(message) < 600  # the path is shortened, its size given


def cm_volume(*items: KeyToPath) -> ConfigMapVolumeSource:
    return ConfigMapVolumeSource(name="cm", items=items)


CM = ConfigMap("ns", "cm", ResourceVersion("1"), data={"k": b"v"})
CM_FILE = FileProjection(b"v", 0o644)


@pytest.mark.parametrize(
    ("build", "field"),
    [
        pytest.param(
            lambda path: configmap.make_payload(
                cm_volume(KeyToPath("k", "ok"), KeyToPath("k", path)), CM
            ),
            "items[1].path: ",
            id="configMap",
        ),
        pytest.param(
            lambda path: projected.make_payload(
                ProjectedVolumeSource(
                    sources=(
                        ConfigMapProjection("cm", (KeyToPath("k", "a"),)),
                        ConfigMapProjection("cm", (KeyToPath("k", path),)),
                    )
                ),
                POD,
                get_configmap=lambda name: CM,
                get_secret=lambda name: None,
                allocatable=ALLOCATABLE,
            ),
            "sources[1].configMap.items[0].path: ",
            id="projected-configMap",
        ),
        pytest.param(
            lambda path: downward.make_payload(
                (DownwardAPIVolumeFile(path, ObjectFieldSelector("metadata.name")),),
                POD,
                default_mode=0o644,
                allocatable=ALLOCATABLE,
            ),
            "items[0].path: ",
            id="downwardAPI",
        ),
        pytest.param(
            lambda path: projected.make_payload(
                ProjectedVolumeSource(sources=(ServiceAccountTokenProjection(path=path),)),
                POD,
                get_configmap=lambda name: None,
                get_secret=lambda name: None,
                allocatable=ALLOCATABLE,
                get_token=lambda projection: b"token",
            ),
            "sources[0].serviceAccountToken.path: ",
            id="projected-token",
        ),
    ],
)
def test_a_path_of_100000_levels_is_refused_naming_its_field(build: object, field: str) -> None:
    path = "/".join(["d"] * 99_999 + ["f"])
    with pytest.raises((InvalidPayload, VolumeSetupError)) as failed:
        build(path)  # type: ignore[operator]
    message = str(failed.value)
    assert message.startswith(field) or f"{field}invalid path" in message, message
    assert "must be no more than 4096 bytes, not 199999" in message
    assert len(message) < 300


def test_items_reading_one_field_share_its_bytes() -> None:
    items = tuple(
        DownwardAPIVolumeFile(f"a{i}", ObjectFieldSelector("metadata.annotations"))
        for i in range(100)
    )
    payload = downward.make_payload(items, POD, default_mode=0o644, allocatable=ALLOCATABLE)
    assert len({id(f.data) for f in payload.values()}) == 1


def test_an_aggregate_of_many_errors_names_ten() -> None:
    items = tuple(
        DownwardAPIVolumeFile(f"a{i}", ObjectFieldSelector(f"metadata.labels['-{i}']"))
        for i in range(1000)
    )
    with pytest.raises(VolumeSetupError) as failed:
        downward.make_payload(items, POD, default_mode=0o644, allocatable=ALLOCATABLE)
    message = str(failed.value)
    assert message.endswith(", and 990 more]")
    assert message.count("invalid key subscript") == 10


def test_downward_paths_are_refused_naming_the_item() -> None:
    items = (
        DownwardAPIProjection(
            (DownwardAPIVolumeFile("./..data", ObjectFieldSelector("metadata.name")),)
        ),
    )
    with pytest.raises(VolumeSetupError, match=r"^sources\[0\]\.downwardAPI\.items\[0\]\.path: "):
        projected.make_payload(
            ProjectedVolumeSource(sources=items),
            POD,
            get_configmap=lambda name: None,
            get_secret=lambda name: None,
            allocatable=ALLOCATABLE,
        )


# -- wide: a directory of many entries ------------------------------------------------------------


def wide_tree(count: int) -> Tree:
    """A tree whose root holds `count` volume directories, attached one by one."""
    tree = Tree()
    for i in range(count):
        tree.add(tree.root, f"v{i}".encode(), tree.new_dir(mode=0o755))
    return tree


def listing(tree: Tree, directory: Node, per_request: int) -> list[bytes]:
    """What READDIR requests of `per_request` entries each return, resuming at the last offset."""
    names: list[bytes] = []
    after = 0
    while True:
        batch = []
        for name, node in tree.entries(directory, after):
            batch.append(name)
            after = node.inode
            if len(batch) == per_request:
                break
        names += batch
        if len(batch) < per_request:
            return names


def test_a_listing_of_a_large_directory_sorts_it_once_and_follows_its_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tree = wide_tree(1000)
    sorts: list[int] = []
    order_of = order._Order.of

    def counted(cls: type, children: Entries) -> object:
        sorts.append(len(children))
        return order_of(children)

    monkeypatch.setattr(order._Order, "of", classmethod(counted))

    assert listing(tree, tree.root, 27) == [f"v{i}".encode() for i in range(1000)]
    assert len(sorts) == 1  # not once per request: 38 requests

    tree.rmdir(ROOT_INODE, b"v5")
    tree.add(tree.root, b"new", tree.new_dir(mode=0o755))
    tree.rename(ROOT_INODE, b"v7", ROOT_INODE, b"seven")
    expected = [f"v{i}".encode() for i in range(1000) if i not in (5, 7)]
    expected.insert(7 - 1, b"seven")  # a renamed entry keeps its node, and its place
    assert listing(tree, tree.root, 27) == [*expected, b"new"]
    assert len(sorts) == 1  # the order kept followed the changes

    for i in range(100, 600):  # the churn of an edit that renames every key
        tree.rmdir(ROOT_INODE, f"v{i}".encode())
        tree.symlink(ROOT_INODE, f"w{i}".encode(), b"target")
    by_inode = sorted(tree.root.children.items(), key=lambda item: item[1].inode)  # type: ignore[union-attr]
    assert listing(tree, tree.root, 27) == [name for name, _ in by_inode]
    assert len(sorts) == 1
    assert tree.root.nlink == 2 + 1000 - 1 + 1 - 500  # v5 gone, `new` made, 500 removed


def test_the_link_count_of_a_large_directory_follows_its_changes() -> None:
    tree = wide_tree(100)
    tree.add(tree.root, b"file", tree.new_file(b"", mode=0o644))
    assert tree.root.nlink == 102
    tree.add(tree.root, b"one-more", tree.new_dir(mode=0o755))
    assert tree.root.nlink == 103
    tree.rmdir(ROOT_INODE, b"v0")
    tree.unlink(ROOT_INODE, b"file")
    assert tree.root.nlink == 102


def test_the_count_of_detached_nodes_follows_every_change_without_a_walk() -> None:
    """`statistics`, which every STATFS asks for, counts as nodes come and go: checked against a
    count over the inode table after each step of versions published, held, removed, forgotten."""
    tree = Tree()

    def check() -> None:
        table = tree._nodes
        assert tree.statistics().detached_known == sum(not n.attached for n in table.values())
        assert tree.statistics().nodes == len(table)

    volume = tree.new_dir(mode=0o755)
    tree.stage(tree.root, b"vol", volume)
    tree.mkdir(ROOT_INODE, b"vol")
    held = []
    for n in range(3):
        version = tree.build_version({f"d/f{n}": FileProjection(b"x", 0o644), "g": CM_FILE})
        tree.stage(volume, f"..v{n}".encode(), version)
        tree.mkdir(volume.inode, f"..v{n}".encode())
        check()
        held.append(tree.lookup(tree.lookup(version.inode, b"d").inode, f"f{n}".encode()))
        tree.symlink(volume.inode, b"..data_tmp", f"..v{n}".encode())
        tree.rename(volume.inode, b"..data_tmp", volume.inode, b"..data")  # replaces the last
        check()
        if n:
            tree.rmdir(volume.inode, f"..v{n - 1}".encode())  # its `d` and file still held
            check()
    for node in held[:-1]:
        tree.forget(node.inode, 1)
        check()
        tree.forget(node.parent.inode, 1)  # type: ignore[union-attr]
        check()
    tree.rmdir(ROOT_INODE, b"vol")
    check()
    # What the kernel still holds: `vol`, the three versions (mkdir's lookups), the three `..data`
    # links (symlink's), the last version's `d` and file.
    assert tree.statistics().detached_known == 9
