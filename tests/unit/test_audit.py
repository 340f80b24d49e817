"""The audit's parts that need no mount: which volumes are audited, where each file comes from,
the index the agent writes and the server reads, who a caller is (from a fake /proc), the record.
"""

from __future__ import annotations

import datetime
import json
from typing import TYPE_CHECKING

import pytest

from fusevol.fuse.audit_index import IndexReader, IndexWriter, VolumeFacts
from fusevol.fuse.audit_records import record
from fusevol.fuse.callers import Callers, container_of
from fusevol.model import (
    ConfigMap,
    ConfigMapProjection,
    ConfigMapVolumeSource,
    DownwardAPIProjection,
    DownwardAPIVolumeFile,
    KeyToPath,
    ObjectFieldSelector,
    Pod,
    PodUID,
    ProjectedVolumeSource,
    ResourceVersion,
    Secret,
    SecretProjection,
    SecretVolumeSource,
    ServiceAccountTokenProjection,
)
from fusevol.model.audit import ANNOTATION, AuditLevel, Origin, audited, pod_level
from fusevol.projection.origins import origins
from fusevol.volumemanager.reconciler.auditing import Auditing

if TYPE_CHECKING:
    from pathlib import Path

POD = Pod(PodUID("u-1"), "ns", "app", ResourceVersion("7"), service_account_name="builder")
CM = ConfigMap("ns", "cfg", ResourceVersion("11"), data={"a": b"1"}, binary_data={"b": b"\0"})
SECRET = Secret("ns", "db", ResourceVersion("12"), data={"password": b"x", "user": b"y"})


def get(key: object) -> object:
    return {CM.key: CM, SECRET.key: SECRET}.get(key)  # type: ignore[call-overload]


# -- which volumes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("level", "source", "expected"),
    [
        (AuditLevel.OFF, SecretVolumeSource("db"), False),
        (AuditLevel.SECRETS, SecretVolumeSource("db"), True),
        (AuditLevel.SECRETS, ConfigMapVolumeSource("cfg"), False),
        (AuditLevel.SECRETS, ProjectedVolumeSource((ConfigMapProjection("cfg"),)), False),
        (AuditLevel.SECRETS, ProjectedVolumeSource((SecretProjection("db"),)), True),
        (AuditLevel.ALL, ConfigMapVolumeSource("cfg"), True),
    ],
)
def test_a_level_audits_what_it_names(level: AuditLevel, source: object, expected: bool) -> None:
    assert audited(level, source) is expected


@pytest.mark.parametrize(
    ("annotation", "level"),
    [
        (None, AuditLevel.OFF),
        ("Secrets", AuditLevel.SECRETS),
        ("off", AuditLevel.OFF),
        ("all", AuditLevel.ALL),
        ("yes please", AuditLevel.ALL),
    ],
)
def test_a_pods_annotation_and_a_typo_that_must_not_turn_an_audit_off(
    annotation: str | None, level: AuditLevel
) -> None:
    assert pod_level({} if annotation is None else {ANNOTATION: annotation}) is level


# -- where each file comes from --------------------------------------------------------------------


def test_origins_follow_the_payload_rules() -> None:
    assert origins(POD, ConfigMapVolumeSource("cfg"), get) == {
        "a": Origin("ConfigMap", "ns", "cfg", "11", "a"),
        "b": Origin("ConfigMap", "ns", "cfg", "11", "b"),
    }
    items = (KeyToPath("password", "deep/./pw"), KeyToPath("absent", "x"))
    assert origins(POD, SecretVolumeSource("db", items), get) == {
        "deep/pw": Origin("Secret", "ns", "db", "12", "password")
    }
    assert origins(POD, SecretVolumeSource("missing"), get) == {}
    projected = ProjectedVolumeSource(
        (
            SecretProjection("db", (KeyToPath("user", "who"),)),
            ConfigMapProjection("cfg", (KeyToPath("a", "who"),)),  # later sources win a path
            DownwardAPIProjection(
                (DownwardAPIVolumeFile("labels", ObjectFieldSelector("metadata.labels")),)
            ),
            ServiceAccountTokenProjection("token"),
        )
    )
    assert origins(POD, projected, get) == {
        "who": Origin("ConfigMap", "ns", "cfg", "11", "a"),
        "labels": Origin("Pod", "ns", "app", "7", "metadata.labels"),
        "token": Origin("ServiceAccount", "ns", "builder", "", "token"),
    }


# -- the index -------------------------------------------------------------------------------------


def test_an_open_of_a_version_not_yet_named_is_of_the_pending_one(tmp_path: Path) -> None:
    writer, reader = IndexWriter(tmp_path, node_name="n1"), IndexReader(tmp_path)
    facts = VolumeFacts("ns", "app", "u-1", "creds", "secret")
    v1 = {"password": Origin("Secret", "ns", "db", "12", "password")}
    v2 = {"password": Origin("Secret", "ns", "db", "13", "password")}
    assert reader.find(b"sub", b"..v1", "password") is None  # not audited
    writer.prepare(b"sub", facts, v1, "t0")
    found = reader.find(b"sub", b"..v1", "password")
    assert found is not None
    assert found.origin == ["Secret", "ns", "db", "12", "password"]
    writer.published(b"sub", b"..v1")
    writer.prepare(b"sub", facts, v2, "t1")
    old, new = reader.find(b"sub", b"..v1", "password"), reader.find(b"sub", b"..v2", "password")
    assert old is not None
    assert old.origin is not None
    assert old.origin[3] == "12"
    assert new is not None
    assert new.origin is not None
    assert new.origin[3] == "13"
    writer.published(b"sub", b"..v2")
    assert json.loads((tmp_path / "fusevol/audit-index/sub.json").read_text())["set_up"] == "t0"
    assert IndexWriter.listed(tmp_path) == [b"sub"]
    writer.remove(b"sub")
    assert reader.find(b"sub", b"..v2", "password") is None


# -- who a caller is -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cgroup", "found"),
    [
        ("0::/\n", None),
        (
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1f2e3d4c_aaaa_"
            "bbbb_cccc_0123456789ab.slice/cri-containerd-" + "a" * 64 + ".scope\n",
            ("a" * 64, "1f2e3d4c-aaaa-bbbb-cccc-0123456789ab", True),
        ),
        (
            "12:pids:/kubepods/burstable/pod1f2e3d4c-aaaa-bbbb-cccc-0123456789ab/"
            + "b" * 64
            + "\n0::/\n",
            ("b" * 64, "1f2e3d4c-aaaa-bbbb-cccc-0123456789ab", True),
        ),
        ("0::/default/reader-a\n", ("reader-a", None, False)),
        ("0::/system.slice/sshd.service\n", ("sshd.service", None, False)),
    ],
)
def test_a_container_is_read_from_its_cgroup(
    cgroup: str, found: tuple[str, str | None, bool] | None
) -> None:
    assert container_of(cgroup) == found


def fake_proc(tmp_path: Path, pid: int, *, cgroup: str) -> Path:
    """A /proc of one process, in a mount namespace of its own (neither PID 1's nor ours)."""
    proc = tmp_path / "proc"
    (proc / str(pid) / "ns").mkdir(parents=True)
    (proc / str(pid) / "status").write_text(f"Name:\tcat\nTgid:\t{pid - 1}\nPid:\t{pid}\n")
    (proc / str(pid) / "comm").write_text("cat\n")
    (proc / str(pid) / "cgroup").write_text(cgroup)
    (proc / str(pid) / "ns" / "mnt").mkdir()
    (proc / str(pid) / "exe").symlink_to("/bin/cat")
    return proc


def test_a_callers_container_is_named_by_its_bundle(tmp_path: Path) -> None:
    state = tmp_path / "state"
    bundle = state / "io.containerd.runtime.v2.task" / "k8s.io" / ("c" * 64)
    bundle.mkdir(parents=True)
    prefix = "io.kubernetes.cri."
    annotations = {"container-name": "web", "sandbox-name": "app", "sandbox-namespace": "ns"}
    annotations["sandbox-uid"] = "u-1"
    spec = {"annotations": {prefix + k: v for k, v in annotations.items()}}
    (bundle / "config.json").write_text(json.dumps(spec))
    proc = fake_proc(tmp_path, 41, cgroup="0::/kubepods/pod-x/" + "c" * 64 + "\n")
    reader = Callers(state, proc=str(proc)).describe(41, 1000, 2000)
    assert reader == {
        "where": "container",
        "pid": 40,
        "uid": 1000,
        "gid": 2000,
        "command": "cat",
        "executable": "/bin/cat",
        "container": {"id": "c" * 64, "name": "web"},
        "pod": {"namespace": "ns", "name": "app", "uid": "u-1"},
    }


def test_a_caller_the_server_cannot_see_is_recorded_with_what_is_known(tmp_path: Path) -> None:
    assert Callers(None, proc=str(tmp_path)).describe(0, 1000, 1000) == {
        "where": "unknown",
        "pid": 0,
        "uid": 1000,
        "gid": 1000,
    }
    proc = fake_proc(tmp_path, 9, cgroup="0::/user.slice\n")
    assert Callers(None, proc=str(proc)).describe(9, 0, 0)["where"] == "unknown"


def test_a_record_names_and_never_holds_content() -> None:
    received = datetime.datetime(2026, 11, 29, 16, 0, 0, 123456, tzinfo=datetime.UTC)
    event = record(
        reader={"where": "host", "pid": 1, "uid": 0, "gid": 0},
        found=None,
        version="..v1",
        path="password",
        received=received,
    )
    assert event["requestReceivedTimestamp"] == "2026-11-29T16:00:00.123456Z"
    assert event["objectRef"] is None
    assert event["volume"] == {"name": None, "plugin": None, "path": "password", "version": "..v1"}


def test_index_files_of_a_connection_not_taken_over_are_removed(tmp_path: Path) -> None:
    writer = IndexWriter(tmp_path, node_name="n1")
    facts = VolumeFacts("ns", "app", "u-1", "creds", "secret")
    for subtree in (b"held", b"gone"):
        writer.prepare(subtree, facts, {}, "t0")
    Auditing(root=tmp_path, node_name="n1", exists=lambda subtree: subtree == b"held")
    assert IndexWriter.listed(tmp_path) == [b"held"]
