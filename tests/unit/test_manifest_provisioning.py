"""parse_manifest for gitRepo volumes, StorageClasses and the claim and PV fields provisioning
reads; the API server's messages for what it refuses."""

from __future__ import annotations

import pytest

from fusevol.base.errors import ManifestError
from fusevol.decode.manifest import parse_manifest
from fusevol.model import (
    GitRepoVolumeSource,
    LocalVolumeSource,
    PersistentVolume,
    PersistentVolumeClaim,
    Pod,
    ResourceVersion,
    StorageClass,
)
from tests.decoding import manifest_error

ORIGIN = "m.yaml"
NO_VERSION = ResourceVersion("")


def parse(text: str) -> object:
    (obj,) = parse_manifest(text.encode(), origin=ORIGIN)
    return obj


def git_pod(fields: str) -> str:
    volumes = f"[{{name: v, gitRepo: {fields}}}]"
    return f"kind: Pod\nmetadata: {{name: web}}\nspec:\n  volumes: {volumes}\n"


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ("{repository: 'https://x/y'}", GitRepoVolumeSource("https://x/y")),
        (
            "{repository: /srv/repo, revision: v1, directory: .}",
            GitRepoVolumeSource("/srv/repo", "v1", "."),
        ),
        ("{repository: r, directory: a/b}", GitRepoVolumeSource("r", "", "a/b")),
        ("{repository: '-x'}", GitRepoVolumeSource("-x")),  # kubelet refuses it, not the API
    ],
)
def test_git_repo(fields: str, expected: GitRepoVolumeSource) -> None:
    pod = parse(git_pod(fields))
    assert isinstance(pod, Pod)
    assert pod.volumes[0].source == expected


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ("{revision: v1}", "spec.volumes[0].gitRepo.repository: Required value"),
        (
            "{repository: r, directory: /abs}",
            'spec.volumes[0].gitRepo.directory: invalid value "/abs": must be a relative path',
        ),
        (
            "{repository: r, directory: a/../b}",
            "spec.volumes[0].gitRepo.directory: invalid value \"a/../b\": must not contain '..'",
        ),
    ],
)
def test_git_repo_errors(fields: str, error: str) -> None:
    assert manifest_error(git_pod(fields).encode(), origin=ORIGIN).endswith(error)


STORAGE_CLASS = """\
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: local}
provisioner: fusevol.io/hostpath
"""


def test_storage_class_defaults_and_fields() -> None:
    assert parse(STORAGE_CLASS) == StorageClass("local", NO_VERSION, "fusevol.io/hostpath")
    full = STORAGE_CLASS + (
        "reclaimPolicy: Retain\nvolumeBindingMode: WaitForFirstConsumer\n"
        "parameters: {basePath: /srv/volumes}\n"
    )
    assert parse(full) == StorageClass(
        "local",
        NO_VERSION,
        "fusevol.io/hostpath",
        parameters={"basePath": "/srv/volumes"},
        reclaim_policy="Retain",
        volume_binding_mode="WaitForFirstConsumer",
    )


def test_storage_class_of_another_api_version_is_skipped() -> None:
    text = STORAGE_CLASS.replace("storage.k8s.io/v1", "v1")
    assert parse_manifest(text.encode(), origin=ORIGIN) == []


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ("reclaimPolicy: Recycle\n", 'reclaimPolicy: unsupported value "Recycle"'),
        ("volumeBindingMode: Later\n", 'volumeBindingMode: unsupported value "Later"'),
    ],
)
def test_storage_class_errors(extra: str, error: str) -> None:
    with pytest.raises(ManifestError, match=error):
        parse(STORAGE_CLASS + extra)
    with pytest.raises(ManifestError, match="provisioner: Required value"):
        parse(STORAGE_CLASS.replace("provisioner: fusevol.io/hostpath\n", ""))


def test_claim_fields() -> None:
    claim = parse(
        "kind: PersistentVolumeClaim\n"
        "metadata: {name: data, uid: c1a10000-0000-4000-8000-000000000001,\n"
        "  annotations: {volume.kubernetes.io/selected-node: n}}\n"
        "spec: {storageClassName: local, resources: {requests: {storage: 5Gi}}}\n"
    )
    assert claim == PersistentVolumeClaim(
        "default",
        "data",
        NO_VERSION,
        storage_class_name="local",
        uid="c1a10000-0000-4000-8000-000000000001",
        storage_request="5Gi",
        annotations={"volume.kubernetes.io/selected-node": "n"},
    )


def test_persistent_volume_fields() -> None:
    pv = parse("""\
kind: PersistentVolume
metadata: {name: pv-1}
spec:
  capacity: {storage: 1Gi}
  persistentVolumeReclaimPolicy: Retain
  local: {path: /srv/pv-1}
  claimRef: {namespace: ns, name: data, uid: u-1}
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions:
            - {key: kubernetes.io/hostname, operator: In, values: [node-a, node-b]}
            - {key: zone, operator: In, values: [z]}
""")
    assert pv == PersistentVolume(
        "pv-1",
        NO_VERSION,
        LocalVolumeSource("/srv/pv-1"),
        claim_ref=("ns", "data"),
        claim_uid="u-1",
        reclaim_policy="Retain",
        capacity="1Gi",
        node_names=("node-a", "node-b"),
    )
