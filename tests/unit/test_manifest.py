"""parse_manifest: conversion to model types and every validation error, table-driven."""

from __future__ import annotations

import base64
import json
import logging
import uuid
from typing import Any

import pytest
import yaml

from fusevol.base.errors import ManifestError
from fusevol.decode.manifest import parse_manifest
from fusevol.model import (
    ConfigMap,
    ConfigMapProjection,
    ConfigMapVolumeSource,
    Container,
    DownwardAPIProjection,
    DownwardAPIVolumeFile,
    DownwardAPIVolumeSource,
    EmptyDirVolumeSource,
    InvalidVolumeSource,
    KeyToPath,
    NFSVolumeSource,
    ObjectFieldSelector,
    Pod,
    PodUID,
    ProjectedVolumeSource,
    ResourceFieldSelector,
    ResourceRequirements,
    ResourceVersion,
    Secret,
    SecretProjection,
    SecretVolumeSource,
    ServiceAccountTokenProjection,
    UnsupportedVolumeSource,
    Volume,
    VolumeMount,
    VolumeName,
)
from tests.decoding import manifest_error

ORIGIN = "examples/app.yaml"
NO_VERSION = ResourceVersion("")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def config_map(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app"}, **fields}


def secret(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "app"}, **fields}


def pod(*volumes: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web"},
        "spec": {"volumes": list(volumes), **spec},
    }


def to_yaml(*documents: Any) -> bytes:
    return yaml.safe_dump_all(documents).encode()


def derived_uid(namespace: str, name: str) -> PodUID:
    return PodUID(str(uuid.uuid5(uuid.NAMESPACE_URL, f"fusevol:{namespace}/{name}")))


# -- conversions -----------------------------------------------------------------------------------

FULL_POD = b"""\
apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: shop
  uid: 0b7a6c1e-0000-4000-8000-000000000001
  resourceVersion: "17"
  labels: {app: web}
  annotations: {note: hi}
spec:
  nodeName: node-1
  securityContext: {fsGroup: 2000, runAsUser: 1000}
  initContainers:
  - name: init
  containers:
  - name: main
    securityContext: {runAsUser: 33}
    volumeMounts:
    - {name: config, mountPath: /etc/app, readOnly: true, subPath: conf}
    - {name: creds, mountPath: /run/creds}
  volumes:
  - name: config
    configMap:
      name: app
      defaultMode: 0600
      optional: true
      items: [{key: a.conf, path: sub/a.conf, mode: 0400}]
  - name: creds
    secret: {secretName: creds}
  - name: share
    nfs: {server: nfs.example, path: /export}
  - name: scratch
"""

DOWNWARD_POD = b"""\
kind: Pod
metadata: {name: web}
spec:
  containers:
  - name: main
    resources:
      limits: {cpu: 0.5, memory: 1Gi, hugepages-2Mi: 2}
      requests: {cpu: 250m}
  initContainers:
  - name: init
  volumes:
  - name: info
    downwardAPI:
      defaultMode: 0444
      items:
      - {path: labels, fieldRef: {fieldPath: metadata.labels}}
      - path: owner
        mode: 0400
        fieldRef: {apiVersion: v1, fieldPath: "metadata.annotations['Example.com/Owner']"}
      - path: mem
        resourceFieldRef: {containerName: main, resource: limits.memory, divisor: 1024Ki}
      - path: cpu
        resourceFieldRef: {containerName: main, resource: requests.cpu, divisor: 1000m}
      - path: pages
        resourceFieldRef: {containerName: init, resource: limits.hugepages-2Mi, divisor: "0"}
"""

PROJECTED_POD = b"""\
kind: Pod
metadata: {name: web}
spec:
  volumes:
  - name: all
    projected:
      defaultMode: 0440
      sources:
      - configMap: {name: cm, items: [{key: a, path: conf/a}]}
      - secret: {name: s, optional: true}
      - downwardAPI: {items: [{path: name, fieldRef: {fieldPath: metadata.name}}]}
      - serviceAccountToken: {path: token}
      - serviceAccountToken: {path: vault, audience: vault, expirationSeconds: 7200}
      - {}
  - name: empty
    projected: {}
  - name: bundle
    projected:
      sources:
      - clusterTrustBundle: {signerName: example.com/ca, path: ca.pem}
"""

CONVERSIONS = [
    pytest.param(
        to_yaml(
            config_map(data={"a": "1", "b": None}, binaryData={"bin": b64(b"\0\1")}, immutable=True)
        ),
        [
            ConfigMap(
                "default",
                "app",
                NO_VERSION,
                data={"a": b"1", "b": b""},
                binary_data={"bin": b"\0\1"},
                immutable=True,
            )
        ],
        id="configmap",
    ),
    pytest.param(
        to_yaml(
            secret(
                metadata={"name": "app", "namespace": "ns", "resourceVersion": "5"},
                type="kubernetes.io/tls",
                data={"tls.crt": b64(b"cert"), "k": b64(b"old")},
                stringData={"k": "new"},
            )
        ),
        [
            Secret(
                "ns",
                "app",
                ResourceVersion("5"),
                data={"tls.crt": b"cert", "k": b"new"},
                type="kubernetes.io/tls",
            )
        ],
        id="secret-stringData-over-data",
    ),
    pytest.param(
        b"kind: Secret\nmetadata: {name: app}\ndata:\n  k: |\n    "
        + b64(b"y" * 60)[:40].encode()
        + b"\n    "
        + b64(b"y" * 60)[40:].encode()
        + b"\n",
        [Secret("default", "app", NO_VERSION, data={"k": b"y" * 60})],
        id="secret-base64-over-lines",
    ),
    pytest.param(
        FULL_POD,
        [
            Pod(
                uid=PodUID("0b7a6c1e-0000-4000-8000-000000000001"),
                namespace="shop",
                name="web",
                resource_version=ResourceVersion("17"),
                node_name="node-1",
                labels={"app": "web"},
                annotations={"note": "hi"},
                volumes=(
                    Volume(
                        VolumeName("config"),
                        ConfigMapVolumeSource(
                            "app", (KeyToPath("a.conf", "sub/a.conf", 0o400),), 0o600, True
                        ),
                    ),
                    Volume(VolumeName("creds"), SecretVolumeSource("creds")),
                    Volume(VolumeName("share"), NFSVolumeSource("nfs.example", "/export")),
                    Volume(VolumeName("scratch"), EmptyDirVolumeSource()),
                ),
                containers=(
                    Container(
                        "main",
                        (
                            VolumeMount(VolumeName("config"), "/etc/app", True, "conf"),
                            VolumeMount(VolumeName("creds"), "/run/creds"),
                        ),
                        run_as_user=33,
                    ),
                ),
                init_containers=(Container("init"),),
                fs_group=2000,
                run_as_user=1000,
            )
        ],
        id="pod-full",
    ),
    pytest.param(
        to_yaml({"kind": "Pod", "metadata": {"name": "web"}}),
        [Pod(derived_uid("default", "web"), "default", "web", NO_VERSION)],
        id="pod-derived-uid",
    ),
    pytest.param(
        b"---\n---\n" + to_yaml({"apiVersion": "v1", "kind": "Service"}, None, config_map()),
        [ConfigMap("default", "app", NO_VERSION)],
        id="other-kinds-and-empty-documents-skipped",
    ),
    pytest.param(
        to_yaml({"apiVersion": "example.com/v1", "kind": "Secret", "metadata": {"name": "x"}}),
        [],
        id="same-kind-other-group-skipped",
    ),
    pytest.param(
        to_yaml({"apiVersion": "v1", "kind": "List", "items": [config_map(), secret()]}),
        [ConfigMap("default", "app", NO_VERSION), Secret("default", "app", NO_VERSION)],
        id="yaml-list",
    ),
    pytest.param(
        b"\xef\xbb\xbf" + to_yaml(config_map()),
        [ConfigMap("default", "app", NO_VERSION)],
        id="utf8-bom",
    ),
    pytest.param(b"", [], id="empty-file"),
    pytest.param(
        DOWNWARD_POD,
        [
            Pod(
                derived_uid("default", "web"),
                "default",
                "web",
                NO_VERSION,
                volumes=(
                    Volume(
                        VolumeName("info"),
                        DownwardAPIVolumeSource(
                            (
                                DownwardAPIVolumeFile(
                                    "labels", ObjectFieldSelector("metadata.labels")
                                ),
                                DownwardAPIVolumeFile(
                                    "owner",
                                    ObjectFieldSelector(
                                        "metadata.annotations['Example.com/Owner']", "v1"
                                    ),
                                    mode=0o400,
                                ),
                                DownwardAPIVolumeFile(
                                    "mem",
                                    resource_field_ref=ResourceFieldSelector(
                                        "limits.memory", "main", "1Mi"
                                    ),
                                ),
                                DownwardAPIVolumeFile(
                                    "cpu",
                                    resource_field_ref=ResourceFieldSelector(
                                        "requests.cpu", "main", "1"
                                    ),
                                ),
                                DownwardAPIVolumeFile(
                                    "pages",
                                    resource_field_ref=ResourceFieldSelector(
                                        "limits.hugepages-2Mi", "init"
                                    ),
                                ),
                            ),
                            default_mode=0o444,
                        ),
                    ),
                ),
                containers=(
                    Container(
                        "main",
                        resources=ResourceRequirements(
                            limits={"cpu": "0.5", "memory": "1Gi", "hugepages-2Mi": "2"},
                            # a limit without a request is also the request (SetDefaults_Pod)
                            requests={"cpu": "250m", "memory": "1Gi", "hugepages-2Mi": "2"},
                        ),
                    ),
                ),
                init_containers=(Container("init"),),
            )
        ],
        id="pod-downward-api-and-resources",
    ),
    pytest.param(
        PROJECTED_POD,
        [
            Pod(
                derived_uid("default", "web"),
                "default",
                "web",
                NO_VERSION,
                volumes=(
                    Volume(
                        VolumeName("all"),
                        ProjectedVolumeSource(
                            (
                                ConfigMapProjection("cm", (KeyToPath("a", "conf/a"),)),
                                SecretProjection("s", optional=True),
                                DownwardAPIProjection(
                                    (
                                        DownwardAPIVolumeFile(
                                            "name", ObjectFieldSelector("metadata.name")
                                        ),
                                    )
                                ),
                                ServiceAccountTokenProjection("token"),
                                ServiceAccountTokenProjection("vault", "vault", 7200),
                            ),
                            default_mode=0o440,
                        ),
                    ),
                    Volume(VolumeName("empty"), ProjectedVolumeSource()),
                    Volume(
                        VolumeName("bundle"),
                        UnsupportedVolumeSource("projected with clusterTrustBundle"),
                    ),
                ),
            )
        ],
        id="pod-projected",
    ),
]


@pytest.mark.parametrize(("text", "expected"), CONVERSIONS)
def test_conversion(text: bytes, expected: list[object]) -> None:
    assert parse_manifest(text, origin=ORIGIN) == expected


@pytest.mark.parametrize(
    "document",
    [
        pytest.param(config_map(data={"a": "1"}), id="object"),
        pytest.param(
            {"apiVersion": "v1", "kind": "List", "items": [config_map(data={"a": "1"})]}, id="list"
        ),
    ],
)
def test_json(document: dict[str, Any]) -> None:
    text = json.dumps(document, indent=1).encode()
    assert parse_manifest(text, origin="m/app.json") == [
        ConfigMap("default", "app", NO_VERSION, data={"a": b"1"})
    ]


def test_other_kinds_are_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="fusevol.decode.objects")
    assert parse_manifest(to_yaml({"apiVersion": "v1", "kind": "Service"}), origin=ORIGIN) == []
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]
    assert "Service" in caplog.records[0].getMessage()


def test_error_never_quotes_secret_values() -> None:
    text = b"kind: Secret\nmetadata: {name: app}\ndata: {k: 'hunter2!!'}\nstringData: {x: hunter2\n"
    for bad in (text, to_yaml(secret(data={"k": "hunter2!!"}))):
        with pytest.raises(ManifestError) as info:
            parse_manifest(bad, origin=ORIGIN)
        assert "hunter2" not in str(info.value)


# -- validation errors -----------------------------------------------------------------------------

CM = "configmap default/app"
SECRET = "secret default/app"
POD = "pod default/web"
VOL0 = "spec.volumes[0]"
KEY_CHARS = "a valid config key must consist of alphanumeric characters, '-', '_' or '.'"
MODE_RANGE = "must be a number between 0 and 0777 (octal), both inclusive"


def cm_volume(**source: Any) -> dict[str, Any]:
    return {"name": "v", "configMap": {"name": "app", **source}}


def downward(*items: dict[str, Any]) -> dict[str, Any]:
    return {"name": "v", "downwardAPI": {"items": list(items)}}


def field_item(field_path: str, **ref: Any) -> dict[str, Any]:
    return {"path": "f", "fieldRef": {"fieldPath": field_path, **ref}}


def resource_item(resource: str, **ref: Any) -> dict[str, Any]:
    return {"path": "r", "resourceFieldRef": {"containerName": "c", "resource": resource, **ref}}


def projected(*sources: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"name": "v", "projected": {"sources": list(sources), **fields}}


def container(**resources: Any) -> dict[str, Any]:
    return {"name": "c", "resources": resources}


DOWNWARD_ITEM = f"{VOL0}.downwardAPI.items[0]"
SOURCE0 = f"{VOL0}.projected.sources[0]"
SOURCE1 = f"{VOL0}.projected.sources[1]"
VOLUME_FIELDS = (
    'supported values: "metadata.annotations", "metadata.labels", "metadata.name", '
    '"metadata.namespace", "metadata.uid"'
)
QUALIFIED = "a qualified name must consist of alphanumeric characters"
BYTE_DIVISORS = "1, 1k, 1M, 1G, 1T, 1P, 1E, 1Ki, 1Mi, 1Gi, 1Ti, 1Pi, 1Ei"
QUANTITY_REGEX = "quantities must match the regular expression"


ERRORS = [
    # -- the file as a whole
    pytest.param(b"a: [1\nb: 2\n", "line 2 column 2: invalid YAML", id="yaml-syntax"),
    pytest.param(
        b"a: 1\na: 2\n",
        "line 2 column 1: invalid YAML: found duplicate key 'a'",
        id="yaml-duplicate-key",
    ),
    pytest.param(b"[" * 100_000, "line 1: invalid YAML: nested too deeply", id="yaml-too-deep"),
    pytest.param(b"kind: ConfigMap\xff\n", "not valid UTF-8 (byte 15)", id="not-utf8"),
    pytest.param(b"- a\n- b\n", "document 1: must be a mapping, not list", id="not-a-mapping"),
    pytest.param(
        to_yaml({"kind": "List", "items": ["x"]}),
        "document 1: items[0]: must be a mapping",
        id="list-item-not-a-mapping",
    ),
    pytest.param(
        to_yaml(config_map(), config_map()),
        f"{CM}: defined twice (document 1, document 2)",
        id="defined-twice",
    ),
    # -- metadata
    pytest.param(
        to_yaml(config_map(metadata={})),
        "document 1 (configmap): metadata.name: Required value",
        id="missing-name",
    ),
    pytest.param(
        to_yaml({"kind": "List", "items": [secret(metadata={"namespace": "x"})]}),
        "document 1 items[0] (secret): metadata.name: Required value",
        id="missing-name-in-list",
    ),
    pytest.param(
        to_yaml(config_map(metadata={"name": "App_1"})),
        "configmap default/App_1: metadata.name: must be a lowercase RFC 1123 subdomain",
        id="name-not-dns",
    ),
    pytest.param(
        to_yaml(config_map(metadata={"name": "a", "namespace": "a.b"})),
        "configmap a.b/a: metadata.namespace: must be a lowercase RFC 1123 label",
        id="namespace-not-dns-label",
    ),
    pytest.param(
        to_yaml(pod() | {"metadata": {"name": "web", "labels": {"v": 1}}}),
        f'{POD}: metadata.labels["v"]: must be a string, not int',
        id="label-not-string",
    ),
    # -- ConfigMap / Secret keys and values
    pytest.param(
        to_yaml(config_map(data={"../x": "1"})), f'{CM}: data["../x"]: {KEY_CHARS}', id="key-chars"
    ),
    pytest.param(
        to_yaml(config_map(data={"k" * 254: "1"})),
        f'{CM}: data["{"k" * 254}"]: must be no more than 253 bytes',
        id="key-too-long",
    ),
    pytest.param(
        to_yaml(config_map(data={".": "1"})), f"{CM}: data[\".\"]: must not be '.'", id="key-dot"
    ),
    pytest.param(
        to_yaml(secret(stringData={"..": "1"})),
        f"{SECRET}: stringData[\"..\"]: must not be '..'",
        id="key-dotdot",
    ),
    pytest.param(
        to_yaml(config_map(binaryData={"..a": ""})),
        f"{CM}: binaryData[\"..a\"]: must not start with '..'",
        id="key-dotdot-prefix",
    ),
    pytest.param(
        to_yaml(config_map(data={"a": "1"}, binaryData={"a": b64(b"1")})),
        f'{CM}: binaryData["a"]: duplicate of key present in data',
        id="key-in-data-and-binaryData",
    ),
    pytest.param(
        to_yaml(config_map(data={"a": 1})),
        f'{CM}: data["a"]: must be a string, not int',
        id="value-not-string",
    ),
    pytest.param(
        to_yaml(config_map(data=["a"])),
        f"{CM}: data: must be a mapping, not list",
        id="data-not-mapping",
    ),
    pytest.param(
        to_yaml(config_map(data={"a": "x" * (1024 * 1024)})),
        f"{CM}: data: Too long: must have at most 1048576 bytes (has 1048577)",
        id="configmap-too-large",
    ),
    pytest.param(
        to_yaml(secret(data={"a": b64(b"x" * 1024 * 512)}, stringData={"b": "x" * 1024 * 512})),
        f"{SECRET}: data: Too long: must have at most 1048576 bytes (has 1048578)",
        id="secret-too-large",
    ),
    pytest.param(
        to_yaml(secret(data={"k": "abc"})),
        f'{SECRET}: data["k"]: illegal base64 data',
        id="secret-bad-base64",
    ),
    pytest.param(
        to_yaml(config_map(binaryData={"k": "a$=="})),
        f'{CM}: binaryData["k"]: illegal base64 data',
        id="binaryData-bad-base64",
    ),
    pytest.param(
        to_yaml(secret(immutable="yes")),
        f"{SECRET}: immutable: must be a boolean, not str",
        id="immutable-not-bool",
    ),
    # -- pod volumes
    pytest.param(
        to_yaml(pod({"configMap": {"name": "a"}})),
        f"{POD}: {VOL0}.name: Required value",
        id="volume-name-missing",
    ),
    pytest.param(
        to_yaml(pod({"name": "v"}, {"name": "v"})),
        f'{POD}: spec.volumes[1].name: Duplicate value: "v"',
        id="volume-name-duplicate",
    ),
    pytest.param(
        to_yaml(pod({"name": "v", "nfs": {}, "hostPath": {}})),
        f"{POD}: {VOL0}: may not specify more than 1 volume type",
        id="two-volume-types",
    ),
    pytest.param(
        to_yaml(pod({"name": "v", "configMap": {}})),
        f"{POD}: {VOL0}.configMap.name: Required value",
        id="configmap-name-missing",
    ),
    pytest.param(
        to_yaml(pod({"name": "v", "secret": {"defaultMode": 420}})),
        f"{POD}: {VOL0}.secret.secretName: Required value",
        id="secret-name-missing",
    ),
    pytest.param(
        to_yaml(pod(cm_volume(items=[{"path": "a"}]))),
        f"{POD}: {VOL0}.configMap.items[0].key: Required value",
        id="item-key-missing",
    ),
    pytest.param(
        to_yaml(pod(cm_volume(items=[{"key": "a"}]))),
        f"{POD}: {VOL0}.configMap.items[0].path: Required value",
        id="item-path-missing",
    ),
    pytest.param(
        to_yaml(pod(cm_volume(items=[{"key": "a", "path": "/etc/a"}]))),
        f'{POD}: {VOL0}.configMap.items[0].path: invalid value "/etc/a": must be a relative path',
        id="item-path-absolute",
    ),
    pytest.param(
        to_yaml(pod(cm_volume(items=[{"key": "a", "path": "a/../../b"}]))),
        f"{POD}: {VOL0}.configMap.items[0].path: "
        "invalid value \"a/../../b\": must not contain '..'",
        id="item-path-backstep",
    ),
    pytest.param(
        to_yaml(pod(cm_volume(items=[{"key": "a", "path": "..a"}]))),
        f"{POD}: {VOL0}.configMap.items[0].path: invalid value \"..a\": must not start with '..'",
        id="item-path-dotdot-prefix",
    ),
    pytest.param(
        to_yaml(pod(cm_volume(items=[{"key": "a", "path": "a", "mode": 0o1000}]))),
        f"{POD}: {VOL0}.configMap.items[0].mode: {MODE_RANGE}",
        id="item-mode-too-large",
    ),
    pytest.param(
        to_yaml(pod(cm_volume(defaultMode=-1))),
        f"{POD}: {VOL0}.configMap.defaultMode: {MODE_RANGE}",
        id="default-mode-negative",
    ),
    pytest.param(
        to_yaml(pod(cm_volume(defaultMode="0644"))),
        f"{POD}: {VOL0}.configMap.defaultMode: must be an integer, not str",
        id="default-mode-string",
    ),
    pytest.param(
        to_yaml(pod({"name": "v", "secret": {"secretName": "s", "defaultMode": True}})),
        f"{POD}: {VOL0}.secret.defaultMode: must be an integer, not bool",
        id="default-mode-bool",
    ),
    pytest.param(
        to_yaml(pod(cm_volume(items={"key": "a"}))),
        f"{POD}: {VOL0}.configMap.items: must be a list, not dict",
        id="items-not-a-list",
    ),
    # -- pod containers and security context
    pytest.param(
        to_yaml(
            pod(containers=[{"name": "c", "volumeMounts": [{"name": "nope", "mountPath": "/x"}]}])
        ),
        f'{POD}: spec.containers[0].volumeMounts[0].name: Not found: "nope"',
        id="mount-unknown-volume",
    ),
    pytest.param(
        to_yaml(
            pod({"name": "v"}, initContainers=[{"name": "i", "volumeMounts": [{"name": "v"}]}])
        ),
        f"{POD}: spec.initContainers[0].volumeMounts[0].mountPath: Required value",
        id="mount-path-missing",
    ),
    pytest.param(
        to_yaml(pod(containers=[{}])),
        f"{POD}: spec.containers[0].name: Required value",
        id="container-name-missing",
    ),
    pytest.param(
        to_yaml(pod(securityContext={"fsGroup": -1})),
        f"{POD}: spec.securityContext.fsGroup: must be between 0 and 2147483647, inclusive",
        id="fsgroup-negative",
    ),
    pytest.param(
        to_yaml(pod(containers=[{"name": "c", "securityContext": {"runAsUser": "root"}}])),
        f"{POD}: spec.containers[0].securityContext.runAsUser: must be an integer, not str",
        id="run-as-user-string",
    ),
    # -- container resources
    pytest.param(
        to_yaml(pod(containers=[container(limits={"cpu": "abc"})])),
        f'{POD}: spec.containers[0].resources.limits["cpu"]: invalid value "abc": {QUANTITY_REGEX}',
        id="resource-not-a-quantity",
    ),
    pytest.param(
        to_yaml(pod(containers=[container(requests={"memory": "-1Gi"})])),
        f'{POD}: spec.containers[0].resources.requests["memory"]: invalid value "-1Gi": '
        "must be greater than or equal to 0",
        id="resource-negative",
    ),
    pytest.param(
        to_yaml(pod(containers=[container(limits={"cpu": True})])),
        f'{POD}: spec.containers[0].resources.limits["cpu"]: must be a string, not bool',
        id="resource-bool",
    ),
    pytest.param(
        to_yaml(pod(containers=[container(limits={"cpu": ""})])),
        f'{POD}: spec.containers[0].resources.limits["cpu"]: Required value',
        id="resource-empty",
    ),
    # -- downwardAPI volumes
    pytest.param(
        to_yaml(pod(downward({"fieldRef": {"fieldPath": "metadata.name"}}))),
        f"{POD}: {DOWNWARD_ITEM}.path: Required value",
        id="downward-path-missing",
    ),
    pytest.param(
        to_yaml(pod(downward({"path": "../x", "fieldRef": {"fieldPath": "metadata.name"}}))),
        f"{POD}: {DOWNWARD_ITEM}.path: invalid value \"../x\": must not contain '..'",
        id="downward-path-backstep",
    ),
    pytest.param(
        to_yaml(pod(downward({"path": "..data", "fieldRef": {"fieldPath": "metadata.name"}}))),
        f"{POD}: {DOWNWARD_ITEM}.path: invalid value \"..data\": must not start with '..'",
        id="downward-path-reserved",
    ),
    pytest.param(
        to_yaml(pod(downward({"path": "f"}))),
        f"{POD}: {DOWNWARD_ITEM}: Required value: one of fieldRef and resourceFieldRef is required",
        id="downward-no-reference",
    ),
    pytest.param(
        to_yaml(pod(downward(field_item("metadata.name") | resource_item("limits.cpu")))),
        f"{POD}: {DOWNWARD_ITEM}: "
        "fieldRef and resourceFieldRef can not be specified simultaneously",
        id="downward-both-references",
    ),
    pytest.param(
        to_yaml(pod(downward(field_item("metadata.name") | {"mode": 0o1000}))),
        f"{POD}: {DOWNWARD_ITEM}.mode: {MODE_RANGE}",
        id="downward-mode",
    ),
    pytest.param(
        to_yaml(pod({"name": "v", "downwardAPI": {"defaultMode": 512}})),
        f"{POD}: {VOL0}.downwardAPI.defaultMode: {MODE_RANGE}",
        id="downward-default-mode",
    ),
    pytest.param(
        to_yaml(pod(downward(field_item("spec.nodeName")))),
        f'{POD}: {DOWNWARD_ITEM}.fieldRef.fieldPath: unsupported value "spec.nodeName": '
        f"{VOLUME_FIELDS}",
        id="field-env-only",
    ),
    pytest.param(
        to_yaml(pod(downward(field_item("metadata.labels[ 'key' ]")))),
        f"{POD}: {DOWNWARD_ITEM}.fieldRef.fieldPath: unsupported value",
        id="field-spaced-subscript",
    ),
    pytest.param(
        to_yaml(pod(downward(field_item("metadata.name['x']")))),
        f"{POD}: {DOWNWARD_ITEM}.fieldRef.fieldPath: invalid value \"metadata.name['x']\": "
        "error converting fieldPath: field label does not support subscript",
        id="field-subscript-on-name",
    ),
    pytest.param(
        to_yaml(pod(downward(field_item("metadata.labels['Www.k8s.io/test']")))),
        f'{POD}: {DOWNWARD_ITEM}.fieldRef: invalid value "Www.k8s.io/test": {QUALIFIED}',
        id="field-label-key-not-lowered",
    ),
    pytest.param(
        to_yaml(pod(downward(field_item("metadata.annotations['a[b']c']")))),
        f'{POD}: {DOWNWARD_ITEM}.fieldRef: invalid value "a[b\']c": {QUALIFIED}',
        id="field-annotation-key-odd",
    ),
    pytest.param(
        to_yaml(pod(downward(field_item("metadata.name", apiVersion="v2")))),
        f'{POD}: {DOWNWARD_ITEM}.fieldRef.fieldPath: invalid value "metadata.name": '
        "error converting fieldPath: unsupported pod version: v2",
        id="field-api-version",
    ),
    pytest.param(
        to_yaml(pod(downward({"path": "f", "fieldRef": {}}))),
        f"{POD}: {DOWNWARD_ITEM}.fieldRef.fieldPath: Required value",
        id="field-path-missing",
    ),
    pytest.param(
        to_yaml(pod(downward({"path": "r", "resourceFieldRef": {"resource": "limits.cpu"}}))),
        f"{POD}: {DOWNWARD_ITEM}.resourceFieldRef.containerName: Required value",
        id="resource-container-missing",
    ),
    pytest.param(
        to_yaml(pod(downward(resource_item("limits.nvidia.com/gpu")))),
        f"{POD}: {DOWNWARD_ITEM}.resourceFieldRef.resource: unsupported value "
        '"limits.nvidia.com/gpu": supported values: "limits.cpu"',
        id="resource-extended",
    ),
    pytest.param(
        to_yaml(pod(downward(resource_item("limits.cpu", divisor="1k")))),
        f'{POD}: {DOWNWARD_ITEM}.resourceFieldRef.divisor: invalid value "1k": '
        "only divisor's values 1m and 1 are supported with the cpu resource",
        id="divisor-cpu",
    ),
    pytest.param(
        to_yaml(pod(downward(resource_item("requests.memory", divisor="1m")))),
        f'{POD}: {DOWNWARD_ITEM}.resourceFieldRef.divisor: invalid value "1m": '
        f"only divisor's values {BYTE_DIVISORS} are supported with the memory resource",
        id="divisor-memory",
    ),
    pytest.param(
        # 1Mi in value, but its canonical form is "1048576" (a plain number stays decimal).
        to_yaml(pod(downward(resource_item("limits.ephemeral-storage", divisor="1048576")))),
        f"{POD}: {DOWNWARD_ITEM}.resourceFieldRef.divisor: invalid value "
        f'"1048576": only divisor\'s values {BYTE_DIVISORS} are supported '
        "with the local ephemeral storage resource",
        id="divisor-storage-not-canonical",
    ),
    pytest.param(
        to_yaml(pod(downward(resource_item("limits.hugepages-2Mi", divisor="2Mi")))),
        f"{POD}: {DOWNWARD_ITEM}.resourceFieldRef.divisor: invalid value "
        f'"2Mi": only divisor\'s values {BYTE_DIVISORS} are supported '
        "with the hugepages resource",
        id="divisor-hugepages",
    ),
    # -- projected volumes
    pytest.param(
        to_yaml(pod(projected({"configMap": {"name": "a"}, "secret": {"name": "b"}}))),
        f"{POD}: {SOURCE0}: may not specify more than 1 volume type",
        id="projected-two-types",
    ),
    pytest.param(
        to_yaml(
            pod(
                projected(
                    {"configMap": {"name": "a", "items": [{"key": "k", "path": "x"}]}},
                    {"secret": {"name": "b", "items": [{"key": "k", "path": "x"}]}},
                )
            )
        ),
        f'{POD}: {VOL0}.projected: invalid value "b": conflicting duplicate paths',
        id="projected-duplicate-item-paths",
    ),
    pytest.param(
        to_yaml(
            pod(
                projected(
                    {"configMap": {"name": "a", "items": [{"key": "k", "path": "x"}]}},
                    {"downwardAPI": {"items": [field_item("metadata.name") | {"path": "x"}]}},
                )
            )
        ),
        f'{POD}: {VOL0}.projected: invalid value "x": conflicting duplicate paths',
        id="projected-duplicate-downward-path",
    ),
    pytest.param(
        to_yaml(pod(projected({"configMap": {"items": []}}))),
        f"{POD}: {SOURCE0}.configMap.name: Required value",
        id="projected-configmap-name",
    ),
    pytest.param(
        to_yaml(pod(projected({"secret": {"name": "s", "items": [{"key": "k", "path": "/x"}]}}))),
        f'{POD}: {SOURCE0}.secret.items[0].path: invalid value "/x": must be a relative path',
        id="projected-secret-item-path",
    ),
    pytest.param(
        to_yaml(pod(projected({"downwardAPI": {"items": [field_item("status.podIP")]}}))),
        f"{POD}: {SOURCE0}.downwardAPI.items[0].fieldRef.fieldPath: unsupported value",
        id="projected-downward-field",
    ),
    pytest.param(
        to_yaml(pod(projected({"serviceAccountToken": {"path": "t", "expirationSeconds": 599}}))),
        f"{POD}: {SOURCE0}.serviceAccountToken.expirationSeconds: invalid value 599: "
        "may not specify a duration less than 10 minutes",
        id="token-too-short",
    ),
    pytest.param(
        to_yaml(
            pod(projected({"serviceAccountToken": {"path": "t", "expirationSeconds": 2**32 + 1}}))
        ),
        f"{POD}: {SOURCE0}.serviceAccountToken.expirationSeconds: invalid value 4294967297: "
        "may not specify a duration larger than 2^32 seconds",
        id="token-too-long",
    ),
    pytest.param(
        to_yaml(pod(projected({"serviceAccountToken": {"path": "t", "expirationSeconds": "1h"}}))),
        f"{POD}: {SOURCE0}.serviceAccountToken.expirationSeconds: must be an integer, not str",
        id="token-expiry-not-integer",
    ),
    pytest.param(
        to_yaml(pod(projected({"serviceAccountToken": {"audience": "a"}}))),
        f"{POD}: {SOURCE0}.serviceAccountToken.path: Required value",
        id="token-path-missing",
    ),
    pytest.param(
        to_yaml(pod(projected({"serviceAccountToken": {"path": "/t"}}))),
        f'{POD}: {SOURCE0}.serviceAccountToken.path: invalid value "/t": must be a relative path',
        id="token-path-absolute",
    ),
    pytest.param(
        to_yaml(
            pod(
                projected(
                    {"clusterTrustBundle": {"name": "b", "path": "ca"}},
                    {"configMap": {"name": "a", "items": [{"key": "k", "path": "ca"}]}},
                )
            )
        ),
        f'{POD}: {VOL0}.projected: invalid value "a": conflicting duplicate paths',
        id="projected-duplicate-with-unsupported-source",
    ),
    pytest.param(
        to_yaml(pod({"name": "v", "projected": {"defaultMode": 0o1000}})),
        f"{POD}: {VOL0}.projected.defaultMode: {MODE_RANGE}",
        id="projected-default-mode",
    ),
    pytest.param(
        to_yaml(pod({"name": "v", "projected": {"sources": {"configMap": {}}}})),
        f"{POD}: {VOL0}.projected.sources: must be a list, not dict",
        id="projected-sources-not-a-list",
    ),
]


@pytest.mark.parametrize(("text", "message"), ERRORS)
def test_error(text: bytes, message: str) -> None:
    """The error, whether it fails the manifest or, in a volume's source, that volume alone."""
    error = manifest_error(text, origin=ORIGIN)
    assert error.startswith(f"{ORIGIN}: {message}")


def test_a_volume_with_a_bad_source_fails_alone() -> None:
    """The pod's other volumes, before and after it, are read as if it were not there."""
    bad = downward(resource_item("limits.cpu", divisor="1k"))
    good = cm_volume(name="app")
    (pod_with_bad,) = parse_manifest(
        to_yaml(pod(good, {**bad, "name": "info"}, {**good, "name": "after"})), origin=ORIGIN
    )
    assert isinstance(pod_with_bad, Pod)
    first, broken, last = pod_with_bad.volumes
    assert first.source == last.source == ConfigMapVolumeSource("app")
    assert isinstance(broken.source, InvalidVolumeSource)
    assert broken.name == "info"
    assert broken.source.type_name == "downwardAPI"
    assert broken.source.error == (
        "spec.volumes[1].downwardAPI.items[0].resourceFieldRef.divisor: "
        'invalid value "1k": only divisor\'s values 1m and 1 are supported with the cpu resource'
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            b'{"kind": "ConfigMap",\n "a": }', "line 2 column 7: invalid JSON", id="syntax"
        ),
        pytest.param(b"[]", "document 1: must be a mapping, not list", id="array"),
        pytest.param(b"[" * 100_000, "invalid JSON: nested too deeply", id="too-deep"),
        pytest.param(
            b'{"kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": "\\ud800"}}',
            'configmap default/a: data\\["k"\\]: must be valid Unicode',
            id="lone-surrogate",
        ),
    ],
)
def test_json_error(text: bytes, message: str) -> None:
    with pytest.raises(ManifestError, match=f"^m/app.json: {message}"):
        parse_manifest(text, origin="m/app.json")
