"""The layout fusevol serves is kubelet's, entry for entry.

One agent serves a pod per case; each pod volume is compared with what kubelet's AtomicWriter
(tests/kubelet_reference.py) writes for the payload kubelet would build: names, file types,
modes, owners, symlink targets and contents, the version directory's name aside.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from fusevol.model import FileProjection
from tests import kubelet_reference
from tests.agent import AgentProcess, running_agent

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@dataclass(frozen=True)
class Case:
    id: str
    kind: str  # "configmap" or "secret"
    volume: dict[str, Any]
    expected: dict[str, tuple[bytes, int]]
    """The payload kubelet builds: path -> (content, mode)."""
    data: dict[str, str] | None = field(default_factory=dict)
    """The object's data (None: no such object); binaryData/secret data as raw bytes below."""
    binary: dict[str, bytes] = field(default_factory=dict)


CASES = [
    Case(
        "all-keys-default-mode",
        "configmap",
        {},
        {"a": (b"1", 0o644), "b.conf": (b"x=y\n", 0o644)},
        {"a": "1", "b.conf": "x=y\n"},
    ),
    Case(
        "items-nested-paths-and-modes",
        "configmap",
        {
            "items": [
                {"key": "a", "path": "deep/er/a.txt", "mode": 0o600},
                {"key": "b", "path": "b"},
                {"key": "a", "path": "deep/again"},
            ]
        },
        {"deep/er/a.txt": (b"1", 0o600), "b": (b"2", 0o644), "deep/again": (b"1", 0o644)},
        {"a": "1", "b": "2", "unlisted": "3"},
    ),
    Case(
        "binary-data",
        "configmap",
        {"defaultMode": 0o440},
        {"text": (b"t", 0o440), "blob": (b"\x00\xff\x10", 0o440)},
        {"text": "t"},
        {"blob": b"\x00\xff\x10"},
    ),
    Case(
        "dotfiles",
        "configmap",
        {},
        {".hidden": (b"h", 0o644), "visible": (b"v", 0o644)},
        {".hidden": "h", "visible": "v"},
    ),
    Case("optional-missing-object", "configmap", {"optional": True}, {}, None),
    Case(
        "optional-missing-key",
        "configmap",
        {"optional": True, "items": [{"key": "absent", "path": "x"}, {"key": "a", "path": "a"}]},
        {"a": (b"1", 0o644)},
        {"a": "1"},
    ),
    Case(
        "secret-default",
        "secret",
        {},
        {"username": (b"admin", 0o644), "password": (b"p\x00ss", 0o644)},
        {},
        {"username": b"admin", "password": b"p\x00ss"},
    ),
    Case(
        "secret-items-and-mode",
        "secret",
        {
            "defaultMode": 0o400,
            "items": [{"key": "tls.key", "path": "keys/tls.key", "mode": 0o600}],
        },
        {"keys/tls.key": (b"KEY", 0o600)},
        {},
        {"tls.key": b"KEY", "other": b"not projected"},
    ),
    Case("secret-optional-missing", "secret", {"optional": True}, {}, None),
]


_VOLUME_KEY = {"configmap": "configMap", "secret": "secret"}


def _uid(case: Case) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, case.id))


def _manifests(case: Case) -> list[dict[str, Any]]:
    name = f"obj-{case.id}"
    docs: list[dict[str, Any]] = []
    if case.data is not None:
        obj: dict[str, Any] = {"kind": "ConfigMap" if case.kind == "configmap" else "Secret"}
        obj["metadata"] = {"name": name, "namespace": "default"}
        if case.kind == "configmap":
            obj["data"] = case.data
            obj["binaryData"] = {k: base64.b64encode(v).decode() for k, v in case.binary.items()}
        else:
            obj["data"] = {k: base64.b64encode(v).decode() for k, v in case.binary.items()}
        docs.append(obj)
    source = {"name": name} if case.kind == "configmap" else {"secretName": name}
    docs.append(
        {
            "kind": "Pod",
            "metadata": {"name": case.id, "namespace": "default", "uid": _uid(case)},
            "spec": {
                "containers": [{"name": "c"}],
                "volumes": [{"name": "vol", _VOLUME_KEY[case.kind]: {**source, **case.volume}}],
            },
        }
    )
    return docs


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    base = tmp_path_factory.mktemp("layout")
    manifests = base / "manifests"
    manifests.mkdir()
    for case in CASES:
        (manifests / f"{case.id}.json").write_text(
            json.dumps({"kind": "List", "items": _manifests(case)})
        )
    with running_agent(manifests, base / "root") as running:
        yield running
        running.stop()


@pytest.fixture(scope="module")
def reference_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("reference")
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_volume_matches_kubelet(case: Case, agent: AgentProcess, reference_dir: Path) -> None:
    served = agent.wait_mounted(agent.volume(_uid(case), case.kind, "vol"))

    expected_dir = reference_dir / case.id
    expected_dir.mkdir()
    expected_dir.chmod(0o777 if case.kind == "configmap" else 0o1777)
    payload = {p: FileProjection(data, mode) for p, (data, mode) in case.expected.items()}
    kubelet_reference.write(expected_dir, payload)

    assert kubelet_reference.snapshot(served) == kubelet_reference.snapshot(expected_dir)


def test_version_directory_name_is_kubelets(agent: AgentProcess) -> None:
    case = CASES[0]
    served = agent.wait_mounted(agent.volume(_uid(case), case.kind, "vol"))
    target = (served / "..data").readlink()
    assert re.fullmatch(r"\.\.\d{4}_\d\d_\d\d_\d\d_\d\d_\d\d\.\d+", str(target)), target
