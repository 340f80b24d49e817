"""The audit's levels carried by the conversion: a converted volume that is audited
(`fusevol.model.audit.audited`) at the higher of its pod's level (annotation `fusevol.io/audit`)
and its namespace's gets the CSI attribute `fusevol.io/audit: "true"`, which the agent's attribute
parser reads as an audited publication; any other gets no such attribute. `fusevol convert`
applies the pod's annotation only."""

from __future__ import annotations

import copy
import subprocess
import sys
from typing import Any

import jsonpatch
import pytest
import yaml

from fusevol.model.audit import ANNOTATION as AUDIT, AuditLevel
from fusevol.webhook.convert import Driver, convert_pod
from fusevol.webhook.manifests import convert_text
from tests.helpers.defaults import as_stored
from tests.webhook.test_admission import admission_review, answer, patched
from tests.webhook.test_convert import CONFIG, EVERY_TOKEN, published

Obj = dict[str, Any]
OFF, SECRETS, ALL = AuditLevel.OFF, AuditLevel.SECRETS, AuditLevel.ALL
SECRET = {"name": "creds", "secret": {"secretName": "db"}}
MIXED = {
    "name": "bundle",
    "projected": {"sources": [{"configMap": {"name": "app"}}, {"secret": {"name": "db"}}]},
}
INFO = {
    "name": "info",
    "downwardAPI": {"items": [{"path": "n", "fieldRef": {"fieldPath": "metadata.name"}}]},
}
EVERY = (CONFIG, SECRET, MIXED, INFO)
SHOWING_SECRETS = {"config": False, "creds": True, "bundle": True, "info": False}
EVERYTHING = dict.fromkeys(SHOWING_SECRETS, True)
NOTHING = dict.fromkeys(SHOWING_SECRETS, False)


def audit_pod(*volumes: Obj, annotation: str | None = None) -> Obj:
    """A pod of namespace `team` as the API server stores it, with the audit `annotation`."""
    metadata: Obj = {
        "name": "web",
        "namespace": "team",
        "uid": "aaaaaaaa-0000-4000-8000-000000000002",
    }
    if annotation is not None:
        metadata["annotations"] = {AUDIT: annotation}
    return as_stored(
        {
            "kind": "Pod",
            "metadata": metadata,
            "spec": {"containers": [{"name": "c", "image": "busybox"}], "volumes": list(volumes)},
        }
    )


def audited(pod: Obj, namespace: AuditLevel | None = None) -> tuple[dict[str, bool], Any]:
    """Each converted volume of `pod`, converted in a namespace of level `namespace` (None: none
    known): whether the agent reads it as audited; and the conversion."""
    conversion = convert_pod(
        copy.deepcopy(pod),
        namespace="team",
        driver=EVERY_TOKEN,
        namespace_audit=None if namespace is None else lambda: namespace,
    )
    result = jsonpatch.apply_patch(pod, conversion.patch)
    by_name = {v["name"]: v for v in result["spec"]["volumes"]}
    seen = {}
    for name in conversion.converted:
        attributes = by_name[name]["csi"]["volumeAttributes"]
        # "true" or nothing: a "false" would read as if it could lower another level.
        assert attributes.get(AUDIT, "true") == "true"
        seen[name] = published(result, by_name[name]).audit
    assert [name for name, on in seen.items() if on] == list(conversion.audited)
    return seen, conversion


@pytest.mark.parametrize(
    ("namespace", "annotation", "expected"),
    [
        pytest.param(SECRETS, None, SHOWING_SECRETS, id="namespace-secrets"),
        pytest.param(ALL, None, EVERYTHING, id="namespace-all"),
        pytest.param(None, "secrets", SHOWING_SECRETS, id="pod-secrets-alone"),
        pytest.param(None, "all", EVERYTHING, id="pod-all-alone"),
        pytest.param(OFF, "secrets", SHOWING_SECRETS, id="pod-over-namespace"),
        pytest.param(ALL, "off", EVERYTHING, id="the-pod-cannot-lower-its-namespace"),
        pytest.param(SECRETS, "all", EVERYTHING, id="the-higher-of-the-two"),
        pytest.param(None, None, NOTHING, id="none"),
        pytest.param(OFF, "off", NOTHING, id="off"),
    ],
)
def test_each_converted_volume_is_audited_at_the_higher_level(
    namespace: AuditLevel | None, annotation: str | None, expected: dict[str, bool]
) -> None:
    seen, conversion = audited(audit_pod(*EVERY, annotation=annotation), namespace)
    assert seen == expected
    assert conversion.warnings == ()


def test_without_any_level_the_conversion_is_as_it_was() -> None:
    pod = audit_pod(*EVERY)
    with_level = convert_pod(
        copy.deepcopy(pod), namespace="team", driver=EVERY_TOKEN, namespace_audit=lambda: OFF
    )
    without = convert_pod(copy.deepcopy(pod), namespace="team", driver=EVERY_TOKEN)
    assert with_level == without
    for operation in without.patch:
        assert AUDIT not in str(operation["value"])


def test_a_level_that_is_no_level_audits_everything_with_a_warning() -> None:
    """As the agent reads the annotation (`pod_level`): a typo must not turn the audit off."""
    seen, conversion = audited(audit_pod(*EVERY, annotation="secret"))
    assert seen == EVERYTHING
    assert conversion.warnings == (
        "annotation fusevol.io/audit: 'secret' is not one of off, secrets, all: audited as all",
    )


def test_the_namespace_is_asked_once_and_only_for_a_volume_to_convert() -> None:
    asked: list[str] = []

    def level() -> AuditLevel:
        asked.append("team")
        return SECRETS

    convert_pod(audit_pod(*EVERY), namespace="team", driver=EVERY_TOKEN, namespace_audit=level)
    assert asked == ["team"]
    asked.clear()
    none_served = audit_pod({"name": "scratch", "emptyDir": {}})
    convert_pod(none_served, namespace="team", driver=EVERY_TOKEN, namespace_audit=level)
    no_driver = Driver.missing("the CSIDriver fusevol.io does not exist")
    convert_pod(audit_pod(*EVERY), namespace="team", driver=no_driver, namespace_audit=level)
    assert asked == []


def test_a_second_pass_keeps_the_attribute_and_changes_nothing() -> None:
    pod = audit_pod(*EVERY)
    first = convert_pod(
        copy.deepcopy(pod), namespace="team", driver=EVERY_TOKEN, namespace_audit=lambda: ALL
    )
    result = jsonpatch.apply_patch(pod, first.patch)
    again = convert_pod(
        copy.deepcopy(result), namespace="team", driver=EVERY_TOKEN, namespace_audit=lambda: OFF
    )
    assert (again.patch, again.converted) == ([], first.converted)


def test_the_admission_asks_the_pods_namespace_unless_excluded() -> None:
    asked: list[str] = []

    def level(namespace: str) -> AuditLevel:
        asked.append(namespace)
        return SECRETS

    pod = audit_pod(CONFIG, SECRET)
    response = answer(admission_review(pod, namespace="team"), namespace_audit=level)
    volumes = {v["name"]: v for v in patched(pod, response)["spec"]["volumes"]}
    assert AUDIT not in volumes["config"]["csi"]["volumeAttributes"]
    assert volumes["creds"]["csi"]["volumeAttributes"][AUDIT] == "true"
    assert asked == ["team"]
    response = answer(admission_review(pod, namespace="kube-system"), namespace_audit=level)
    assert "patch" not in response
    assert asked == ["team"]


MANIFEST = """\
apiVersion: v1
kind: Namespace
metadata:
  name: team
  annotations: {fusevol.io/audit: all}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: team}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata:
      labels: {app: web}
      annotations: {fusevol.io/audit: secrets}
    spec:
      containers: [{name: c, image: busybox}]
      volumes:
        - {name: config, configMap: {name: app}}
        - {name: creds, secret: {secretName: db}}
"""


def test_convert_applies_the_pods_annotation_only() -> None:
    """No cluster: a Namespace of the manifest is a document like any other."""
    result = subprocess.run(
        [sys.executable, "-m", "fusevol", "convert", "-f", "-"],
        input=MANIFEST,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    namespace, deployment = yaml.safe_load_all(result.stdout)
    assert namespace == next(yaml.safe_load_all(MANIFEST))
    config, creds, *_kept = deployment["spec"]["template"]["spec"]["volumes"]
    assert AUDIT not in config["csi"]["volumeAttributes"]
    assert creds["csi"]["volumeAttributes"][AUDIT] == "true"
    assert result.stderr.splitlines()[:2] == [
        "Deployment team/web: converted config, creds",
        "Deployment team/web: audited creds",
    ]


def test_convert_names_an_unquoted_level_that_yaml_reads_as_a_boolean() -> None:
    manifest = MANIFEST.split("---\n")[1].replace(
        "fusevol.io/audit: secrets", "fusevol.io/audit: off"
    )
    _, [report] = convert_text(manifest.encode(), origin="-", driver=Driver())
    assert report.conversion.audited == ("config", "creds")
    assert report.lines()[-1] == (
        "Deployment team/web: warning: annotation fusevol.io/audit: False is not a string (the "
        "API server refuses it: quote it): audited as all"
    )
