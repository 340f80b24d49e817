"""The one pod most agent tests serve: a ConfigMap and a Secret in two volumes of pod `default/web`.

`write_pod_set(directory)` saves it as three manifest files (`configmap.yaml`, `secret.yaml`,
`pod.yaml`); a test edits the ConfigMap by saving `configmap(a=...)` over `configmap.yaml`.
`FILES` is what the two volumes serve, for tests that compare every byte.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

POD_UID = "11111111-2222-4333-8444-555555555555"

_CONFIGMAP = """\
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

_POD = """\
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

FILES = {
    ("configmap", "config"): {"a": b"alpha", "b": b"beta"},
    ("secret", "creds"): {"token": b"t0ken"},
}
"""(plugin, volume) -> top-level name -> bytes, as `write_pod_set` serves them."""
PINNED = sum(1 + 2 * len(keys) for keys in FILES.values())
"""The names of `FILES` the agent's pin holder keeps (docs/fuse.md fact 17): each volume's
`..data`, and each key's link and file."""


def configmap(a: str = "alpha", b: str = "beta") -> str:
    return _CONFIGMAP.format(a=a, b=b)


def pod(name: str = "web", uid: str = POD_UID) -> str:
    return _POD.format(name=name, uid=uid)


def write_pod_set(directory: Path) -> None:
    (directory / "configmap.yaml").write_text(configmap())
    (directory / "secret.yaml").write_text(SECRET)
    (directory / "pod.yaml").write_text(pod())
