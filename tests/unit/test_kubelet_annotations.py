"""kubelet's own pod annotations (config.source, config.seen, config.hash): the timestamp format,
the first-seen record, and the populator adding them to the pods of the desired state only."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from fusevol.model import (
    DownwardAPIVolumeFile,
    DownwardAPIVolumeSource,
    ObjectFieldSelector,
    Pod,
    PodUID,
    ResourceVersion,
    UniqueVolumeName,
    Volume,
    VolumeName,
)
from fusevol.projection.downward import NodeAllocatable, make_payload
from fusevol.volumemanager.cache.desired import CsiVolume, DesiredState
from fusevol.volumemanager.cache.seen import FirstSeen, go_timestamp
from fusevol.volumemanager.cache.store import ObjectStore
from fusevol.volumemanager.populator import ConfigSource, KubeletAnnotations, Populator

if TYPE_CHECKING:
    from collections.abc import Iterator

# 2026-11-23T18:11:14Z and a fraction whose trailing zeros Go's fixed layout keeps.
SECOND = 1795457474
NS = SECOND * 10**9 + 677_143_500


@pytest.fixture
def timezone() -> Iterator[None]:
    """Restore the process's time zone after a test that changes TZ."""
    saved = os.environ.get("TZ")
    yield
    if saved is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = saved
    time.tzset()


def in_zone(tz: str) -> None:
    os.environ["TZ"] = tz
    time.tzset()


@pytest.mark.usefixtures("timezone")
@pytest.mark.parametrize(
    ("tz", "ns", "expected"),
    [
        pytest.param("UTC0", NS, "2026-11-23T18:11:14.677143500Z", id="utc-trailing-zeros-kept"),
        pytest.param("UTC0", SECOND * 10**9, "2026-11-23T18:11:14.000000000Z", id="whole-second"),
        pytest.param("UTC0", SECOND * 10**9 + 1, "2026-11-23T18:11:14.000000001Z", id="one-ns"),
        # POSIX TZ strings (no tzdata needed): "XST-5:30" is UTC+05:30, as kubelet's local time.
        pytest.param("XST-5:30", NS, "2026-11-23T23:41:14.677143500+05:30", id="east"),
        pytest.param("XST+3", NS, "2026-11-23T15:11:14.677143500-03:00", id="west"),
    ],
)
def test_timestamp_is_gos_rfc3339nano_fixed_in_local_time(tz: str, ns: int, expected: str) -> None:
    in_zone(tz)
    assert go_timestamp(ns) == expected


def test_first_seen_is_recorded_once_and_read_back_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "fusevol" / "seen.json"
    clock = iter([NS, NS + 10**9, NS + 2 * 10**9])
    first = FirstSeen(path=path, clock=lambda: next(clock))
    a, b = PodUID("uid-a"), PodUID("uid-b")
    seen_a = first.seen(a)
    assert first.seen(a) == seen_a  # kept: the clock is not read again
    first.save()
    assert json.loads(path.read_text()) == {"seen": {a: seen_a}}
    # A restart: a new record on the same file gives the same value, without the clock.
    second = FirstSeen(path=path, clock=lambda: pytest.fail("the clock was read"))
    assert second.seen(a) == seen_a
    # A new pod gets the next time; a pod gone is pruned from the file.
    seen_b = first.seen(b)
    assert seen_b != seen_a
    first.retain({b})
    first.save()
    assert json.loads(path.read_text()) == {"seen": {b: seen_b}}
    assert first.statistics().saves == 2


def test_first_seen_saves_only_when_it_changed(tmp_path: Path) -> None:
    path = tmp_path / "seen.json"
    record = FirstSeen(path=path)
    record.save()
    assert not path.exists()
    record.seen(PodUID("uid-a"))
    record.save()
    written = path.stat().st_ino  # a save renames a new file over it: a new inode
    record.seen(PodUID("uid-a"))
    record.retain({PodUID("uid-a")})
    record.save()
    assert path.stat().st_ino == written
    assert (record.statistics().pods, record.statistics().saves) == (1, 1)


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"{not json", id="not-json"),
        pytest.param(b'["seen"]', id="not-an-object"),
        pytest.param(b'{"seen": 3}', id="seen-not-a-map"),
    ],
)
def test_an_unreadable_record_is_logged_and_replaced(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "seen.json"
    path.write_bytes(content)
    record = FirstSeen(path=path, clock=lambda: NS)
    value = record.seen(PodUID("uid-a"))
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert str(path) in caplog.records[0].getMessage()
    caplog.clear()
    record.save()
    assert json.loads(path.read_text()) == {"seen": {"uid-a": value}}


ALLOCATABLE = NodeAllocatable(cpu_millis=1000, memory_bytes=2**30, ephemeral_storage_bytes=2**30)

# -- the populator ---------------------------------------------------------------------------------

ANNOTATIONS_FILE = DownwardAPIVolumeFile("annotations", ObjectFieldSelector("metadata.annotations"))
SOURCE_FILE = DownwardAPIVolumeFile(
    "source", ObjectFieldSelector("metadata.annotations['kubernetes.io/config.source']")
)
POD = Pod(
    uid=PodUID("0b7a6c1e-0000-4000-8000-000000000001"),
    namespace="shop",
    name="web",
    resource_version=ResourceVersion("1"),
    annotations={
        "a.example.com/note": 'say "hi"\n',
        "kubernetes.io/config.source": "mine",  # kubelet's value replaces the pod's
        "zz.example.com/last": "z",
    },
    volumes=(
        Volume(
            VolumeName("info"),
            DownwardAPIVolumeSource(items=(ANNOTATIONS_FILE, SOURCE_FILE), default_mode=0o644),
        ),
    ),
)


def populate(source: ConfigSource, record: FirstSeen, pod: Pod = POD) -> tuple[Pod, ObjectStore]:
    """One populator pass over a synced store holding `pod`: the pod the desired state got."""
    store, desired = ObjectStore(), DesiredState()
    store.upsert(pod)
    store.mark_synced()
    Populator(
        store=store, desired=desired, annotations=KubeletAnnotations(source, record)
    ).populate()
    (annotated,) = desired.pods()
    return annotated, store


def served(pod: Pod) -> dict[str, bytes]:
    """The downwardAPI volume's files, as the agent renders them."""
    source = pod.volumes[0].source
    assert isinstance(source, DownwardAPIVolumeSource)
    payload = make_payload(source.items, pod, default_mode=0o644, allocatable=ALLOCATABLE)
    return {path: projection.data for path, projection in payload.items()}


@pytest.mark.usefixtures("timezone")
def test_api_pods_get_source_and_seen_and_the_store_keeps_the_pod_as_delivered() -> None:
    in_zone("UTC0")
    annotated, store = populate(ConfigSource.API, FirstSeen(path=None, clock=lambda: NS))
    files = served(annotated)
    assert files["annotations"] == (
        b'a.example.com/note="say \\"hi\\"\\n"\n'
        b'kubernetes.io/config.seen="2026-11-23T18:11:14.677143500Z"\n'
        b'kubernetes.io/config.source="api"\n'
        b'zz.example.com/last="z"'
    )
    assert files["source"] == b"api"
    assert store.get(POD.key) is POD  # nothing written back into the object
    assert POD.annotations["kubernetes.io/config.source"] == "mine"


@pytest.mark.usefixtures("timezone")
def test_file_pods_also_get_their_uid_as_config_hash() -> None:
    in_zone("UTC0")
    pod = dataclasses.replace(POD, annotations={"kubernetes.io/config.hash": "given"})
    annotated, _ = populate(ConfigSource.FILE, FirstSeen(path=None, clock=lambda: NS), pod)
    assert served(annotated)["annotations"] == (
        b'kubernetes.io/config.hash="0b7a6c1e-0000-4000-8000-000000000001"\n'
        b'kubernetes.io/config.seen="2026-11-23T18:11:14.677143500Z"\n'
        b'kubernetes.io/config.source="file"'
    )
    assert served(annotated)["source"] == b"file"


def test_seen_is_kept_across_updates_and_pruned_when_the_pod_goes(tmp_path: Path) -> None:
    path = tmp_path / "seen.json"
    path.write_text('{"seen": {"uid-not-read-yet": "2026-11-23T18:00:00.000000000Z"}}')
    clock = iter(range(NS, NS + 10 * 10**9, 10**9))
    record = FirstSeen(path=path, clock=lambda: next(clock))
    store, desired = ObjectStore(), DesiredState()
    populator = Populator(
        store=store, desired=desired, annotations=KubeletAnnotations(ConfigSource.API, record)
    )
    store.upsert(POD)
    populator.populate()  # not synced yet: recorded and saved, but a pod not read yet stays
    (first,) = desired.pods()
    seen = first.annotations["kubernetes.io/config.seen"]
    assert json.loads(path.read_text()) == {
        "seen": {POD.uid: seen, "uid-not-read-yet": "2026-11-23T18:00:00.000000000Z"}
    }
    store.upsert(
        dataclasses.replace(POD, resource_version=ResourceVersion("2"), labels={"new": "label"})
    )
    store.mark_synced()
    populator.populate()
    (updated,) = desired.pods()
    assert updated.labels == {"new": "label"}
    assert updated.annotations["kubernetes.io/config.seen"] == seen
    assert json.loads(path.read_text()) == {"seen": {POD.uid: seen}}  # synced: the other went
    store.delete(POD.key)
    populator.populate()
    assert desired.pods() == ()
    assert json.loads(path.read_text()) == {"seen": {}}
    store.upsert(POD)  # the same uid again: a new pod to kubelet, a new time
    populator.populate()
    (again,) = desired.pods()
    assert again.annotations["kubernetes.io/config.seen"] != seen


def test_an_unchanged_pod_is_the_same_annotated_copy_from_pass_to_pass() -> None:
    store, desired = ObjectStore(), DesiredState()
    populator = Populator(
        store=store,
        desired=desired,
        annotations=KubeletAnnotations(ConfigSource.API, FirstSeen(path=None)),
    )
    store.upsert(POD)
    populator.populate()
    (first,) = desired.pods()
    populator.populate()
    (second,) = desired.pods()
    assert second is first


@pytest.mark.parametrize("source", [ConfigSource.API, ConfigSource.FILE])
def test_the_annotations_are_one_mapping_read_through_the_pods_own(source: ConfigSource) -> None:
    """Not a dict merged for each of thousands of pods: a small mapping over the pod's own, which
    reads, iterates and compares as the merged dict would."""
    annotated, _ = populate(source, FirstSeen(path=None, clock=lambda: NS))
    annotations = annotated.annotations
    added = {
        "kubernetes.io/config.source": source.value,
        "kubernetes.io/config.seen": annotations["kubernetes.io/config.seen"],
    }
    if source is ConfigSource.FILE:
        added["kubernetes.io/config.hash"] = POD.uid
    merged = {**POD.annotations, **added}
    assert annotations == merged
    assert (list(annotations), len(annotations)) == (list(merged), len(merged))
    assert annotations.get("a.example.com/note") == 'say "hi"\n'
    assert annotations.get("kubernetes.io/config.hash") == added.get("kubernetes.io/config.hash")
    assert repr(annotations) == repr(merged)
    assert not hasattr(annotations, "__dict__")


def test_a_csi_volumes_pod_keeps_its_time_while_the_store_has_it_not() -> None:
    """A CSI volume outlives its pod in the store (deleted, kubelet not done unpublishing; or
    published before the source delivered it): its time is kept pass to pass. It was recorded
    anew at each pass and forgotten at the next: every pass then changed the volume, which
    started another pass (an agent of the cluster kit switched one volume 60 times a second)."""
    clock = iter(range(NS, NS + 100 * 10**9, 10**9))
    record = FirstSeen(path=None, clock=lambda: next(clock))
    store, desired = ObjectStore(), DesiredState()
    populator = Populator(
        store=store,
        desired=desired,
        annotations=KubeletAnnotations(ConfigSource.API, record),
        pod_volumes=False,
    )
    csi = CsiVolume(
        UniqueVolumeName("kubernetes.io/csi/fusevol.io^csi-1"),
        POD,
        POD.volumes[0],
        Path("/var/lib/kubelet/pods/x/volumes/kubernetes.io~csi/info/mount"),
    )
    desired.set_csi(csi)
    store.mark_synced()  # the store does not hold the pod
    populator.populate()
    generation = desired.generation
    first = desired.get(csi.name)
    for _ in range(3):
        populator.populate()
    assert desired.generation == generation  # nothing changed: no pass to follow
    assert desired.get(csi.name) == first
    assert record.statistics().pods == 1
    desired.delete_csi(csi.name)  # unpublished: forgotten at the next pass
    populator.populate()
    assert record.statistics().pods == 0
