"""`fusevol convert` through the real command line: a manifest of workloads and pods in, the same
manifest with the webhook's conversion out (stdout), a report per pod (stderr)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import yaml

from fusevol.webhook.convert import ANNOTATION

if TYPE_CHECKING:
    from pathlib import Path

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: team}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: c, image: busybox}]
      volumes:
        - {name: config, configMap: {name: app, items: [{key: a, path: dir/a, mode: 0400}]}}
        - name: token
          projected: {sources: [{serviceAccountToken: {audience: vault, path: t}}]}
        - name: info
          downwardAPI: {items: [{path: annotations, fieldRef: {fieldPath: metadata.annotations}}]}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec: {ports: [{port: 80}]}
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly}
spec:
  schedule: "@daily"
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          containers: [{name: c, image: busybox}]
          volumes: [{name: creds, secret: {secretName: creds}}]
"""


def fusevol(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fusevol", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_convert_prints_the_manifest_converted_and_a_report(tmp_path: Path) -> None:
    manifest = tmp_path / "app.yaml"
    manifest.write_text(DEPLOYMENT)
    result = fusevol("convert", "-f", str(manifest))
    assert result.returncode == 0, result.stderr
    deployment, service, cronjob = yaml.safe_load_all(result.stdout)
    template: Any = deployment["spec"]["template"]
    config, token, info, kept = template["spec"]["volumes"]
    assert config["csi"] == {
        "driver": "fusevol.io",
        "readOnly": True,
        "volumeAttributes": {
            "volume": '{"configMap": {"name": "app", "items": [{"key": "a", "path": "dir/a", '
            '"mode": 256}]}}'
        },
    }
    written = next(yaml.safe_load_all(DEPLOYMENT))["spec"]["template"]["spec"]["volumes"]
    assert token == written[1]
    assert info["csi"]["volumeAttributes"] == {
        "volume": '{"downwardAPI": {"items": [{"path": "annotations", "fieldRef": {"fieldPath": '
        '"metadata.annotations"}}]}}'
    }
    assert kept == {**written[0], "name": "fusevol-ref-config"}
    report = json.loads(template["metadata"]["annotations"][ANNOTATION])
    assert report["converted"] == ["config", "info"]
    assert report["references"] == {"fusevol-ref-config": "config"}
    assert service == list(yaml.safe_load_all(DEPLOYMENT))[1]
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]
    assert pod["spec"]["volumes"][0]["csi"]["volumeAttributes"] == {
        "volume": '{"secret": {"secretName": "creds"}}'
    }
    assert result.stderr.splitlines() == [
        "Deployment team/web: converted config, info",
        "Deployment team/web: kept config unmounted as fusevol-ref-config: the pod names what it "
        "reads",
        "Deployment team/web: not converted token: serviceAccountToken 't': audience 'vault' for "
        "3600 s is not one of the tokenRequests of the CSIDriver fusevol.io",
        "CronJob default/nightly: converted creds",
        "CronJob default/nightly: kept creds unmounted as fusevol-ref-creds: the pod names what it "
        "reads",
    ]


def test_token_requests_convert_their_audiences_and_stdin_is_read() -> None:
    result = fusevol("convert", "-f", "-", "--token-request", "vault=3600", stdin=DEPLOYMENT)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[0] == "Deployment team/web: converted config, token, info"
    # What convert printed, converted again, stays as it is.
    again = fusevol("convert", "-f", "-", "--token-request", "vault", stdin=result.stdout)
    assert again.stdout == result.stdout


def test_bad_usage_and_unreadable_files(tmp_path: Path) -> None:
    result = fusevol("convert", "-f", "-", "--token-request", "vault=60")
    assert result.returncode == 2
    assert "--token-request: invalid token_request value: 'vault=60'" in result.stderr
    result = fusevol("convert", "-f", str(tmp_path / "missing.yaml"))
    assert (result.returncode, result.stderr) == (
        1,
        f"fusevol: {tmp_path}/missing.yaml: No such file or directory\n",
    )
    result = fusevol("convert", "-f", "-", stdin="a: [")
    assert result.returncode == 1
    assert result.stderr.startswith("fusevol: <stdin>: not YAML or JSON: ")
