"""systemd/fusevol.service and systemd/fusevol.env: checked by systemd itself, then setting by
setting against what the agent does.

`systemd-analyze verify` loads the unit as systemd would and checks that every command it runs
without a leading `-` is an executable file. ExecStart names the install location,
`/opt/fusevol/bin/fusevol`, which a test machine does not have, and the test must not create it
on the host. So the unit is verified under `--root` in a temporary directory that holds:
  - the unit, at `etc/systemd/system/fusevol.service`;
  - a copy of this host's `/usr/lib/systemd/system` (the targets the unit orders itself against:
    a `--root` resolves every unit name inside the root);
  - an executable stub at the install location only. Every other command the unit runs
    unconditionally is copied from the host, so a command this host lacks still fails.
`verify` exits 0 after merely printing an unknown key or an unparsable value, so any output at
all is a failure too; `test_verify_catches` shows each kind of mistake failing.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from fusevol.agent import app
from fusevol.base.settings import DEFAULT_ROOT
from fusevol.cli.parser import build_parser

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "fusevol.service"
ENV_FILE = REPO / "systemd" / "fusevol.env"
INSTALLED = "/opt/fusevol/bin/fusevol"
"""Where systemd/README.md installs the agent, and where ExecStart runs it from."""

NAMESPACE_OPTIONS = frozenset(
    {
        # A mount namespace of its own: the agent's mounts would not reach the host.
        *("PrivateMounts", "PrivateTmp", "PrivateDevices", "PrivateNetwork", "PrivateUsers"),
        *("PrivateIPC", "ProtectSystem", "ProtectHome", "ProtectKernelTunables"),
        *("ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups", "ProtectClock"),
        *("ProtectHostname", "ProtectProc", "ProcSubset", "ReadOnlyPaths", "ReadWritePaths"),
        *("InaccessiblePaths", "ExecPaths", "NoExecPaths", "TemporaryFileSystem", "BindPaths"),
        *("BindReadOnlyPaths", "RootDirectory", "RootImage", "MountImages", "ExtensionImages"),
        *("NetworkNamespacePath", "DynamicUser"),
        # Root, /dev/fuse and the capabilities the agent mounts with.
        *("User", "DeviceAllow", "DevicePolicy", "CapabilityBoundingSet"),
    }
)
"""Settings the unit must not have (PrivateMounts only as "no")."""

Unit = dict[str, dict[str, list[str]]]


def parse_unit(text: str) -> Unit:
    """A unit file as {section: {key: [values in order]}}: keys may repeat, lines may continue
    with a trailing backslash, `#` and `;` start comments (systemd.syntax(7))."""
    sections: Unit = {}
    current: dict[str, list[str]] = {}
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def parse_env_file(text: str, *, commented: bool = False) -> dict[str, str]:
    """NAME=value lines; with `commented`, also the examples written as `#NAME=value`."""
    pattern = r"^#?([A-Z_][A-Z0-9_]*)=(.*)$" if commented else r"^([A-Z_][A-Z0-9_]*)=(.*)$"
    return {m[1]: m[2] for m in re.finditer(pattern, text, re.MULTILINE)}


def timespan_s(value: str) -> float:
    """A systemd time span ("90s", "1min 30s", "5min", bare seconds) in seconds."""
    units = {"ms": 0.001, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600, "": 1}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units[unit]
    return total


def only(unit: Unit, section: str, key: str) -> str:
    values = unit[section].get(key, [])
    assert len(values) == 1, f"[{section}] {key}= should be set once, is {values}"
    return values[0]


def exec_argv(value: str) -> tuple[str, list[str]]:
    """An Exec*= value as (prefixes such as "-", argv)."""
    prefixes = re.match(r"^[-@:+!]*", value)
    assert prefixes is not None
    return prefixes[0], shlex.split(value[prefixes.end() :])


def run_verify(unit_text: str, root: Path) -> subprocess.CompletedProcess[str]:
    """`systemd-analyze verify` of `unit_text` under `--root`, as the module docstring says."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is missing: .ci/setup installs Debian's systemd package")
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    (root / "etc/systemd/system").mkdir(parents=True)
    (root / "etc/systemd/system/fusevol.service").write_text(unit_text)
    stub = root / INSTALLED.lstrip("/")
    stub.parent.mkdir(parents=True)
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    for key, values in parse_unit(unit_text)["Service"].items():
        for value in values if key.startswith("Exec") else ():
            prefixes, argv = exec_argv(value)
            program = shutil.which(argv[0])
            if "-" not in prefixes and argv[0] != INSTALLED and program is not None:
                copy = root / program.lstrip("/")
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(program, copy)
    return subprocess.run(
        [analyze, "verify", f"--root={root}", "--man=no", "fusevol.service"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="module")
def unit() -> Unit:
    return parse_unit(UNIT.read_text())


@pytest.fixture(scope="module")
def run_flags() -> set[str]:
    """The long flags of `fusevol run`, without their dashes."""
    subparsers = next(
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    run = subparsers.choices["run"]
    return {
        option[2:]
        for action in run._actions
        for option in action.option_strings
        if option.startswith("--")
    } - {"help"}


# -- systemd's own check ---------------------------------------------------------------------------


def test_verify_passes(tmp_path: Path) -> None:
    result = run_verify(UNIT.read_text(), tmp_path)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        pytest.param("Restart=always", "Restartt=always", "Unknown key", id="unknown-key"),
        pytest.param("KillMode=process", "KillMode=proces", "Failed to parse", id="bad-value"),
        pytest.param(
            f"ExecStart={INSTALLED} run",
            f"ExecStart={INSTALLED}x run",
            "is not executable",
            id="missing-program",
        ),
        pytest.param("Type=notify", "Type=notify\n[Bogus]\nX=1", "Unknown section", id="section"),
    ],
)
def test_verify_catches(tmp_path: Path, old: str, new: str, message: str) -> None:
    text, replaced = re.subn(f"^{re.escape(old)}$", new, UNIT.read_text(), count=1, flags=re.M)
    assert replaced == 1
    result = run_verify(text, tmp_path)
    assert message in result.stdout + result.stderr


# -- the settings, against what the agent does -----------------------------------------------------


def test_readiness_and_watchdog_over_the_notify_socket(unit: Unit) -> None:
    assert only(unit, "Service", "Type") == "notify"  # the agent sends READY=1 and STOPPING=1
    # The main process is `fusevol run`'s launcher; READY=1 and WATCHDOG=1 come from its child.
    assert only(unit, "Service", "NotifyAccess") == "all"
    watchdog_s = timespan_s(only(unit, "Service", "WatchdogSec"))
    assert 10 <= watchdog_s <= 120
    # Starting may take long (the first full read); the watchdog catches a hang meanwhile.
    assert timespan_s(only(unit, "Service", "TimeoutStartSec")) > max(90, watchdog_s)


def test_restarts_forever_and_stops_cleanly(unit: Unit) -> None:
    assert only(unit, "Service", "Restart") == "always"
    assert only(unit, "Unit", "StartLimitIntervalSec") == "0"
    assert timespan_s(only(unit, "Service", "RestartSec")) > 0
    assert (
        only(unit, "Service", "KillSignal") == "SIGTERM"
    )  # run_until_signalled's handing-over stop
    # Past the agent's own limit on unmounting, or systemd's SIGKILL cuts the clean stop short.
    assert timespan_s(only(unit, "Service", "TimeoutStopSec")) > app.STOP_TIMEOUT_S + 10


def test_only_the_agent_is_killed(unit: Unit) -> None:
    assert only(unit, "Service", "KillMode") == "process"


def test_mounts_land_in_the_host_namespace(unit: Unit) -> None:
    service = unit["Service"]
    assert service.get("PrivateMounts", ["no"]) == ["no"]
    assert service.get("MountFlags", ["shared"]) == ["shared"]
    present = sorted(NAMESPACE_OPTIONS & set(service) - {"PrivateMounts"})
    assert present == [], f"these would hide the agent's mounts or rights: {present}"


def test_ordering_and_limits(unit: Unit) -> None:
    assert "local-fs.target" in " ".join(unit["Unit"]["Requires"]).split()
    assert "local-fs.target" in " ".join(unit["Unit"]["After"]).split()
    assert "network-online.target" in " ".join(unit["Unit"]["After"]).split()
    assert int(only(unit, "Service", "LimitNOFILE")) >= 65536
    assert only(unit, "Install", "WantedBy") == "multi-user.target"


def test_exec_start_takes_every_setting_from_the_environment(unit: Unit) -> None:
    assert exec_argv(only(unit, "Service", "ExecStart")) == ("", [INSTALLED, "run"])
    assert only(unit, "Service", "EnvironmentFile") == "-/etc/default/fusevol"
    assert only(unit, "Service", "Environment") == f"FUSEVOL_ROOT={DEFAULT_ROOT}"


def test_the_fuse_connection_is_kept_in_the_fd_store_and_never_unmounted_on_stop(
    unit: Unit,
) -> None:
    """The agent stores two descriptors (fusevol.agent.launcher FDNAME_*); a restart after a crash
    takes the connection over, so nothing may detach the FUSE mount when the service stops."""
    assert int(only(unit, "Service", "FileDescriptorStoreMax")) >= 2
    assert "ExecStopPost" not in unit["Service"]


# -- the environment file --------------------------------------------------------------------------


def test_env_file_sets_only_flags_of_run(run_flags: set[str]) -> None:
    names = parse_env_file(ENV_FILE.read_text(), commented=True)
    flags = {name.removeprefix("FUSEVOL_").lower().replace("_", "-") for name in names}
    assert all(name.startswith("FUSEVOL_") for name in names)
    assert flags - run_flags == set(), "an unknown variable would be silently ignored"
    assert run_flags - flags == set(), "every flag of `fusevol run` is shown in the file"


def test_env_file_is_what_the_cli_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = parse_env_file(ENV_FILE.read_text())
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(["run"])
    assert args.root == Path(settings["FUSEVOL_ROOT"]) == Path(DEFAULT_ROOT)
    assert args.manifests == Path(settings["FUSEVOL_MANIFESTS"])
    assert args.log_level == settings["FUSEVOL_LOG_LEVEL"]
    assert settings["FUSEVOL_HTTP_PORT"] == "9842"
    assert all(re.fullmatch(r"[^\s\"'$`\\]*", value) for value in settings.values())
