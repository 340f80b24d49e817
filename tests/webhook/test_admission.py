"""AdmissionReviews in, answers out: every pod is allowed, converted or not; bad input is admitted
unchanged with a warning naming why; nothing the API server can send makes the webhook fail
(fuzzed with the pod generators the tests have: the hypothesis pods of the pod-spec path, in the
stored form, and the seeded mutated manifests of `tests/fuzz.py`)."""

from __future__ import annotations

import base64
import copy
import json
import random
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fusevol.webhook.admission import MAX_WARNING_CHARS, BadReview, review
from fusevol.webhook.convert import ANNOTATION, Driver
from tests.fuzz import mutated_document
from tests.helpers.defaults import as_stored
from tests.unit.test_api_forms import written_pods
from tests.webhook.test_convert import API_ACCESS, CONFIG, EVERY_TOKEN

Obj = dict[str, Any]
EXCLUDED = frozenset({"kube-system", "fusevol"})


def admission_review(pod: Any, *, namespace: str = "team", **request: Any) -> bytes:
    """An AdmissionReview as kube-apiserver v1.28 sends it for a pod's CREATE."""
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
            **request,
        },
    }
    return json.dumps(body).encode()


def answer(body: bytes, driver: Driver = EVERY_TOKEN, **options: Any) -> Obj:
    """The response to `body`; `options`: more arguments of `review`."""
    value: Obj = json.loads(
        review(body, driver=driver, excluded_namespaces=EXCLUDED, **options).body
    )
    assert value["apiVersion"] == "admission.k8s.io/v1"
    assert value["kind"] == "AdmissionReview"
    response: Obj = value["response"]
    assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert response["allowed"] is True  # always
    assert set(response) <= {"uid", "allowed", "patchType", "patch", "warnings"}
    for warning in response.get("warnings", []):
        assert warning.startswith("fusevol.io: ")
        assert len(warning) <= MAX_WARNING_CHARS
    return response


def patched(pod: Obj, response: Obj) -> Obj:
    if "patch" not in response:
        return pod
    assert response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    result: Obj = jsonpatch.apply_patch(pod, patch)
    return result


def _pod(*volumes: Obj) -> Obj:
    return as_stored(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"generateName": "web-5d4f8-", "namespace": "team", "labels": {"a": "b"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}], "volumes": list(volumes)},
        }
    )


def test_a_pod_is_converted_and_annotated() -> None:
    pod = _pod(CONFIG, API_ACCESS)
    response = answer(admission_review(pod))
    result = patched(pod, response)
    assert [v["name"] for v in result["spec"]["volumes"]] == [
        "config",
        "kube-api-access-x2x9z",
        "fusevol-ref-config",
    ]
    assert result["spec"]["volumes"][0]["csi"]["driver"] == "fusevol.io"
    assert result["spec"]["volumes"][2] == {
        **pod["spec"]["volumes"][0],
        "name": "fusevol-ref-config",
    }
    report = json.loads(result["metadata"]["annotations"][ANNOTATION])
    assert report["converted"] == ["config"]
    assert report["references"] == {"fusevol-ref-config": "config"}
    assert "kube-api-access-x2x9z" in report["notConverted"]
    assert "warnings" not in response  # a token audience the driver lacks is no fault of the pod
    # Reinvoked (or sent again): nothing more to do.
    assert "patch" not in answer(admission_review(result))


@pytest.mark.parametrize(
    "request_fields",
    [
        pytest.param({"operation": "UPDATE"}, id="update"),
        pytest.param({"subResource": "ephemeralcontainers"}, id="subresource"),
        pytest.param({"kind": {"group": "apps", "version": "v1", "kind": "Deployment"}}, id="kind"),
        pytest.param({"namespace": "kube-system"}, id="kube-system"),
        pytest.param({"namespace": "fusevol"}, id="release-namespace"),
    ],
)
def test_anything_but_a_pod_created_outside_the_excluded_namespaces_is_left(
    request_fields: Obj,
) -> None:
    response = answer(admission_review(_pod(CONFIG), **request_fields))
    assert response == {"uid": response["uid"], "allowed": True}


def test_no_driver_no_conversion() -> None:
    pod = _pod(CONFIG)
    driver = Driver.missing("the CSIDriver fusevol.io does not exist")
    result = patched(pod, answer(admission_review(pod), driver))
    assert result["spec"] == pod["spec"]
    report = json.loads(result["metadata"]["annotations"][ANNOTATION])
    assert report == {"converted": [], "notConverted": {"config": driver.problem}}


@pytest.mark.parametrize(
    "pod",
    [
        pytest.param("a pod", id="string"),
        pytest.param({"spec": {"volumes": 7}}, id="volumes-number"),
        pytest.param({"spec": {"volumes": [{"configMap": {"name": "x"}}]}}, id="no-name"),
    ],
)
def test_a_pod_that_cannot_be_parsed_is_admitted_unchanged_with_a_warning(pod: Any) -> None:
    response = answer(admission_review(pod))
    assert "patch" not in response
    [warning] = response["warnings"]
    assert "admitted unchanged" in warning


def test_a_long_warning_is_cut() -> None:
    long = {"name": "bad", "configMap": {"name": "x", "items": [{"key": "k", "path": "/" * 999}]}}
    [warning] = answer(admission_review(_pod(long)))["warnings"]
    assert warning.endswith("...")


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{",
        b"[]",
        b'{"apiVersion": "admission.k8s.io/v1beta1", "request": {"uid": "u"}}',
        b'{"apiVersion": "admission.k8s.io/v1", "request": {}}',
        b'{"apiVersion": "admission.k8s.io/v1", "request": {"uid": NaN}}',
        b"[" * 100_000,
    ],
)
def test_a_body_that_is_no_admission_review_is_refused(body: bytes) -> None:
    with pytest.raises(BadReview):
        review(body, driver=EVERY_TOKEN, excluded_namespaces=EXCLUDED)


# -- fuzzed ---------------------------------------------------------------------------------------


def check_admits(pod: Any) -> None:
    """Any pod is answered, allowed, with a patch that applies and a second pass that adds
    nothing; no internal error."""
    body = admission_review(copy.deepcopy(pod))
    response = answer(body)
    for warning in response.get("warnings", []):
        assert "internal error" not in warning
    if isinstance(pod, dict) and "patch" in response:
        result = patched(pod, response)
        again = answer(admission_review(result))
        assert "patch" not in again


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(written_pods(), st.sampled_from([EVERY_TOKEN, Driver()]))
def test_fuzz_generated_pods(written: Obj, driver: Driver) -> None:
    body = admission_review(as_stored(written))
    answer(body, driver)
    check_admits(as_stored(written))


@pytest.mark.parametrize("seed", range(200))
def test_fuzz_mutated_manifests(seed: int) -> None:
    """Every kind and volume type with fields replaced, deleted or added (`tests/fuzz.py`), each
    sent as the pod: whatever JSON the object is, it is answered."""
    rng = random.Random(seed)
    for _ in range(5):
        document = mutated_document(rng)
        try:
            json.dumps(document, allow_nan=False)
        except (TypeError, ValueError):
            continue  # not JSON (keys that are not strings...): no API server sends it
        check_admits(document)
        try:
            stored = as_stored(document)
        except (AttributeError, TypeError, ValueError):
            continue  # a pod the API server would refuse: it never reaches the webhook
        check_admits(stored)
