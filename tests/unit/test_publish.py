"""The publisher's first version of a volume, built in memory and attached whole (no FUSE mount)."""

from __future__ import annotations

from pathlib import Path

import trio

from fusevol.fuse.publish import Publisher, VolumeDir
from fusevol.fuse.tree import Tree
from tests.unit.test_tree import PAYLOAD, VOL, Clock, walk


def test_a_new_volume_is_made_at_one_clock_reading_held_once() -> None:
    clock = Clock()
    tree = Tree(clock_ns=clock)
    publisher = Publisher(tree, mountpoint=Path("/nonexistent"), grace_s=1)

    made = trio.run(lambda: publisher.publish(VOL, PAYLOAD, new=VolumeDir(0o777, nested=("m",))))

    volume = tree.child(tree.root, VOL)
    assert made
    assert volume is not None
    nodes = list(walk(volume))
    # the volume, its nested mountpoint, ..data, a.conf and dir links, the version's six nodes
    assert len(nodes) == 11
    assert {id(node.mtime_ns) for node in nodes} == {id(volume.mtime_ns)}
    assert volume.mtime_ns < tree.root.mtime_ns == clock.now
