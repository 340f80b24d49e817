"""Pods as the API server stores them decode and serve as the pods their authors wrote.

A client sends a pod; kube-apiserver stores and returns it defaulted (`divisor: "0"`,
`defaultMode: 420`, `fieldRef.apiVersion: v1`, requests copied from limits, quantities canonical,
...). Two properties, over pods generated with every served and mounted volume type and option
(hypothesis):
- the stored form decodes without an invalid volume, to the very volumes of the written form;
- every volume served from memory renders the same payload, byte for byte and mode for mode, from
  either form (the written form through kubelet's own defaulting, as kubelet reads static pods).
`tests/helpers/defaults.py` makes the stored form; the pods captured from a real kube-apiserver
v1.28 in `tests/fixtures/apiserver/` hold it to what the API server really does, and decode with
every volume valid themselves.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fusevol.base.errors import VolumeSetupError
from fusevol.decode.objects import convert_object
from fusevol.model import (
    ConfigMap,
    ConfigMapVolumeSource,
    DownwardAPIVolumeSource,
    InvalidVolumeSource,
    Pod,
    ProjectedVolumeSource,
    ResourceRequirements,
    ResourceVersion,
    Secret,
    SecretVolumeSource,
)
from fusevol.projection import configmap, downward, projected, secret
from fusevol.projection.downward import NodeAllocatable
from tests.helpers.defaults import as_stored

Obj = dict[str, Any]
FIXTURES = Path(__file__).parent.parent / "fixtures" / "apiserver"
ALLOCATABLE = NodeAllocatable(
    cpu_millis=4000, memory_bytes=8 << 30, ephemeral_storage_bytes=1 << 40
)
OBJECTS: dict[str, ConfigMap | Secret] = {
    "app": ConfigMap("default", "app", ResourceVersion("1"), data={"a": b"1", "b.conf": b"x=y\n"}),
    "creds": Secret(
        "default", "creds", ResourceVersion("1"), data={"token": b"t0k", "user": b"me"}
    ),
}

# -- hand-written pods --------------------------------------------------------------------------

_modes = st.none() | st.sampled_from([0o400, 0o440, 0o644, 0o755, 0o777, 0])
_optional = st.none() | st.booleans()
_paths = st.sampled_from(["a", "dir/a", "x/y/z", "conf", "b.conf", "a..b"])
_cpu = st.sampled_from(["1", "1m", "1000m", "0", "0m", "0.001"])
_bytes = st.sampled_from(["1", "1Ki", "1Mi", "1024Ki", "1k", "1M", "1Gi", "0", "0Ki"])
_FIELD_PATHS = [
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "metadata.labels",
    "metadata.annotations",
    "metadata.labels['app']",
    "metadata.annotations['example.com/owner']",
]


def _unique_paths(entries: list[Obj]) -> list[Obj]:
    seen: set[str] = set()
    kept = []
    for entry in entries:
        if entry["path"] not in seen:
            seen.add(entry["path"])
            kept.append(entry)
    return kept


def _key_items(keys: list[str]) -> st.SearchStrategy[list[Obj] | None]:
    item = st.fixed_dictionaries(
        {"key": st.sampled_from(keys), "path": _paths}, optional={"mode": _modes}
    )
    return st.none() | st.lists(item, max_size=3).map(_unique_paths)


@st.composite
def _resource_ref(draw: st.DrawFn) -> Obj:
    kind = draw(st.sampled_from(["limits", "requests"]))
    name = draw(st.sampled_from(["cpu", "memory", "ephemeral-storage"]))
    ref: Obj = {"containerName": draw(st.sampled_from(["c", "init"])), "resource": f"{kind}.{name}"}
    divisor = draw(st.none() | (_cpu if name == "cpu" else _bytes))
    if divisor is not None:
        ref["divisor"] = divisor
    return ref


def _downward_items() -> st.SearchStrategy[list[Obj]]:
    field = st.fixed_dictionaries(
        {"fieldPath": st.sampled_from(_FIELD_PATHS)}, optional={"apiVersion": st.just("v1")}
    )
    item = st.fixed_dictionaries(
        {"path": _paths},
        optional={"mode": _modes},
    ).flatmap(
        lambda base: st.one_of(
            field.map(lambda ref: {**base, "fieldRef": ref}),
            _resource_ref().map(lambda ref: {**base, "resourceFieldRef": ref}),
        )
    )
    return st.lists(item, max_size=4).map(_unique_paths)


def _maybe(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[Obj]:
    """A mapping with each of `fields` present or not; a None value is sent as null."""
    return st.fixed_dictionaries({}, optional=fields)


_config_map = st.builds(
    lambda extra, name: {"name": name, **extra},
    _maybe(items=_key_items(["a", "b.conf"]), defaultMode=_modes, optional=_optional),
    st.sampled_from(["app", "missing"]),
)
_secret = st.builds(
    lambda extra, name: {"secretName": name, **extra},
    _maybe(items=_key_items(["token", "user"]), defaultMode=_modes, optional=_optional),
    st.sampled_from(["creds", "missing"]),
)
_downward = _maybe(items=_downward_items(), defaultMode=_modes)


@st.composite
def _projected(draw: st.DrawFn) -> Obj:
    sources: list[Obj] = []
    taken: set[str] = set()
    for kind in draw(st.lists(st.sampled_from(["configMap", "secret", "downwardAPI", "token"]))):
        if kind == "configMap":
            body = draw(_config_map)
            body.pop("defaultMode", None)
            items = body.get("items") or []
        elif kind == "secret":
            body = {"name": draw(_secret)["secretName"]}
            items = draw(_key_items(["token", "user"])) or []
            if items:
                body["items"] = items
        elif kind == "downwardAPI":
            items = draw(_downward_items())
            body = {"items": items}
        else:
            items = [{"path": draw(st.sampled_from(["token", "t/k"]))}]
            body = {"path": items[0]["path"], "audience": draw(st.sampled_from(["", "vault"]))}
            seconds = draw(st.none() | st.sampled_from([600, 3600, 7200]))
            if seconds is not None:
                body["expirationSeconds"] = seconds
        paths = {item["path"] for item in items}
        if paths & taken:
            continue  # the API server refuses a path twice across sources
        taken |= paths
        sources.append({"serviceAccountToken" if kind == "token" else kind: body})
    return {"sources": sources, **draw(_maybe(defaultMode=_modes))}


_volume_source = st.one_of(
    st.tuples(st.just("configMap"), _config_map),
    st.tuples(st.just("secret"), _secret),
    st.tuples(st.just("downwardAPI"), _downward),
    st.tuples(st.just("projected"), _projected()),
    st.tuples(st.just("emptyDir"), _maybe(medium=st.sampled_from(["", "Memory"]))),
    st.tuples(
        st.just("hostPath"),
        st.builds(
            lambda extra: {"path": "/var/log", **extra},
            _maybe(type=st.sampled_from(["", "Directory", "DirectoryOrCreate"])),
        ),
    ),
    st.tuples(
        st.just("nfs"),
        st.builds(
            lambda extra: {"server": "10.0.0.1", "path": "/export", **extra},
            _maybe(readOnly=st.booleans()),
        ),
    ),
    st.tuples(
        st.just("persistentVolumeClaim"),
        st.builds(lambda extra: {"claimName": "data", **extra}, _maybe(readOnly=st.booleans())),
    ),
)
_resources = _maybe(
    limits=_maybe(cpu=st.sampled_from(["500m", "0.5", "2", "1.0005"]), memory=st.just("1Gi")),
    requests=_maybe(cpu=st.sampled_from(["250m", "100m"]), memory=st.just("512Mi")),
)


@st.composite
def written_pods(draw: st.DrawFn) -> Obj:
    sources = draw(st.lists(_volume_source, min_size=1, max_size=4))
    volumes = [{"name": f"v{i}", kind: body} for i, (kind, body) in enumerate(sources)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web",
            "namespace": "default",
            "uid": "11111111-2222-4333-8444-555555555555",
            "labels": {"app": "web"},
            "annotations": {"example.com/owner": "me"},
        },
        "spec": {
            "nodeName": "test-node",
            "containers": [{"name": "c", "image": "busybox", "resources": draw(_resources)}],
            "initContainers": [{"name": "init", "image": "busybox:1.36"}],
            "volumes": volumes,
            **draw(_maybe(securityContext=_maybe(fsGroup=st.just(2000), runAsUser=st.just(1000)))),
        },
    }


# -- what is served ------------------------------------------------------------------------------


def _decode(document: Obj) -> Pod:
    pod = convert_object(json.loads(json.dumps(document)), origin="api")
    assert isinstance(pod, Pod)
    return pod


def _served(pod: Pod) -> dict[str, object]:
    """Each volume served from memory -> its payload ({path: (bytes, mode, fs_user)}) or error."""
    configmaps = {n: o for n, o in OBJECTS.items() if isinstance(o, ConfigMap)}
    secrets = {n: o for n, o in OBJECTS.items() if isinstance(o, Secret)}
    served: dict[str, object] = {}
    for volume in pod.volumes:
        try:
            match volume.source:
                case ConfigMapVolumeSource() as source:
                    payload = configmap.make_payload(source, configmaps.get(source.name))
                case SecretVolumeSource() as source:
                    payload = secret.make_payload(source, secrets.get(source.secret_name))
                case DownwardAPIVolumeSource(items=items, default_mode=mode):
                    payload = downward.make_payload(
                        items, pod, default_mode=mode, allocatable=ALLOCATABLE
                    )
                case ProjectedVolumeSource() as source:
                    payload = projected.make_payload(
                        source,
                        pod,
                        get_configmap=configmaps.get,
                        get_secret=secrets.get,
                        allocatable=ALLOCATABLE,
                        get_token=lambda projection: f"token for {projection.audience}".encode(),
                    )
                case _:
                    continue
        except VolumeSetupError as exc:
            served[volume.name] = str(exc)
            continue
        served[volume.name] = {p: (f.data, f.mode, f.fs_user) for p, f in payload.items()}
    return served


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(written_pods())
def test_a_stored_pod_decodes_and_serves_as_written(written: Obj) -> None:
    stored = _decode(as_stored(written))
    assert not [v for v in stored.volumes if isinstance(v.source, InvalidVolumeSource)]
    as_written = _decode(written)
    assert stored.volumes == as_written.volumes
    assert _served(stored) == _served(as_written)


# -- the real API server -------------------------------------------------------------------------


def _captured() -> list[tuple[str, Obj, Obj]]:
    """(name, what the client sent, what kube-apiserver v1.28 stored) of each fixture."""
    return [
        (path.stem, *json.loads(path.read_text()).values())
        for path in sorted(FIXTURES.glob("*.json"))
    ]


CAPTURED = _captured()


@pytest.mark.parametrize(
    ("sent", "stored"), [c[1:] for c in CAPTURED], ids=[c[0] for c in CAPTURED]
)
def test_the_loopback_server_stores_volumes_and_containers_as_kube_apiserver(
    sent: Obj, stored: Obj
) -> None:
    ours = as_stored(sent)
    theirs = stored["spec"]
    # The ServiceAccount admission plugin's kube-api-access volume and mounts are not modelled.
    volumes = [v for v in theirs["volumes"] if not v["name"].startswith("kube-api-access-")]
    assert ours["spec"]["volumes"] == volumes
    for mine, real in zip(ours["spec"]["containers"], theirs["containers"], strict=True):
        real = {**real, "volumeMounts": [
            m for m in real.get("volumeMounts", []) if not m["name"].startswith("kube-api-access-")
        ]}  # fmt: skip
        if not real["volumeMounts"]:
            del real["volumeMounts"]
        assert mine == real


@pytest.mark.parametrize(
    ("sent", "stored"), [(c[1], c[2]) for c in CAPTURED], ids=[c[0] for c in CAPTURED]
)
def test_a_captured_pod_decodes_with_every_volume_valid_and_serves_as_sent(
    sent: Obj, stored: Obj
) -> None:
    pod = _decode(stored)
    assert [v.name for v in pod.volumes] == [v["name"] for v in stored["spec"]["volumes"]]
    assert not [v for v in pod.volumes if isinstance(v.source, InvalidVolumeSource)]
    served = _served(pod)
    admitted = [name for name in served if name.startswith("kube-api-access-")]
    assert len(admitted) == (0 if sent["spec"].get("automountServiceAccountToken") is False else 1)
    for name in admitted:
        del served[name]
    assert served == _served(_decode(sent))


@pytest.mark.parametrize(
    ("phase", "deletion", "finished", "deleting"),
    [
        pytest.param(None, None, False, False, id="as-created"),
        pytest.param("Running", None, False, False, id="running"),
        pytest.param("Succeeded", None, True, False, id="succeeded"),
        pytest.param("Failed", None, True, False, id="failed"),
        pytest.param("Running", "2026-11-30T12:00:30Z", False, True, id="being-deleted"),
        pytest.param("Unknown", None, False, False, id="unknown"),
    ],
)
def test_a_captured_pod_says_whether_it_is_stopping(
    phase: str | None, deletion: str | None, finished: bool, deleting: bool
) -> None:
    """Whether kubelet starts anything more for a pod: its `status.phase` (Pending as created),
    and `metadata.deletionTimestamp` (set with `deletionGracePeriodSeconds` by a graceful
    deletion)."""
    stored = next(c[2] for c in CAPTURED if c[0] == "configmap-secret")
    assert stored["status"]["phase"] == "Pending"
    metadata = dict(stored["metadata"])
    if deletion is not None:
        metadata.update(deletionTimestamp=deletion, deletionGracePeriodSeconds=30)
    status = stored["status"] if phase is None else {**stored["status"], "phase": phase}
    pod = _decode({**stored, "metadata": metadata, "status": status})
    assert (pod.finished, pod.deleting, pod.stopping) == (finished, deleting, finished or deleting)


def test_captured_pods_are_there() -> None:
    assert len(CAPTURED) >= 2


def test_replicas_share_the_strings_their_specs_repeat() -> None:
    """Each pod decoded from JSON of its own (as each arrives from the API server), the strings
    a Deployment's replicas repeat are one object for all of them: thousands of pods on a node
    hold a namespace, a volume name or a mount path once. Their own names stay their own."""
    stored = next(c[2] for c in CAPTURED if c[0] == "configmap-secret")
    spec = {**stored["spec"], "nodeName": "kit-node"}  # as the scheduler binds them
    first, second = (
        _decode(
            {**stored, "metadata": {**stored["metadata"], "name": name, "uid": uid}, "spec": spec}
        )
        for name, uid in (
            ("web-1", "aaaaaaaa-0000-4000-8000-000000000001"),
            ("web-2", "aaaaaaaa-0000-4000-8000-000000000002"),
        )
    )
    assert first.name != second.name
    assert first.uid is not second.uid
    assert first.namespace is second.namespace
    assert first.node_name == "kit-node"
    assert first.node_name is second.node_name
    assert first.service_account_name is second.service_account_name
    assert first.volumes
    assert len(first.volumes) == len(second.volumes)
    for a, b in zip(first.volumes, second.volumes, strict=True):
        assert a.name is b.name
        if isinstance(a.source, ConfigMapVolumeSource):
            assert isinstance(b.source, ConfigMapVolumeSource)
            assert a.source.name is b.source.name
        if isinstance(a.source, SecretVolumeSource):
            assert isinstance(b.source, SecretVolumeSource)
            assert a.source.secret_name is b.source.secret_name
    mounts = [m for c in first.containers for m in c.volume_mounts]
    others = [m for c in second.containers for m in c.volume_mounts]
    assert mounts
    assert len(mounts) == len(others)
    for mount, other in zip(mounts, others, strict=True):
        assert mount.name is other.name
        assert mount.mount_path is other.mount_path


def test_what_objects_leave_empty_is_one_read_only_map() -> None:
    """Pods without annotations or resources, ConfigMaps without binaryData: no empty dict of
    their own each, one shared map that nobody can fill."""
    stored = next(c[2] for c in CAPTURED if c[0] == "configmap-secret")
    spec = {**stored["spec"]}
    spec["containers"] = [{**c, "resources": {}} for c in spec["containers"]]
    first, second = (_decode({**stored, "spec": spec}) for _ in range(2))
    assert first.annotations == {}
    assert first.annotations is second.annotations
    resources = [c.resources for p in (first, second) for c in p.containers]
    assert resources[0] == ResourceRequirements({}, {})
    assert all(r is resources[0] for r in resources)
    maps = []
    for _ in range(2):
        config_map = convert_object(
            {"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": "1"}}, origin="api"
        )
        assert isinstance(config_map, ConfigMap)
        maps.append(config_map.binary_data)
    assert maps[0] is maps[1]
    with pytest.raises(TypeError):
        maps[0]["a"] = b"1"  # type: ignore[index]


# -- divisor "0" ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("resource", "expected"),
    [
        ("limits.cpu", b"1"),  # 500m, divided by 1 and rounded up
        ("requests.cpu", b"1"),  # 250m
        ("limits.memory", b"1073741824"),
        ("requests.memory", b"536870912"),
        ("limits.ephemeral-storage", b"1099511627776"),  # no limit: the node's allocatable
    ],
)
def test_divisor_zero_serves_as_divisor_one(resource: str, expected: bytes) -> None:
    written = {
        "kind": "Pod",
        "metadata": {"name": "web", "uid": "aaaaaaaa-0000-4000-8000-000000000001"},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "resources": {
                        "limits": {"cpu": "500m", "memory": "1Gi"},
                        "requests": {"cpu": "250m", "memory": "512Mi"},
                    },
                }
            ],
            "volumes": [
                {
                    "name": "info",
                    "downwardAPI": {
                        "items": [
                            {
                                "path": "value",
                                "resourceFieldRef": {"containerName": "c", "resource": resource},
                            }
                        ]
                    },
                }
            ],
        },
    }
    stored = as_stored(written)
    ref = stored["spec"]["volumes"][0]["downwardAPI"]["items"][0]["resourceFieldRef"]
    assert ref["divisor"] == "0"  # what the API server sends
    served = _served(_decode(stored))
    assert served == {"info": {"value": (expected, 0o644, None)}}
