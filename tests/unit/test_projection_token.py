"""serviceAccountToken in a projected volume: the token file and kubelet's mode and owner rules.

docs/kubelet.md facts 3, 5 and kubelet's e2e ("should set ownership and permission when RunAsUser or
FsGroup is present"): neither -> 0644 root; runAsUser=1000 -> 0600 owned by 1000; fsGroup -> 0600,
which the fsGroup walk turns into 0640; both -> 0640 owned by 1000.
"""

from __future__ import annotations

import pytest

from fusevol.base.errors import VolumeSetupError
from fusevol.model import (
    Container,
    Pod,
    PodUID,
    ProjectedVolumeSource,
    ResourceVersion,
    ServiceAccountTokenProjection,
)
from fusevol.projection import ownership, projected
from fusevol.projection.downward import NodeAllocatable

TOKEN = ServiceAccountTokenProjection(path="./sa/token", audience="vault")
SOURCE = ProjectedVolumeSource(sources=(TOKEN,))
ALLOCATABLE = NodeAllocatable(cpu_millis=1000, memory_bytes=2**30, ephemeral_storage_bytes=2**30)


def pod(*users: int | None, fs_group: int | None = None, pod_user: int | None = None) -> Pod:
    return Pod(
        uid=PodUID("u"),
        namespace="default",
        name="web",
        resource_version=ResourceVersion("1"),
        containers=tuple(Container(f"c{i}", run_as_user=u) for i, u in enumerate(users)),
        fs_group=fs_group,
        run_as_user=pod_user,
        service_account_name="robot",
    )


def render(p: Pod, token: bytes | None = b"t0ken") -> tuple[bytes, int, int | None]:
    payload = projected.make_payload(
        SOURCE,
        p,
        get_configmap=lambda _: None,
        get_secret=lambda _: None,
        allocatable=ALLOCATABLE,
        get_token=lambda projection: token if projection == TOKEN else None,
    )
    file = ownership.apply_fs_group(payload, p.fs_group)["sa/token"]
    return file.data, file.mode, file.fs_user


@pytest.mark.parametrize(
    ("p", "mode", "owner"),
    [
        pytest.param(pod(None), 0o644, None, id="neither"),
        pytest.param(pod(1000), 0o600, 1000, id="runAsUser"),
        pytest.param(pod(None, fs_group=10000), 0o640, None, id="fsGroup"),
        pytest.param(pod(1000, fs_group=10000), 0o640, 1000, id="both"),
        pytest.param(pod(None, None, pod_user=7), 0o600, 7, id="pod-level-runAsUser"),
        pytest.param(pod(1000, 1001), 0o644, None, id="containers-differ"),
        pytest.param(pod(1000, None), 0o644, None, id="one-container-without"),
    ],
)
def test_token_file_mode_and_owner(p: Pod, mode: int, owner: int | None) -> None:
    assert render(p) == (b"t0ken", mode, owner)


def test_no_token_is_a_setup_error_naming_the_service_account() -> None:
    with pytest.raises(
        VolumeSetupError, match=r"'./sa/token': no token for service account \"robot\""
    ):
        render(pod(None), token=None)
