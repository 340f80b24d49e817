"""The publisher without a FUSE mount: a volume's first version, built in memory and attached
whole, and the comparison that tells an unchanged payload (AtomicWriter's step 4)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from fusevol.fuse import publish
from fusevol.fuse.pins import Pins
from fusevol.fuse.publish import Publisher, VolumeDir, _holds
from fusevol.fuse.tree import Tree
from fusevol.model import FileProjection
from tests.unit.test_tree import PAYLOAD, VOL, Clock, walk

if TYPE_CHECKING:
    from fusevol.model import Payload


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


def test_volumes_made_together_share_their_version_name_and_link_targets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(time, "gmtime", lambda *_: time.struct_time((2026, 1, 2, 3, 4, 5, 4, 2, 0)))
    tree = Tree()
    publisher = Publisher(tree, mountpoint=Path("/nonexistent"), grace_s=1)

    async def make() -> None:
        for volume in (b"uid-1_cfg", b"uid-2_cfg"):
            await publisher.publish(volume, PAYLOAD, new=VolumeDir(0o777))

    trio.run(make)
    first, second = (tree.child(tree.root, v) for v in (b"uid-1_cfg", b"uid-2_cfg"))
    assert first is not None
    assert second is not None
    data = [tree.child(volume, b"..data") for volume in (first, second)]
    links = [tree.child(volume, b"a.conf") for volume in (first, second)]
    assert data[0] is not None
    assert data[1] is not None
    assert links[0] is not None
    assert links[1] is not None
    assert data[0].target.startswith(b"..2026_01_02_03_04_05.")  # kubelet's form
    assert data[0].target is data[1].target
    assert links[0].target == b"..data/a.conf"
    assert links[0].target is links[1].target
    names = [[name for name, _ in tree.entries(volume, 0)] for volume in (first, second)]
    assert names[0] == names[1]
    assert all(a is b for a, b in zip(*names, strict=True))  # each name one object for both


def with_a_conf(data: bytes = b"alpha", mode: int = 0o644, owner: int | None = None) -> Payload:
    return {**PAYLOAD, "a.conf": FileProjection(data, mode, fs_user=owner)}


AS_BUILT = (2000, 0o2755)


@pytest.mark.parametrize(
    ("payload", "group_and_mode", "holds"),
    [
        pytest.param(PAYLOAD, AS_BUILT, True, id="as-built"),
        pytest.param(with_a_conf(owner=0), AS_BUILT, True, id="owner-0-is-no-owner"),
        pytest.param(with_a_conf(data=b"alpha2"), AS_BUILT, False, id="data"),
        pytest.param(with_a_conf(mode=0o600), AS_BUILT, False, id="mode"),
        pytest.param(with_a_conf(owner=7), AS_BUILT, False, id="owner"),
        pytest.param(PAYLOAD, (2001, 0o2755), False, id="group"),
        pytest.param(PAYLOAD, (2000, 0o755), False, id="directory-mode"),
        pytest.param(
            {k: v for k, v in PAYLOAD.items() if k != "dir/sub/c"},
            AS_BUILT,
            False,
            id="a-file-less",
        ),
        pytest.param({**PAYLOAD, "dir/d": PAYLOAD["a.conf"]}, AS_BUILT, False, id="a-file-more"),
        pytest.param({**PAYLOAD, "dir": PAYLOAD["a.conf"]}, AS_BUILT, False, id="dir-as-file"),
    ],
)
def test_a_version_holds_a_payload_only_if_built_from_the_same(
    payload: Payload, group_and_mode: tuple[int, int], holds: bool
) -> None:
    tree = Tree()
    version = tree.build_version(PAYLOAD, dir_mode=0o2755, gid=2000)
    gid, dir_mode = group_and_mode
    assert _holds(version, payload, gid, dir_mode) is holds


class AskedPins(Pins):
    """Pins that record what the publisher asks, in order, and hold nothing."""

    def __init__(self) -> None:
        super().__init__(0)
        self.asked: list[tuple[str, list[str] | None]] = []

    def pin(self, root: str, names: list[str], *, listed: bool = False) -> None:
        self.asked.append(("pin", sorted(names)))

    def unpin(self, root: str, names: list[str] | None = None) -> None:
        self.asked.append(("unpin", names))

    async def released(self, root: str, names: list[str] | None = None) -> None:
        self.asked.append(("released", names))


def test_a_new_volume_is_pinned_whole_and_a_too_large_one_not_at_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pins = AskedPins()
    publisher = Publisher(Tree(), mountpoint=Path("/nonexistent"), grace_s=1, pins=pins)
    trio.run(lambda: publisher.publish(VOL, PAYLOAD, new=VolumeDir(0o777)))
    version = publisher.current_version(VOL)
    assert version is not None
    files = [f"{version.decode()}/{path}" for path in PAYLOAD]
    assert pins.asked == [("pin", sorted(["..data", "a.conf", "dir", *files]))]

    monkeypatch.setattr(publish, "PIN_NAMES", len(PAYLOAD) + 2)  # `..data`, 2 links, 3 files
    pins.asked.clear()
    trio.run(lambda: publisher.publish(b"other", PAYLOAD, new=VolumeDir(0o777)))
    assert pins.asked == [("unpin", None)]  # none held, none asked


def test_a_volume_being_removed_is_not_pinned_again() -> None:
    """A CSI volume's warming may end, and ask for its pins, while its removal waits for a
    helper after its pins were let go of: nothing is pinned after the release."""
    tree = Tree()
    pins = AskedPins()
    publisher = Publisher(tree, mountpoint=Path("/nonexistent"), grace_s=1, pins=pins)
    trio.run(lambda: publisher.publish(VOL, PAYLOAD, new=VolumeDir(0o777)))

    async def rmdir_after_the_warming_ended(op: str, *args: object) -> None:
        assert op == "rmdir"
        publisher._pin(VOL)  # the warming's end, meanwhile
        tree.rmdir(tree.root.inode, VOL)

    publisher._vfs = rmdir_after_the_warming_ended  # type: ignore[method-assign]
    pins.asked.clear()
    trio.run(publisher.remove_volume, VOL)
    assert pins.asked == [("released", None)]
