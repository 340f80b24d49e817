"""Fixtures for tests that run the real agent: a manifest directory and a running agent on it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.agent import AgentProcess, running_agent

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

POD_UID = "11111111-2222-4333-8444-555555555555"

CONFIGMAP = """\
apiVersion: v1
kind: ConfigMap
metadata: {{name: app, namespace: default}}
data:
  a: "{a}"
  b: "{b}"
"""

SECRET = """\
apiVersion: v1
kind: Secret
metadata: {name: creds, namespace: default}
stringData:
  token: "t0ken"
"""

POD = """\
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default, uid: {uid}}}
spec:
  containers: [{{name: c}}]
  volumes:
    - name: config
      configMap: {{name: app}}
    - name: creds
      secret: {{secretName: creds, defaultMode: 0400}}
"""


def configmap(a: str = "1", b: str = "1") -> str:
    return CONFIGMAP.format(a=a, b=b)


def pod(name: str = "web", uid: str = POD_UID) -> str:
    return POD.format(name=name, uid=uid)


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    directory = tmp_path / "manifests"
    directory.mkdir()
    (directory / "configmap.yaml").write_text(configmap())
    (directory / "secret.yaml").write_text(SECRET)
    (directory / "pod.yaml").write_text(pod())
    return directory


@pytest.fixture
def agent(manifests: Path, tmp_path: Path) -> Iterator[AgentProcess]:
    """The agent serving `manifests`; the test ends with a clean tear-down (SIGINT, checked)."""
    with running_agent(manifests, tmp_path / "root") as running:
        running.wait_state(POD_UID, "config", "mounted")
        running.wait_state(POD_UID, "creds", "mounted")
        yield running
        running.stop()
