"""The tree's state in a memfd (`fusevol.fuse.snapshot`): what a successor restores is what the
kernel may know, after any sequence of changes, compactions, and a write cut short by a kill."""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

import pytest

from fusevol.fuse import snapshot
from fusevol.fuse.naming import number_after
from fusevol.fuse.tree import ROOT_INODE, Tree
from fusevol.model import FileProjection

if TYPE_CHECKING:
    from fusevol.fuse.nodes import Node

PAYLOAD = {
    "a.conf": FileProjection(b"alpha", 0o644),
    "dir/b.txt": FileProjection(b"secret!", 0o600, fs_user=1000),
}
VOL = b"pod_cfg"


def state(tree: Tree) -> dict[int, tuple[object, ...]]:
    """Every node the kernel may ask about: inode -> what it would be answered, and lookups."""
    table: dict[int, tuple[object, ...]] = {}
    for node in tree.known_nodes():
        children = (
            None
            if node.children is None
            else sorted((name, child.inode) for name, child in node.children.items())
        )
        table[node.inode] = (
            node.mode,
            node.uid,
            node.gid,
            node.data,
            node.target,
            children,
            node.nlookup,
            node.attached,
        )
    return table


def publish(tree: Tree, volume: Node, name: bytes, payload: dict[str, FileProjection]) -> Node:
    version = tree.build_version(payload)
    tree.stage(volume, name, version)
    tree.mkdir(volume.inode, name)
    tree.symlink(volume.inode, b"..data_tmp", name)
    tree.rename(volume.inode, b"..data_tmp", volume.inode, b"..data")
    return version


def make_volume(tree: Tree) -> Node:
    tree.stage(tree.root, VOL, tree.new_dir(mode=0o777))
    return tree.mkdir(ROOT_INODE, VOL)


def test_restore_reproduces_every_known_node_and_lookup_count() -> None:
    tree = Tree()
    journal = snapshot.Journal.create(tree)
    journal.write_init(b"I" * 104)
    volume = make_volume(tree)
    old = publish(tree, volume, b"..v1", PAYLOAD)
    held = tree.lookup(old.inode, b"a.conf")  # a reader holds a file of the old version
    tree.lookup(ROOT_INODE, VOL)
    publish(tree, volume, b"..v2", {**PAYLOAD, "a.conf": FileProjection(b"ALPHA", 0o644)})
    tree.symlink(volume.inode, b"a.conf", b"..data/a.conf")
    tree.rmdir(volume.inode, b"..v1")  # removed, but the kernel still holds `held`
    assert not held.attached

    restored = snapshot.restore(os.dup(journal.fd))

    assert restored.init_request == b"I" * 104
    assert state(restored.tree) == state(tree)
    assert restored.tree[held.inode].data == b"alpha"
    new = restored.tree.new_file(b"x", mode=0o644)
    assert number_after(new.inode) == tree.next_inode + 1  # never handed out twice


def test_the_successor_goes_on_writing_where_the_restored_journal_ends() -> None:
    tree = Tree()
    journal = snapshot.Journal.create(tree)
    volume = make_volume(tree)
    publish(tree, volume, b"..v1", PAYLOAD)

    first = snapshot.restore(os.dup(journal.fd))
    successor = first.tree
    v1 = successor.child(successor[volume.inode], b"..v1")
    assert v1 is not None
    file = successor.lookup(v1.inode, b"a.conf")
    successor.forget(file.inode, 1)
    publish(successor, successor[volume.inode], b"..v2", {"k": FileProjection(b"kilo", 0o644)})

    second = snapshot.restore(os.dup(journal.fd))
    assert state(second.tree) == state(successor)


def test_compaction_keeps_the_state_and_frees_the_journal() -> None:
    tree = Tree()
    journal = snapshot.Journal.create(tree)
    volume = make_volume(tree)
    big = {"blob": FileProjection(b"x" * 300_000, 0o644)}
    for i in range(12):  # > 1 MiB of journal: compacted at least once
        publish(tree, volume, b"..v%d" % i, big)
        tree.rmdir(volume.inode, b"..v%d" % i) if i else None
    allocated = os.fstat(journal.fd).st_blocks * 512

    assert state(snapshot.restore(os.dup(journal.fd)).tree) == state(tree)
    assert allocated < 3 * 1024 * 1024  # the old bases and journals were punched out


def test_a_record_cut_short_by_a_kill_is_ignored_and_overwritten() -> None:
    tree = Tree()
    journal = snapshot.Journal.create(tree)
    volume = make_volume(tree)
    publish(tree, volume, b"..v1", PAYLOAD)
    before = state(tree)
    end = os.fstat(journal.fd).st_size
    os.pwrite(journal.fd, b"\x77" * 50, end + 4)  # a body written, its length never

    restored = snapshot.restore(os.dup(journal.fd))
    assert state(restored.tree) == before
    restored.tree.lookup(volume.inode, b"..data")  # the next record lands on a clean end
    assert state(snapshot.restore(os.dup(journal.fd)).tree) == state(restored.tree)


def test_a_memfd_without_state_is_refused() -> None:
    fd = os.memfd_create("empty")
    with pytest.raises(snapshot.StateError):
        snapshot.restore(fd)


def test_restored_symlinks_and_modes() -> None:
    tree = Tree()
    journal = snapshot.Journal.create(tree)
    volume = make_volume(tree)
    publish(tree, volume, b"..v1", PAYLOAD)
    restored = snapshot.restore(os.dup(journal.fd)).tree
    data = restored.child(restored[volume.inode], b"..data")
    assert data is not None
    assert stat.S_ISLNK(data.mode)
    assert data.target == b"..v1"
    secret = restored.child(restored.child(restored[volume.inode], b"..v1"), b"dir")  # type: ignore[arg-type]
    assert secret is not None
    assert secret.children is not None
    assert secret.children[b"b.txt"].mode == stat.S_IFREG | 0o600


def test_lookups_alone_do_not_grow_the_memfd_without_bound() -> None:
    """A long-lived agent that publishes nothing still takes lookups and forgets: compacted too."""
    tree = Tree()
    journal = snapshot.Journal.create(tree)
    volume = make_volume(tree)
    publish(tree, volume, b"..v1", PAYLOAD)
    for _ in range(200_000):  # ~4.6 MB of records
        node = tree.lookup(volume.inode, b"..data")
        tree.forget(node.inode, 1)
    assert os.fstat(journal.fd).st_blocks * 512 < 3 * 1024 * 1024
    assert os.fstat(journal.fd).st_size < 8 * 1024 * 1024  # offsets wrap back: no endless growth
    assert state(snapshot.restore(os.dup(journal.fd)).tree) == state(tree)


def test_at_rest_the_journal_shrinks_to_about_the_live_tree() -> None:
    """Busy, the journal may grow to four bases and a MiB; `tidy` (the agent at rest) compacts it
    once it outweighs the base, and not for a few records; the memfd stays mapped."""
    tree = Tree()
    journal = snapshot.Journal.create(tree)
    volume = make_volume(tree)
    publish(tree, volume, b"..v1", PAYLOAD)
    for _ in range(2):  # the new base after the journal, then back at the start of the memfd
        for _ in range(20_000):  # ~460 KB of records: below the busy agent's threshold
            node = tree.lookup(volume.inode, b"..data")
            tree.forget(node.inode, 1)
        busy = os.fstat(journal.fd).st_blocks * 512
        descriptors = len(os.listdir("/proc/self/fd"))  # the memfd's mapping holds one
        journal.tidy()
        rested = os.fstat(journal.fd).st_blocks * 512
        assert busy > 400_000
        assert rested < 32 * 1024, f"{busy} -> {rested} bytes"
        assert len(os.listdir("/proc/self/fd")) == descriptors  # as many at rest as busy

    header = os.pread(journal.fd, 64, 0)  # where the base is
    tree.lookup(volume.inode, b"..data")  # a few records: not worth a compaction
    journal.tidy()
    assert os.pread(journal.fd, 64, 0) == header
    assert state(snapshot.restore(os.dup(journal.fd)).tree) == state(tree)
