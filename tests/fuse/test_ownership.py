"""fsGroup ownership, downwardAPI and projected volumes through the mount, against kubelet's."""

from __future__ import annotations

import errno
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from fusevol.model import FileProjection
from tests import kubelet_reference
from tests.agent import AgentProcess, running_agent, wait_for, write_atomically

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.inotify import Watcher

FS_GROUP = 2000
UID = {
    "plain": "aaaaaaaa-0000-4000-8000-000000000001",
    "grouped": "aaaaaaaa-0000-4000-8000-000000000002",
}

OBJECTS = """
kind: ConfigMap
metadata: {name: app}
data: {app.conf: "x=1", mode400: "private"}
---
kind: Secret
metadata: {name: creds}
stringData: {token: t0ken}
---
"""

VOLUMES = """
  volumes:
    - name: config
      configMap:
        name: app
        items: [{key: app.conf, path: app.conf}, {key: mode400, path: nested/private, mode: 0400}]
    - name: creds
      secret: {secretName: creds, defaultMode: 0600}
    - name: info
      downwardAPI:
        items:
          - {path: labels, fieldRef: {fieldPath: metadata.labels}}
          - {path: name, fieldRef: {fieldPath: metadata.name}, mode: 0400}
          - {path: mem, resourceFieldRef: {containerName: c, resource: limits.memory, divisor: 1Mi}}
    - name: all-in-one
      projected:
        defaultMode: 0440
        sources:
          - configMap: {name: app, items: [{key: app.conf, path: config/app.conf}]}
          - secret: {name: creds}
          - downwardAPI:
              items: [{path: meta/namespace, fieldRef: {fieldPath: metadata.namespace}}]
"""


def pod(kind: str, labels: str = "{app: web, tier: front}") -> str:
    security = (
        f"\n  securityContext: {{fsGroup: {FS_GROUP}, runAsUser: 1000}}"
        if kind == "grouped"
        else ""
    )
    return f"""
kind: Pod
metadata: {{name: {kind}, uid: {UID[kind]}, labels: {labels}}}
spec:{security}
  containers: [{{name: c, resources: {{limits: {{memory: 64Mi}}}}}}]
{VOLUMES}
---
"""


# What kubelet builds for each volume (payload rules are tested byte for byte in tests/unit).
EXPECTED: dict[tuple[str, str], dict[str, tuple[bytes | None, int]]] = {
    ("configmap", "config"): {"app.conf": (b"x=1", 0o644), "nested/private": (b"private", 0o400)},
    ("secret", "creds"): {"token": (b"t0ken", 0o600)},
    ("downward-api", "info"): {
        "labels": (b'app="web"\ntier="front"', 0o644),
        "name": (None, 0o400),
        "mem": (b"64", 0o644),
    },
    ("projected", "all-in-one"): {
        "config/app.conf": (b"x=1", 0o440),
        "token": (b"t0ken", 0o440),
        "meta/namespace": (b"default", 0o440),
    },
}
ROOT_MODES = {"configmap": 0o777, "secret": 0o1777, "downward-api": 0o1777, "projected": 0o1777}


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    base = tmp_path_factory.mktemp("ownership")
    manifests = base / "manifests"
    manifests.mkdir()
    (manifests / "objects.yaml").write_text(OBJECTS)
    (manifests / "plain.yaml").write_text(pod("plain"))
    (manifests / "grouped.yaml").write_text(pod("grouped"))
    with running_agent(manifests, base / "root") as running:
        for uid in UID.values():
            for _, name in EXPECTED:
                running.wait_state(uid, name, "mounted")
        yield running
        running.stop()


@pytest.fixture(scope="module")
def reference_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("reference")
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(path)], check=True)
    yield path
    subprocess.run(["umount", str(path)], check=True)


@pytest.mark.parametrize("kind", ["plain", "grouped"])
@pytest.mark.parametrize(("plugin", "name"), list(EXPECTED), ids=[n for _, n in EXPECTED])
def test_modes_and_owners_match_kubelet(
    agent: AgentProcess, reference_dir: Path, kind: str, plugin: str, name: str
) -> None:
    served = agent.volume(UID[kind], plugin, name)
    expected = reference_dir / f"{kind}-{name}"
    expected.mkdir()
    expected.chmod(ROOT_MODES[plugin])
    payload = {
        path: FileProjection(kind.encode() if data is None else data, mode)
        for path, (data, mode) in EXPECTED[(plugin, name)].items()
    }
    fs_group = FS_GROUP if kind == "grouped" else None
    kubelet_reference.write(expected, payload, fs_group=fs_group)

    assert kubelet_reference.snapshot(served) == kubelet_reference.snapshot(expected)


def test_projected_volume_has_one_data_link(agent: AgentProcess) -> None:
    volume = agent.volume(UID["plain"], "projected", "all-in-one")
    versions = [p.name for p in volume.iterdir() if p.name.startswith("..") and p.name != "..data"]
    assert len(versions) == 1
    assert (volume / "..data").readlink().name == versions[0]
    assert sorted(p.name for p in volume.iterdir() if not p.name.startswith("..")) == [
        "config",
        "meta",
        "token",
    ]


AS_USER = """
import os, sys
directory = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
os.setgroups([int(g) for g in sys.argv[3].split(",") if g]); os.setgid(1000); os.setuid(1000)
try:
    os.close(os.open(sys.argv[2], os.O_RDONLY, dir_fd=directory))
except OSError as exc:
    print(exc.errno)
else:
    print(0)
"""


@pytest.mark.parametrize(
    ("groups", "expected"),
    [
        pytest.param(str(FS_GROUP), 0, id="in-fsgroup"),
        pytest.param("", errno.EACCES, id="outsider"),
    ],
)
def test_fs_group_members_read_and_outsiders_do_not(
    agent: AgentProcess, groups: str, expected: int
) -> None:
    volume = agent.volume(UID["grouped"], "configmap", "config")
    result = subprocess.run(
        [sys.executable, "-c", AS_USER, str(volume), "nested/private", groups],
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(result.stdout) == expected


def test_label_edit_updates_downward_files_atomically(
    agent: AgentProcess, watch: Callable[[Path], Watcher]
) -> None:
    volume = agent.volume(UID["plain"], "downward-api", "info")
    watcher = watch(volume)
    write_atomically(agent.manifests / "plain.yaml", pod("plain", labels="{app: web, tier: back}"))
    wait_for(lambda: (volume / "labels").read_bytes() == b'app="web"\ntier="back"')
    events = watcher.events_until("MOVED_TO ..data")
    assert "CREATE ..data_tmp" in events
    assert "MOVED_TO ..data" in events
    projected = agent.volume(UID["plain"], "projected", "all-in-one")
    assert (projected / "meta" / "namespace").read_text() == "default"
