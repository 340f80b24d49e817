"""`FUSEVOL_*` environment variables as the flags' defaults: converted and checked as the flags'
values are, a bad one a usage error naming the variable (one line, exit 2, no traceback), a flag
given on the command line winning; the defaults themselves are `fusevol.base.settings`'."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fusevol.base.settings import DEFAULT_KUBELET_DIR, DEFAULT_ROOT, HttpSettings, KubeSettings
from fusevol.cli.parser import build_parser


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.startswith("FUSEVOL_")]:
        monkeypatch.delenv(name)


def fusevol(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fusevol", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "200", **env},
    )


def test_a_bad_variable_is_one_line_of_usage_error_through_the_real_cli() -> None:
    result = fusevol("run", "--manifests", "/nonexistent", FUSEVOL_HTTP_PORT="x")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == "fusevol: error: FUSEVOL_HTTP_PORT='x': invalid int value\n"


@pytest.mark.parametrize(
    ("variable", "value", "reason"),
    [
        ("FUSEVOL_HTTP_PORT", "x", "invalid int value"),
        ("FUSEVOL_HTTP_PORT", "9842.5", "invalid int value"),
        ("FUSEVOL_SYNC_PERIOD", "1m", "invalid float value"),
        ("FUSEVOL_CACHE_TTL", "soon", "invalid float value"),
        ("FUSEVOL_SOURCE", "api", "invalid choice (choose from 'manifests', 'kubernetes')"),
        (
            "FUSEVOL_CHANGE_DETECTION",
            "watch",
            "invalid choice (choose from 'Watch', 'Cache', 'Get')",
        ),
        (
            "FUSEVOL_LOG_LEVEL",
            "verbose",
            "invalid choice (choose from 'debug', 'info', 'warning', 'error')",
        ),
        ("FUSEVOL_REPLACE", "maybe", "invalid boolean value"),
    ],
)
def test_every_variable_is_checked_as_its_flag(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variable: str,
    value: str,
    reason: str,
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["run"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == f"fusevol: error: {variable}={value!r}: {reason}\n"


def test_a_flag_given_wins_over_a_bad_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUSEVOL_HTTP_PORT", "x")
    monkeypatch.setenv("FUSEVOL_SOURCE", "api")
    args = build_parser().parse_args(["run", "--http-port", "0", "--source", "manifests"])
    assert (args.http_port, args.source) == (0, "manifests")


def test_a_bad_variable_is_bad_usage_of_every_command_version_and_help_included() -> None:
    line = "fusevol: error: FUSEVOL_HTTP_PORT='x': invalid int value\n"
    for argv in (["--version"], ["run", "--help"], ["status", "--root", "/"]):
        result = fusevol(*argv, FUSEVOL_HTTP_PORT="x")
        assert (result.returncode, result.stdout, result.stderr) == (2, "", line), argv
    given = fusevol("run", "--http-port=0", "--help", FUSEVOL_HTTP_PORT="x")
    assert (given.returncode, given.stderr) == (0, "")


def test_good_variables_are_converted(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "FUSEVOL_HTTP_PORT": "-1",
        "FUSEVOL_SYNC_PERIOD": "2.5",
        "FUSEVOL_CACHE_TTL": "0",
        "FUSEVOL_LOG_LEVEL": "DEBUG",
        "FUSEVOL_CHANGE_DETECTION": "Get",
        "FUSEVOL_ROOT": "/srv/fusevol",
        "FUSEVOL_REPLACE": "True",
    }.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(["run"])
    assert (args.http_port, args.sync_period, args.cache_ttl) == (-1, 2.5, 0.0)
    assert (args.log_level, args.change_detection) == ("debug", "Get")
    assert args.root == Path("/srv/fusevol")
    assert args.replace is True
    monkeypatch.setenv("FUSEVOL_REPLACE", "no")
    assert build_parser().parse_args(["run"]).replace is False
    assert build_parser().parse_args(["status"]).root == Path("/srv/fusevol")


def test_an_empty_variable_counts_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ["FUSEVOL_HTTP_PORT", "FUSEVOL_SOURCE", "FUSEVOL_MANIFESTS", "FUSEVOL_LOG_LEVEL"]:
        monkeypatch.setenv(name, "")
    args = build_parser().parse_args(["run"])
    assert (args.http_port, args.source, args.manifests, args.log_level) == (
        HttpSettings().port,
        None,
        None,
        "info",
    )


def test_the_defaults_are_the_settings() -> None:
    args = build_parser().parse_args(["run"])
    kube, http = KubeSettings(), HttpSettings()
    assert args.change_detection == kube.change_detection.value
    assert (args.sync_period, args.cache_ttl) == (kube.sync_period_s, kube.cache_ttl_s)
    assert (args.http_host, args.http_port) == (http.host, http.port)
    assert args.root == Path(DEFAULT_ROOT)
    assert args.kubelet_dir == Path(DEFAULT_KUBELET_DIR)
