"""The conversion serves what kubelet would have served: for every volume kind and option, the
converted volume, as kubelet hands it to the driver (its `volumeAttributes` and pod identity,
through the CSI attribute parser `fusevol.csi.attributes.parse`), renders the very payload the
original volume renders (bytes, modes, owner), with the pod as the API server stores it after the
webhook's patch (annotation included).

Pods come from the hypothesis generator of the pod-spec path's conformance
(`tests/unit/test_api_forms.py`), in the form the API server stores them (what the webhook is
sent, `tests/helpers/defaults.py`) and as written (what `fusevol convert` reads); the patch is
applied by an RFC 6902 implementation (PyPI `jsonpatch`), as the API server applies it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from fusevol.csi import attributes
from fusevol.decode.reader import Reader
from fusevol.decode.volume_sources import parse_volumes
from fusevol.model import InvalidVolumeSource, Volume
from fusevol.webhook.convert import (
    ANNOTATION,
    DRIVER,
    REFERENCE_PREFIX,
    Driver,
    TokenRequest,
    convert_pod,
)
from tests.helpers.defaults import as_stored
from tests.unit.test_api_forms import _decode, _served, written_pods

if TYPE_CHECKING:
    from collections.abc import Iterator

Obj = dict[str, Any]
SERVED = ("configMap", "secret", "downwardAPI", "projected")
EVERY_TOKEN = Driver(
    token_requests=frozenset(
        TokenRequest(audience, seconds)
        for audience in ("", "vault")
        for seconds in (600, 3600, 7200)
    ),
    requires_republish=True,
)
"""A CSIDriver whose tokenRequests hold every audience and lifetime the generator makes."""
KUBELET_DIR = Path(tempfile.mkdtemp(prefix="fusevol-webhook-kubelet-"))
"""kubelet's directory for the CSI attribute parser's target checks (hypothesis runs many
examples in one test function: no function-scoped tmp_path); removed after the module's tests."""


@pytest.fixture(autouse=True, scope="module")
def _remove_kubelet_dir() -> Iterator[None]:
    yield
    shutil.rmtree(KUBELET_DIR, ignore_errors=True)


def converted(pod: Obj, driver: Driver = EVERY_TOKEN) -> tuple[Obj, Any]:
    """`pod` with the webhook's patch applied, and the conversion."""
    conversion = convert_pod(copy.deepcopy(pod), namespace="default", driver=driver)
    patched = jsonpatch.apply_patch(pod, conversion.patch) if conversion.patch else pod
    return patched, conversion


def published(pod: Obj, volume: Obj) -> attributes.Publication:
    """What the agent reads of a converted volume: NodePublishVolume as kubelet makes it."""
    csi = volume["csi"]
    assert csi["driver"] == DRIVER
    assert csi["readOnly"] is True
    uid, name = pod["metadata"]["uid"], volume["name"]
    target = KUBELET_DIR / "pods" / uid / "volumes" / "kubernetes.io~csi" / name / "mount"
    target.parent.mkdir(parents=True, exist_ok=True)
    fs_group = (pod["spec"].get("securityContext") or {}).get("fsGroup")
    context = {
        **csi["volumeAttributes"],
        attributes.POD_NAME: pod["metadata"]["name"],
        attributes.POD_NAMESPACE: pod["metadata"]["namespace"],
        attributes.POD_UID: uid,
        attributes.SERVICE_ACCOUNT: pod["spec"].get("serviceAccountName") or "default",
        attributes.EPHEMERAL: "true",
    }
    return attributes.parse(
        volume_id=attributes.volume_handle(uid, name),
        target_path=str(target),
        context=context,
        volume_mount_group="" if fs_group is None else str(fs_group),
        kubelet_dir=KUBELET_DIR,
    )


def check_served_alike(original: Obj, patched: Obj, conversion: Any) -> None:
    """Every converted volume serves, through the driver, what the original volume serves."""
    stored = _decode(patched)
    originals = {v.name: v for v in _decode(original).volumes}
    by_name = {v["name"]: v for v in patched["spec"]["volumes"]}
    read_back: list[Volume] = []
    for name in conversion.converted:
        publication = published(patched, by_name[name])
        assert publication.volume.source == originals[name].source
        assert publication.fs_group == stored.fs_group
        read_back.append(publication.volume)
    as_kubelet = dataclasses.replace(
        stored, volumes=tuple(originals[n] for n in conversion.converted)
    )
    as_driver = dataclasses.replace(stored, volumes=tuple(read_back))
    assert _served(as_driver) == _served(as_kubelet)
    # What was not converted is as it was.
    for index, volume in enumerate(original["spec"]["volumes"]):
        if volume["name"] not in conversion.converted:
            assert patched["spec"]["volumes"][index] == volume
    check_references(original, patched, conversion)


def names_objects(volume: Obj) -> bool:
    """Whether the volume reads a ConfigMap or a Secret, as the API server's Node authorizer sees
    it (`VisitPodSecretNames`, `VisitPodConfigmapNames`)."""
    sources = [volume, *list((volume.get("projected") or {}).get("sources") or [])]
    return any("configMap" in s or "secret" in s for s in sources)


def check_references(original: Obj, patched: Obj, conversion: Any) -> None:
    """Each converted volume that reads ConfigMaps or Secrets keeps its original, renamed, after
    the pod's own volumes: the pod's spec names every object it names before."""
    count = len(original["spec"]["volumes"])
    kept = patched["spec"]["volumes"][count:]
    by_name = {v["name"]: v for v in original["spec"]["volumes"]}
    wanted = [n for n in conversion.converted if names_objects(by_name[n])]
    assert list(conversion.references.values()) == wanted
    assert [v["name"] for v in kept] == list(conversion.references)
    for volume in kept:
        name = conversion.references[volume["name"]]
        assert volume == {**by_name[name], "name": volume["name"]}
        assert volume["name"].startswith(REFERENCE_PREFIX)
        assert len(volume["name"]) <= 63
    names = [v["name"] for v in patched["spec"]["volumes"]]
    assert len(names) == len(set(names))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(written_pods(), st.booleans())
def test_every_volume_kind_and_option_serves_as_kubelet_would(written: Obj, stored: bool) -> None:
    pod = as_stored(written) if stored else written
    patched, conversion = converted(pod)
    served = [v["name"] for v in pod["spec"]["volumes"] if set(v) & set(SERVED)]
    # Every one: the driver lists every token.
    assert list(conversion.converted) == served
    assert conversion.not_converted == {}
    assert conversion.warnings == ()
    check_served_alike(pod, patched, conversion)
    if served:
        report = json.loads(patched["metadata"]["annotations"][ANNOTATION])
        references = {"references": dict(conversion.references)} if conversion.references else {}
        assert report == {"converted": served, "notConverted": {}} | references
    # A second pass (reinvoked, or a converted pod created again) changes nothing.
    again = convert_pod(copy.deepcopy(patched), namespace="default", driver=EVERY_TOKEN)
    assert again.patch == []
    assert again.converted == conversion.converted
    assert again.references == conversion.references


@settings(max_examples=200, deadline=None)
@given(written_pods())
def test_without_token_requests_token_volumes_stay_kubelets(written: Obj) -> None:
    pod = as_stored(written)
    patched, conversion = converted(pod, Driver())
    for volume in pod["spec"]["volumes"]:
        sources = (volume.get("projected") or {}).get("sources") or []
        tokens = [s["serviceAccountToken"] for s in sources if "serviceAccountToken" in s]
        if tokens:
            reason = conversion.not_converted[volume["name"]]
            assert "is not one of the tokenRequests of the CSIDriver fusevol.io" in reason
            assert repr(tokens[0].get("audience", "")) in reason
        elif set(volume) & set(SERVED):
            assert volume["name"] in conversion.converted
    check_served_alike(pod, patched, conversion)


_odd_text = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12) | st.sampled_from(
    ["\x85", "\x7f", "a\u2028b", "\ufeff", "\ufffe", "😀/x", "\\u0041", "'\""]
)


@settings(max_examples=400, deadline=None)
@given(path=_odd_text, name=_odd_text, nested=_odd_text)
def test_any_text_the_parser_takes_reads_back_the_same(path: str, name: str, nested: str) -> None:
    """Paths and names are free text to the API server: control characters, line separators,
    astral characters and quotes all survive the JSON-in-YAML attribute."""
    volume = {
        "name": "v",
        "projected": {
            "sources": [
                {"configMap": {"name": name, "items": [{"key": "a", "path": path}]}},
                {
                    "downwardAPI": {
                        "items": [
                            {"path": f"d/{nested}", "fieldRef": {"fieldPath": "metadata.name"}}
                        ]
                    }
                },
            ],
            "defaultMode": 0o644,
        },
    }
    [parsed] = parse_volumes(Reader("test", "pod"), [volume])
    assume(not isinstance(parsed.source, InvalidVolumeSource))
    pod = as_stored(
        {
            "kind": "Pod",
            "metadata": {
                "name": "web",
                "namespace": "default",
                "uid": "aaaaaaaa-0000-4000-8000-000000000001",
            },
            "spec": {"containers": [{"name": "c", "image": "busybox"}], "volumes": [volume]},
        }
    )
    patched, conversion = converted(pod)
    assert conversion.converted == ("v",), conversion.not_converted
    check_served_alike(pod, patched, conversion)


# -- what is not converted, and why ----------------------------------------------------------------


def _pod(*volumes: Obj, **spec: Any) -> Obj:
    return as_stored(
        {
            "kind": "Pod",
            "metadata": {"generateName": "web-", "namespace": "team", "labels": {"app": "web"}},
            "spec": {
                "containers": [{"name": "c", "image": "busybox"}],
                "volumes": list(volumes),
                **spec,
            },
        }
    )


CONFIG = {"name": "config", "configMap": {"name": "app"}}
API_ACCESS = {
    "name": "kube-api-access-x2x9z",
    "projected": {
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {
                "configMap": {
                    "name": "kube-root-ca.crt",
                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                }
            },
            {
                "downwardAPI": {
                    "items": [
                        {
                            "path": "namespace",
                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                        }
                    ]
                }
            },
        ],
        "defaultMode": 420,
    },
}
"""What the ServiceAccount admission plugin adds to every pod before the webhooks see it."""


def _report(conversion: Any) -> tuple[tuple[str, ...], dict[str, str]]:
    return conversion.converted, dict(conversion.not_converted)


def test_the_service_account_volume_converts_only_with_its_token_request() -> None:
    pod = _pod(CONFIG, API_ACCESS)
    _, conversion = converted(
        pod, Driver(token_requests=frozenset({TokenRequest("")}), requires_republish=True)
    )
    assert conversion.converted == ("config",)
    assert "audience '' for 3607 s" in conversion.not_converted["kube-api-access-x2x9z"]
    driver = Driver(token_requests=frozenset({TokenRequest("", 3607)}), requires_republish=True)
    _patched, conversion = converted(pod, driver)
    assert conversion.converted == ("config", "kube-api-access-x2x9z")
    without_republish = Driver(token_requests=driver.token_requests)
    _, conversion = converted(pod, without_republish)
    assert "does not set requiresRepublish" in conversion.not_converted["kube-api-access-x2x9z"]


@pytest.mark.parametrize(
    ("driver", "reason"),
    [
        (Driver.missing("the CSIDriver fusevol.io does not exist"), "does not exist"),
        (
            Driver.from_object(
                {"spec": {"volumeLifecycleModes": ["Persistent"], "podInfoOnMount": True}}
            ),
            "Ephemeral",
        ),
        (Driver.from_object({"spec": {"volumeLifecycleModes": ["Ephemeral"]}}), "podInfoOnMount"),
    ],
)
def test_nothing_converts_without_a_usable_driver(driver: Driver, reason: str) -> None:
    _patched, conversion = converted(_pod(CONFIG), driver)
    assert conversion.converted == ()
    assert reason in conversion.not_converted["config"]
    # The pod is unchanged but for the annotation saying why.
    assert [op["path"] for op in conversion.patch] == ["/metadata/annotations"]


@pytest.mark.parametrize(
    "field_path",
    [
        "metadata.annotations",
        "metadata.annotations['kubernetes.io/config.seen']",
        "metadata.annotations['kubernetes.io/config.source']",
        "metadata.annotations['example.com/owner']",
    ],
)
def test_annotations_convert_too(field_path: str) -> None:
    """The agent adds kubelet's own annotations to a CSI volume's pod (tests/csi), so a file of
    them is served as kubelet serves it: such a volume converts like any other."""
    item = {"path": "f", "fieldRef": {"fieldPath": field_path}}
    downward = {"name": "info", "downwardAPI": {"items": [item]}}
    projected = {"name": "all", "projected": {"sources": [{"downwardAPI": {"items": [item]}}]}}
    patched, conversion = converted(_pod(downward, projected))
    assert _report(conversion) == (("info", "all"), {})
    # They read no object: nothing to keep for the Node authorizer.
    assert conversion.references == {}
    assert [v["name"] for v in patched["spec"]["volumes"]] == ["info", "all"]


def test_windows_and_mirror_pods_are_left_alone() -> None:
    _, conversion = converted(_pod(CONFIG, os={"name": "windows"}))
    assert conversion.not_converted == {"config": "a Windows pod: fusevol.io serves Linux nodes"}
    mirror = _pod(CONFIG)
    mirror["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "abc"}
    assert converted(mirror)[1].patch == []


def test_what_fusevol_does_not_serve_is_named() -> None:
    trust = {
        "name": "bundle",
        "projected": {
            "sources": [{"clusterTrustBundle": {"signerName": "x.io/s", "path": "ca.pem"}}]
        },
    }
    bad = {"name": "bad", "secret": {"secretName": "s", "items": [{"key": "a", "path": "../a"}]}}
    other = {"name": "scratch", "emptyDir": {}}
    patched, conversion = converted(_pod(trust, bad, other, CONFIG))
    assert _report(conversion) == (
        ("config",),
        {
            "bundle": "fusevol does not serve projected with clusterTrustBundle sources",
            "bad": "fusevol cannot read it: spec.volumes[1].secret.items[0].path: invalid value "
            "\"../a\": must not contain '..'",
        },
    )
    [warning] = conversion.warnings
    assert warning.startswith("volume 'bad' is not converted: fusevol cannot read it")
    report = json.loads(patched["metadata"]["annotations"][ANNOTATION])
    assert report == {
        "converted": ["config"],
        "notConverted": dict(conversion.not_converted),
        "references": {"fusevol-ref-config": "config"},
    }


@pytest.mark.parametrize(
    "pod",
    [
        None,
        [],
        "pod",
        {"spec": []},
        {"metadata": "x", "spec": {}},
        {"spec": {"volumes": {"name": "x"}}},
        {"spec": {"volumes": [{"name": "Not_A_Label", "configMap": {"name": "a"}}]}},
        {"spec": {"volumes": [CONFIG, CONFIG]}},
    ],
)
def test_a_pod_that_does_not_parse_is_left_unchanged_with_a_warning(pod: Any) -> None:
    conversion = convert_pod(pod, namespace="default", driver=EVERY_TOKEN)
    assert conversion.patch == []
    [warning] = conversion.warnings
    assert "admitted unchanged" in warning


def test_hand_written_fusevol_volumes_are_not_claimed() -> None:
    ours = {"name": "mine", "csi": {"driver": DRIVER, "volumeAttributes": {"configMap": "app"}}}
    patched, conversion = converted(_pod(ours, CONFIG))
    assert conversion.converted == ("config",)
    assert patched["spec"]["volumes"][0] == ours


def test_a_pod_without_served_volumes_is_not_touched() -> None:
    pod = _pod({"name": "data", "persistentVolumeClaim": {"claimName": "d"}}, {"name": "e"})
    patched, conversion = converted(pod)
    assert (conversion.patch, conversion.converted, dict(conversion.not_converted)) == ([], (), {})
    assert patched == pod


# -- the originals kept for the Node authorizer ---------------------------------------------------


def test_each_converted_volume_that_reads_objects_keeps_its_original_unmounted() -> None:
    secret = {"name": "creds", "secret": {"secretName": "db", "defaultMode": 256}}
    info = {
        "name": "info",
        "downwardAPI": {"items": [{"path": "n", "fieldRef": {"fieldPath": "metadata.name"}}]},
    }
    pod = _pod(CONFIG, secret, info)
    pod["spec"]["containers"][0]["volumeMounts"] = [
        {"name": n, "mountPath": f"/{n}"} for n in ("config", "creds", "info")
    ]
    patched, conversion = converted(pod)
    assert conversion.converted == ("config", "creds", "info")
    volumes = patched["spec"]["volumes"]
    assert volumes[3:] == [
        {**pod["spec"]["volumes"][0], "name": "fusevol-ref-config"},
        {**pod["spec"]["volumes"][1], "name": "fusevol-ref-creds"},
    ]
    # No container mounts them: kubelet skips them; the mounts still name the converted ones.
    mounted = {m["name"] for c in patched["spec"]["containers"] for m in c["volumeMounts"]}
    assert mounted == {"config", "creds", "info"}
    assert json.loads(patched["metadata"]["annotations"][ANNOTATION])["references"] == {
        "fusevol-ref-config": "config",
        "fusevol-ref-creds": "creds",
    }


def test_a_kept_original_gets_a_free_name_within_63_characters() -> None:
    long = {"name": "c" * 63, "configMap": {"name": "app"}}
    squatter = {"name": "fusevol-ref-config", "emptyDir": {}}
    patched, conversion = converted(_pod(long, CONFIG, squatter))
    [for_long, for_config] = conversion.references
    assert len(for_long) == 63
    assert for_long.startswith("fusevol-ref-ccc")
    assert for_config != "fusevol-ref-config"
    assert for_config.startswith("fusevol-ref-config-")
    names = [v["name"] for v in patched["spec"]["volumes"]]
    assert len(set(names)) == len(names) == 5
    # A name the API server takes: a DNS label.
    assert all(re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", n) for n in names)


def test_a_second_pass_leaves_the_kept_originals_as_they_are() -> None:
    patched, _conversion = converted(_pod(CONFIG))
    again = convert_pod(copy.deepcopy(patched), namespace="default", driver=EVERY_TOKEN)
    assert (again.patch, again.converted, dict(again.references)) == (
        [],
        ("config",),
        {"fusevol-ref-config": "config"},
    )


def test_a_listed_reference_without_its_converted_volume_is_converted() -> None:
    """The annotation is the pod's creator's to write: a volume it calls a kept original of a
    volume that was not converted is an ordinary volume, converted as one."""
    pod = _pod({"name": "fusevol-ref-x", "configMap": {"name": "app"}})
    pod["metadata"]["annotations"] = {
        ANNOTATION: json.dumps({"converted": [], "references": {"fusevol-ref-x": "x"}})
    }
    _patched, conversion = converted(pod)
    assert conversion.converted == ("fusevol-ref-x",)
