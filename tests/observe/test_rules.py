"""The chart's alerts (helm/fusevol/files/alerts.yaml) checked by Prometheus' own `promtool`: the
file is clean (`check rules`), and every alert fires on the series that should fire it and stays
silent on others (`test rules` of tests/observe/alerts.test.yaml, which must hold both kinds of
case for each alert). And what makes an alert actionable: a severity, a summary, a description
naming what it is about from the series' labels, and a runbook section in README.md that its
runbook_url points to.

promtool is Debian's `prometheus` package (.ci/setup installs it); without it these tests fail,
they do not skip.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "helm" / "fusevol" / "files" / "alerts.yaml"
RULE_TESTS = Path(__file__).with_name("alerts.test.yaml")
README = REPO / "README.md"
SEVERITIES = {"warning", "critical"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("promtool") is None:
        pytest.fail("promtool not found: install Debian's prometheus package (bash .ci/setup)")
    return subprocess.run(
        ["promtool", *args], capture_output=True, text=True, timeout=120, check=False
    )


def alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def runbook_sections() -> list[str]:
    """The headings (level 4) of README.md's "Runbook" section, in order."""
    text = README.read_text()
    start = text.index("\n### Runbook\n")
    end = text.find("\n## ", start)
    section = text[start : end if end != -1 else len(text)]
    return re.findall(r"^#### (\S+)$", section, re.M)


def test_promtool_check_rules_is_clean() -> None:
    result = promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in result.stdout, result.stdout


def test_promtool_test_rules_passes() -> None:
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout, result.stdout


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())
    assert [(RULE_TESTS.parent / name).resolve() for name in tests["rule_files"]] == [ALERTS]
    firing: set[str] = set()
    silent: set[str] = set()
    for case in tests["tests"]:
        for check in case["alert_rule_test"]:
            (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    names = {rule["alert"] for rule in alerts()}
    assert names - firing == set(), "alerts without a case where they fire"
    assert names - silent == set(), "alerts without a case where they stay silent"
    assert (firing | silent) - names == set(), "cases of alerts that do not exist"


def test_every_alert_says_what_to_act_on() -> None:
    for rule in alerts():
        name, annotations = rule["alert"], rule["annotations"]
        assert rule["labels"]["severity"] in SEVERITIES, name
        assert set(annotations) == {"summary", "description", "runbook_url"}, name
        assert annotations["summary"].endswith("."), name
        # What the alert is about, from the series' labels; an absent() has none to name.
        if not rule["expr"].startswith("absent("):
            named = set(re.findall(r"\$labels\.(\w+)", annotations["description"]))
            assert named & {"node", "pod"}, f"{name} names no node or pod"
        assert re.search(r'job="fusevol(-webhook)?"', rule["expr"]), f"{name} selects no job"


def test_every_alert_has_its_runbook_section() -> None:
    """README.md's "Runbook" has one section per alert, in the rules' order, and each alert's
    runbook_url is that section's anchor (GitHub's: the heading in lower case)."""
    names = [rule["alert"] for rule in alerts()]
    assert runbook_sections() == names
    for rule in alerts():
        assert rule["annotations"]["runbook_url"] == f"README.md#{rule['alert'].lower()}"
