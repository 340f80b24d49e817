"""`fusevol wait` before a container starts, for a runtime without kubelet: a pod whose ConfigMap
is missing times out naming the volume and its error, kubelet-style; a second wait returns as soon
as the ConfigMap appears, and the container then started with `fusevol mounts` reads it."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import pytest

from tests.agent import AgentProcess, running_agent, write_atomically
from tests.containerd.runtime import Containerd, needs_containerd

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

pytestmark = [needs_containerd, pytest.mark.containerd]

UID = "dddddddd-0000-4000-8000-000000000019"
POD = f"""\
apiVersion: v1
kind: Pod
metadata: {{name: late, namespace: default, uid: {UID}}}
spec:
  containers:
    - name: app
      volumeMounts:
        - {{name: settings, mountPath: /etc/settings}}
        - {{name: settings, mountPath: /etc/level, subPath: level}}
  volumes:
    - {{name: settings, configMap: {{name: late-settings}}}}
"""
CONFIGMAP = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: late-settings, namespace: default}
data: {level: debug}
"""


def fusevol(*args: str) -> list[str]:
    return [sys.executable, "-m", "fusevol", *args]


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "pod.yaml").write_text(POD)
    with running_agent(manifests, tmp_path / "root") as running:
        yield running


def test_wait_names_the_missing_volume_then_returns_once_the_configmap_appears(
    containerd: Containerd, rootfs: Path, agent: AgentProcess, report: Callable[[str], None]
) -> None:
    agent.expect_log('mount failed .*configmap "late-settings" not found')
    root = str(agent.root)
    timed_out = subprocess.run(
        fusevol("wait", "--root", root, "default/late", "--timeout", "2s"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert timed_out.returncode == 1
    lines = timed_out.stderr.splitlines()
    assert lines[0] == (
        "fusevol: pod default/late: timed out after 2s waiting for its volumes: "
        "unmounted volumes=[settings]"
    ), timed_out.stderr
    assert lines[1].startswith("  volume 'settings': failed: "), lines
    assert 'configmap "late-settings" not found' in lines[1], lines
    # `mounts` says the same for the container.
    refused = subprocess.run(
        fusevol("mounts", "--root", root, "default/late", "--container", "app"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert refused.returncode == 1
    assert refused.stderr.startswith(
        "fusevol: pod default/late: container 'app' volumeMount 0 (settings at /etc/settings): "
        "volume 'settings' not ready (failed)"
    ), refused.stderr

    waiting = subprocess.Popen(
        fusevol("wait", "--root", root, UID, "--timeout", "60s"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.0)
        assert waiting.poll() is None  # still waiting
        written = time.monotonic()
        write_atomically(agent.manifests / "settings.yaml", CONFIGMAP)
        assert waiting.wait(timeout=30) == 0, waiting.communicate()
        returned = time.monotonic() - written
    finally:
        if waiting.poll() is None:
            waiting.kill()
        waiting.communicate()
    assert returned < 2.0, returned
    report(f"fusevol wait returned {returned * 1000:.0f} ms after the ConfigMap was written")

    mounts = subprocess.run(
        fusevol("mounts", "--root", root, "default/late", "--container", "app"),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    values = shlex.split(mounts)[1::2]
    # The same as the OCI runtime spec's mounts, and as JSON naming the pod.
    settings = agent.volume(UID, "configmap", "settings")
    view = agent.root / "pods" / UID / "volume-subpaths" / "settings" / "app" / "1"
    oci = json.loads(
        subprocess.run(
            fusevol("mounts", "--root", root, UID, "--container", "app", "--format", "oci"),
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    )
    assert oci == [
        {
            "destination": "/etc/settings",
            "type": "bind",
            "source": str(settings),
            "options": ["rbind", "ro", "rslave"],
        },
        {
            "destination": "/etc/level",
            "type": "bind",
            "source": str(view),
            "options": ["rbind", "ro", "rslave"],
        },
    ]
    described = json.loads(
        subprocess.run(
            fusevol(
                "mounts", "--root", root, "default/late", "--container", "app", "--format", "json"
            ),
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    )
    assert (described["pod"], described["uid"], described["container"]) == (
        "default/late",
        UID,
        "app",
    )
    assert [m["source"] for m in described["mounts"]] == [str(settings), str(view)]
    name = containerd.run("late", rootfs, *values, command=("sleep", "600"))
    try:
        for path in ("/etc/settings/level", "/etc/level"):
            result = containerd.exec(name, "cat", path, user=1000)
            assert result.stdout == "debug", (path, result)
    finally:
        containerd.remove(name)
    agent.stop()
