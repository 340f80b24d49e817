"""Seeded generators of bad manifests for `parse_manifest` (hypothesis is not installed).

Three generators, each a pure function of a `random.Random`:
- `random_bytes`: arbitrary bytes, biased towards YAML/JSON punctuation, UTF-8 and NUL;
- `mutated_manifest`: a valid manifest (every kind and volume type fusevol reads) with a random
  field replaced, deleted or added, dumped as YAML or JSON;
- `token_soup`: YAML built from tokens that reach the constructor's corners (tags, anchors,
  aliases, merge keys, directives, flow and block collections).
A failure is reproducible from its seed alone.
"""

from __future__ import annotations

import copy
import json
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    import random

_CONFIGMAP: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "app", "namespace": "default", "resourceVersion": "7"},
    "data": {"a": "1", "b.conf": "x=y\n"},
    "binaryData": {"bin": "AAEC"},
    "immutable": False,
}
_SECRET: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Secret",
    "metadata": {"name": "creds"},
    "type": "Opaque",
    "data": {"token": "dDBrZW4="},
    "stringData": {"user": "me"},
}
_POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "web",
        "namespace": "default",
        "uid": "11111111-2222-4333-8444-555555555555",
        "labels": {"app": "web"},
        "annotations": {"a.example.com/b": "c"},
    },
    "spec": {
        "nodeName": "test-node",
        "securityContext": {"fsGroup": 2000, "runAsUser": 1000},
        "containers": [
            {
                "name": "c",
                "volumeMounts": [
                    {"name": "config", "mountPath": "/etc/config", "readOnly": True},
                    {"name": "cache", "mountPath": "/etc/config/cache", "subPath": "x"},
                ],
                "resources": {"limits": {"cpu": "500m", "memory": "1Gi"}, "requests": {"cpu": 1}},
                "securityContext": {"runAsUser": 1001},
            }
        ],
        "initContainers": [{"name": "init"}],
        "volumes": [
            {
                "name": "config",
                "configMap": {
                    "name": "app",
                    "items": [{"key": "a", "path": "dir/a", "mode": 0o600}],
                    "defaultMode": 0o644,
                    "optional": True,
                },
            },
            {"name": "creds", "secret": {"secretName": "creds", "defaultMode": 0o400}},
            {
                "name": "info",
                "downwardAPI": {
                    "items": [
                        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                        {
                            "path": "anno",
                            "fieldRef": {"fieldPath": "metadata.annotations['a.example.com/b']"},
                        },
                        {
                            "path": "cpu",
                            "resourceFieldRef": {
                                "containerName": "c",
                                "resource": "limits.cpu",
                                "divisor": "1m",
                            },
                        },
                    ]
                },
            },
            {
                "name": "all",
                "projected": {
                    "defaultMode": 0o440,
                    "sources": [
                        {"configMap": {"name": "app", "items": [{"key": "a", "path": "p/a"}]}},
                        {"secret": {"name": "creds"}},
                        {
                            "downwardAPI": {
                                "items": [{"path": "n", "fieldRef": {"fieldPath": "metadata.name"}}]
                            }
                        },
                        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
                    ],
                },
            },
            {"name": "share", "nfs": {"server": "10.0.0.1", "path": "/export", "readOnly": True}},
            {"name": "host", "hostPath": {"path": "/var/log", "type": "Directory"}},
            {"name": "cache", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
            {"name": "claim", "persistentVolumeClaim": {"claimName": "data", "readOnly": False}},
            {"name": "repo", "gitRepo": {"repository": "x"}},
        ],
    },
}
_PV: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "PersistentVolume",
    "metadata": {"name": "pv1", "annotations": {"volume.beta.kubernetes.io/mount-options": "hard"}},
    "spec": {
        "capacity": {"storage": "1Gi"},
        "local": {"path": "/mnt/disk"},
        "claimRef": {"namespace": "default", "name": "data"},
        "mountOptions": ["ro"],
        "storageClassName": "local",
    },
}
_PVC: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "PersistentVolumeClaim",
    "metadata": {"name": "data"},
    "spec": {"volumeName": "pv1", "storageClassName": "local"},
}
_LIST: dict[str, Any] = {"apiVersion": "v1", "kind": "List", "items": [_CONFIGMAP, _PVC]}
TEMPLATES: tuple[dict[str, Any], ...] = (_CONFIGMAP, _SECRET, _POD, _PV, _PVC, _LIST)

_STRINGS = (
    "",
    "a",
    ".",
    "..",
    "..data",
    "..data_tmp",
    "../x",
    "a/../../x",
    "/abs",
    "a/b",
    "a//b",
    "./a",
    "x" * 256,
    "/".join(["y" * 255] * 17),
    "a\x00b",
    "\t",
    "é",
    "\u2028",
    "0777",
    "-1",
    "1Gi",
    "1i",
    "Ki",
    "e3",
    "500m",
    "1e400",
    "metadata.name",
    "metadata.labels['x']",
    "metadata.annotations['']",
    "spec.nodeName",
    "limits.cpu",
    "requests.hugepages-2Mi",
    "List",
    "ConfigMap",
    "Secret",
    "Pod",
    "PersistentVolume",
    "v1",
    "v2",
    "Memory",
    "DirectoryOrCreate",
    "!!binary",
    "true",
    "null",
    "~",
    "2024-13-01",
    "AAEC",
    "not base64!",
    "====",
)


def _random_scalar(rng: random.Random) -> Any:
    choice = rng.randrange(9)
    if choice == 0:
        return None
    if choice == 1:
        return rng.choice([True, False])
    if choice == 2:
        return rng.choice([0, 1, -1, 0o777, 0o1000, 2**31, 2**63, 10**30, -(10**30)])
    if choice == 3:
        return rng.choice([0.5, -0.0, 1e308, float("inf"), float("-inf"), float("nan")])
    if choice == 4:
        return rng.randrange(-10, 5000)
    return rng.choice(_STRINGS)


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(10) if depth < 3 else 0
    if kind <= 5:
        return _random_scalar(rng)
    if kind <= 7:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys: list[Any] = [
        rng.choice(
            [
                *_STRINGS,
                "name",
                "key",
                "path",
                "mode",
                "items",
                "kind",
                "data",
                "configMap",
                "secret",
                "fieldRef",
                "volumes",
                0,
                1,
                None,
                True,
                1.5,
            ]
        )
        for _ in range(rng.randrange(4))
    ]
    return {k: random_value(rng, depth + 1) for k in keys}


def _containers(node: Any) -> list[Any]:
    """Every dict and list inside `node`, `node` included."""
    found: list[Any] = []
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            found.append(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            found.append(item)
            stack.extend(item)
    return found


def mutated_document(rng: random.Random) -> dict[str, Any]:
    document = copy.deepcopy(rng.choice(TEMPLATES))
    for _ in range(rng.randrange(1, 4)):
        target = rng.choice(_containers(document))
        if isinstance(target, dict):
            action = rng.randrange(3)
            if target and action == 0:
                del target[rng.choice(list(target))]
            elif target and action == 1:
                target[rng.choice(list(target))] = random_value(rng)
            else:
                target[rng.choice([*_STRINGS, "kind", "type", 7, None])] = random_value(rng)
        elif target:
            index = rng.randrange(len(target))
            if rng.randrange(2):
                target[index] = random_value(rng)
            else:
                target.append(copy.deepcopy(target[index]))  # duplicates: names, item paths
        else:
            target.append(random_value(rng))
    return document


def has_only_string_keys(node: Any) -> bool:
    return all(
        all(isinstance(key, str) for key in item)
        for item in _containers(node)
        if isinstance(item, dict)
    )


def mutated_manifest(rng: random.Random) -> tuple[str, bytes]:
    """(file name, content): a mutated valid manifest as JSON, YAML, or a multi-document YAML."""
    document = mutated_document(rng)
    form = rng.randrange(3)
    if form == 0:
        return "m.json", json.dumps(document).encode()
    documents = [document] if form == 1 else [document, mutated_document(rng), None]
    try:
        text = yaml.safe_dump_all(documents, default_flow_style=rng.choice([None, True, False]))
    except yaml.YAMLError:  # a lone surrogate or similar cannot be dumped: take JSON
        return "m.json", json.dumps(document).encode()
    return "m.yaml", text.encode("utf-8", "surrogatepass")


_TOKENS = (
    "kind: ",
    "ConfigMap",
    "Secret",
    "Pod",
    "List",
    "PersistentVolume",
    "apiVersion: v1",
    "metadata: ",
    "name: x",
    "data: ",
    "stringData: ",
    "binaryData: ",
    "items: ",
    "spec: ",
    "volumes: ",
    "- ",
    "? ",
    ": ",
    "\n",
    "\n  ",
    "\n    ",
    "{",
    "}",
    "[",
    "]",
    ", ",
    "'",
    '"',
    "#",
    "---\n",
    "...\n",
    "%YAML 1.1\n",
    "%TAG ! tag:example.com,2000:\n",
    "&a ",
    "*a",
    "&b ",
    "*b",
    "<<: ",
    "!!int ",
    "!!float ",
    "!!bool ",
    "!!null ",
    "!!timestamp ",
    "!!binary ",
    "!!str ",
    "!!set ",
    "!!omap ",
    "!!pairs ",
    "!!seq ",
    "!!map ",
    "!!merge ",
    "!local ",
    "!<tag:yaml.org,2002:int> ",
    "|\n  ",
    ">-\n  ",
    "0o777",
    "0x1F",
    "1_000",
    "1:20",
    "1e3",
    ".inf",
    ".nan",
    "2001-12-14t21:59:43.10-05:00",
    "2001-12-14",
    "yes",
    "~",
    "abc",
    "\\x00",
    "\t",
    "\x00",
    "\ufeff",
    "\u00e9",
)


def token_soup(rng: random.Random) -> tuple[str, bytes]:
    text = "".join(rng.choice(_TOKENS) for _ in range(rng.randrange(1, 30)))
    return "t.yaml", text.encode("utf-8", "surrogatepass")


_BYTES = b"{}[]:,-'\"\n \t#&*!?|>%@`\\0123456789abcdefkindConfigMapPodSecret\x00\xff\xc3\xa9"


def random_bytes(rng: random.Random) -> tuple[str, bytes]:
    size = rng.randrange(0, 80)
    if rng.randrange(2):
        data = bytes(rng.choice(_BYTES) for _ in range(size))
    else:
        data = rng.randbytes(size)
    return rng.choice(["r.yaml", "r.json", "r.yml"]), data


def corrupted_manifest(rng: random.Random) -> tuple[str, bytes]:
    """A mutated manifest with a few bytes flipped, cut or repeated."""
    name, data = mutated_manifest(rng)
    buffer = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        if not buffer:
            break
        at = rng.randrange(len(buffer))
        action = rng.randrange(4)
        if action == 0:
            buffer[at] = rng.choice(_BYTES)
        elif action == 1:
            del buffer[at : at + rng.randrange(1, 20)]
        elif action == 2:
            buffer[at:at] = rng.choice(_TOKENS).encode("utf-8", "surrogatepass")
        else:
            buffer[at:at] = buffer[at : at + rng.randrange(1, 40)]
    return name, bytes(buffer)
