"""Bad input dropped into a running agent: one clear error line naming the object and field,
everything else served unchanged.

One agent for most of the module, serving tests/manifests.py's pod. Each test drops its bad file
in, waits for the error line in the agent's log, and leaves the check of that pod to an autouse
fixture: same content, same `..data` target (no new version was published), and the agent still
running. The tests that remove one of the pod's own objects run an agent of their own.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from tests.agent import (
    AgentProcess,
    LogTail,
    mounts_below,
    running_agent,
    wait_for,
    write_atomically,
)
from tests.manifests import FILES, POD_UID, configmap, pod as pod_set_pod, write_pod_set
from tests.served import Snapshot, pod_set_snapshots

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@dataclass
class Served:
    agent: AgentProcess
    manifests: Path
    before: dict[tuple[str, str], Snapshot]
    scratch: Path

    def drop(self, name: str, content: str | bytes) -> LogTail:
        """Write a manifest atomically; returns a log tail that starts just before it."""
        tail = LogTail(self.agent.log_path)
        data = content.encode() if isinstance(content, str) else content
        tmp = self.manifests / f".{name}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, self.manifests / name)
        return tail

    def remove(self, name: str) -> None:
        (self.manifests / name).unlink(missing_ok=True)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("bad-input")
    manifests = base / "manifests"
    manifests.mkdir()
    write_pod_set(manifests)
    scratch = base / "scratch"
    scratch.mkdir()
    # Each test provokes and checks its own error lines: the source's rejections and the failed
    # set-ups are expected of this agent; anything else it logs at WARNING or above is not.
    expected = (
        r" ERROR fusevol\.source\.local: ",
        r" ERROR fusevol\.volumemanager\.reconciler\.executor: mount failed ",
    )
    with running_agent(manifests, base / "root", expect_log=expected) as agent:
        agent.wait_state(POD_UID, "config", "mounted")
        agent.wait_state(POD_UID, "creds", "mounted")
        yield Served(agent, manifests, pod_set_snapshots(agent), scratch)
        agent.stop()


@pytest.fixture(autouse=True)
def _healthy_pod_untouched(served: Served) -> Iterator[None]:
    yield
    assert served.agent.process is not None
    assert served.agent.process.poll() is None, served.agent.log_text()[-3000:]
    assert pod_set_snapshots(served.agent) == served.before


def pod(name: str, uid: str, volumes: str, *, node: str = "") -> str:
    """A pod whose last volume is always the healthy ConfigMap, to show it is still served."""
    node_field = f"  nodeName: {node}\n" if node else ""
    return (
        f"kind: Pod\nmetadata: {{name: {name}, namespace: default, uid: {uid}}}\n"
        f"spec:\n{node_field}  containers: [{{name: c}}]\n  volumes:\n{volumes}"
        "    - {name: also, configMap: {name: app}}\n"
    )


def error_line(tail: LogTail, *parts: str) -> str:
    return tail.wait_line(" ERROR ", *parts)


# -- rejected when the file is read ---------------------------------------------------------------

MANIFEST_ERRORS = [
    pytest.param(
        "yaml.yaml",
        "kind: ConfigMap\nmetadata: {name: x\n  data: [",
        ["invalid YAML"],
        id="malformed-yaml",
    ),
    pytest.param(
        "json.json",
        '{"kind": "ConfigMap", "metadata": {"name": "x"}',
        ["invalid JSON"],
        id="malformed-json",
    ),
    pytest.param(
        "latin1.yaml",
        b"kind: ConfigMap\nmetadata: {name: caf\xe9}\n",
        ["not valid UTF-8"],
        id="non-utf8",
    ),
    pytest.param(
        "nul.yaml",
        b"kind: ConfigMap\nmetadata: {name: a\x00}\n",
        ["invalid YAML", "#x0000"],
        id="nul-byte",
    ),
    pytest.param(
        "dotdot-key.yaml",
        "kind: ConfigMap\nmetadata: {name: other}\ndata: {..data: evil}\n",
        ["configmap default/other", 'data["..data"]', "must not start with '..'"],
        id="key-dotdot",
    ),
    pytest.param(
        "slash-key.yaml",
        "kind: ConfigMap\nmetadata: {name: other}\ndata: {../../etc/passwd: evil}\n",
        ["configmap default/other", 'data["../../etc/passwd"]', "a valid config key"],
        id="key-slash",
    ),
    pytest.param(
        "big.yaml",
        "kind: ConfigMap\nmetadata: {name: big}\ndata:\n  k: " + "x" * (1024 * 1024) + "\n",
        ["configmap default/big", "data: Too long", "1048576"],
        id="over-1MiB",
    ),
    pytest.param(
        "twice.yaml",
        "kind: ConfigMap\nmetadata: {name: t}\n---\nkind: ConfigMap\nmetadata: {name: t}\n",
        ["configmap default/t", "defined twice"],
        id="defined-twice",
    ),
]


@pytest.mark.parametrize(("name", "content", "parts"), MANIFEST_ERRORS)
def test_rejected_file_names_file_object_and_field(
    served: Served, name: str, content: str | bytes, parts: list[str]
) -> None:
    tail = served.drop(name, content)
    line = error_line(tail, str(served.manifests / name))
    assert "manifest rejected" in line
    for part in parts:
        assert part in line, line
    assert not list((served.agent.root / "pods").glob("bbbbbbbb-*"))  # no pod of a rejected file
    served.remove(name)


def test_unknown_kind_is_skipped_without_an_error(served: Served) -> None:
    tail = served.drop(
        "deploy.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n"
    )
    tail.wait_line("skipped kind='Deployment'")
    tail.wait_line("manifest read", "deploy.yaml", "objects=0")
    assert " ERROR " not in tail.read_new() + tail.text
    served.remove("deploy.yaml")


@pytest.mark.parametrize(
    "bad_edit",
    [
        pytest.param(configmap() + "  ..data: evil\n", id="reserved-key"),
        pytest.param(configmap() + "  huge: " + "x" * (1024 * 1024) + "\n", id="over-1MiB"),
        pytest.param(configmap().replace("kind: ConfigMap", "kind: [ConfigMap"), id="yaml"),
    ],
)
def test_bad_edit_of_a_served_object_keeps_its_last_version(served: Served, bad_edit: str) -> None:
    tail = served.drop("configmap.yaml", bad_edit)
    error_line(tail, "manifest rejected", "configmap.yaml")
    served.agent.wait_reconciled()  # a wrongly accepted edit would be published by then
    write_atomically(served.manifests / "configmap.yaml", configmap())
    tail.wait_line("manifest read", "configmap.yaml", "objects=1")


def test_second_definition_in_another_file_changes_nothing(served: Served) -> None:
    shadow = configmap(a="hijacked")
    tail = served.drop("zz-shadow.yaml", shadow)
    line = error_line(tail, "zz-shadow.yaml", "configmap default/app", "already defined in")
    assert str(served.manifests / "configmap.yaml") in line
    served.remove("zz-shadow.yaml")
    tail.wait_line("manifest read", "zz-shadow.yaml", "removed=True")


# -- accepted files whose volumes cannot be served ------------------------------------------------


def _wait_failed(served: Served, uid: str, volume: str, tail: LogTail) -> str:
    line = error_line(tail, "mount failed", f"{uid}-{volume}")
    served.agent.wait_state(uid, volume, "failed")
    # The pod's other volume is served meanwhile.
    also = served.agent.wait_mounted(served.agent.volume(uid, "configmap", "also"))
    assert (also / "a").read_bytes() == b"alpha"
    return line


SETUP_ERRORS = [
    pytest.param(
        "    - {name: bad, configMap: {name: app, items: [{key: nope, path: x}]}}\n",
        "configmap references non-existent config key: nope",
        id="missing-key",
    ),
    pytest.param(
        "    - {name: bad, secret: {secretName: creds, items: [{key: nope, path: x}]}}\n",
        "references non-existent secret key: nope",
        id="missing-secret-key",
    ),
    pytest.param(
        "    - {name: bad, configMap: {name: app, items: [{key: a, path: " + "n" * 256 + "}]}}\n",
        "file names must be no more than 255 bytes, not 256",
        id="name-256-bytes",
    ),
    pytest.param(
        "    - {name: bad, configMap: {name: app, items: [{key: a, path: "
        + "/".join(["d" * 254] * 16)
        + "/"
        + "f" * 17
        + "}]}}\n",
        "must be no more than 4096 bytes, not 4097",
        id="path-4097-bytes",
    ),
    pytest.param(
        '    - {name: bad, configMap: {name: app, items: [{key: a, path: "a\\0b"}]}}\n',
        "must not contain NUL",
        id="path-nul",
    ),
    pytest.param(
        "    - {name: bad, cephfs: {monitors: ['10.0.0.1:6789']}}\n",
        "volume type 'cephfs' is not supported by fusevol",
        id="unknown-volume-type",
    ),
    pytest.param(
        "    - {name: bad, persistentVolumeClaim: {claimName: nowhere}}\n",
        'persistentvolumeclaim "nowhere" not found',
        id="missing-claim",
    ),
    # A source the API server would refuse: the file is read, that volume fails naming its field.
    pytest.param(
        "    - {name: bad, configMap: {name: app, items: [{key: a, path: /etc/passwd}]}}\n",
        'spec.volumes[0].configMap.items[0].path: invalid value "/etc/passwd": must be a '
        "relative path",
        id="item-path-absolute",
    ),
    pytest.param(
        "    - {name: bad, configMap: {name: app, items: [{key: a, path: ../x}]}}\n",
        "spec.volumes[0].configMap.items[0].path: invalid value \"../x\": must not contain '..'",
        id="item-path-dotdot",
    ),
    pytest.param(
        "    - {name: bad, secret: {secretName: creds, defaultMode: 01777}}\n",
        "spec.volumes[0].secret.defaultMode: must be a number between 0 and 0777 (octal), "
        "both inclusive",
        id="mode-out-of-range",
    ),
    pytest.param(
        "    - name: bad\n      projected:\n        sources:\n"
        "          - configMap: {name: app, items: [{key: a, path: same}]}\n"
        "          - secret: {name: creds, items: [{key: token, path: same}]}\n",
        'spec.volumes[0].projected: invalid value "creds": conflicting duplicate paths',
        id="duplicate-item-paths",
    ),
    pytest.param(
        "    - {name: bad, hostPath: {path: /tmp/../etc, type: Directory}}\n",
        "spec.volumes[0].hostPath.path: invalid value \"/tmp/../etc\": must not contain '..'",
        id="hostPath-dotdot",
    ),
]


@pytest.mark.parametrize(("volume", "message"), SETUP_ERRORS)
def test_volume_that_cannot_be_served_fails_alone(
    served: Served, request: pytest.FixtureRequest, volume: str, message: str
) -> None:
    index = [p.id for p in SETUP_ERRORS].index(request.node.callspec.id)
    uid = f"cccccccc-0000-4000-8000-{index:012d}"
    name = f"setup-{index}"
    tail = served.drop(f"{name}.yaml", pod(name, uid, volume))
    line = _wait_failed(served, uid, "bad", tail)
    assert message in line, line
    assert message in str(served.agent.volume_status(uid, "bad")["last_error"])
    assert not served.agent.volume(uid, "configmap", "bad").exists()
    served.remove(f"{name}.yaml")
    wait_for(lambda: not (served.agent.root / "pods" / uid).exists())


def test_failed_volume_logs_one_error_line_across_retries(served: Served) -> None:
    uid = "cccccccc-1111-4000-8000-000000000001"
    tail = served.drop(
        "retries.yaml",
        pod(
            "retries",
            uid,
            "    - {name: bad, configMap: {name: app, items: [{key: k, path: x}]}}\n",
        ),
    )
    _wait_failed(served, uid, "bad", tail)
    tail.wait_line("DEBUG", "mount failed", f"{uid}-bad", "retry_in=2s", timeout_s=5)  # 3 tries
    errors = [line for line in tail.text.splitlines() if " ERROR " in line and uid in line]
    assert len(errors) == 1, errors
    served.remove("retries.yaml")
    wait_for(lambda: not (served.agent.root / "pods" / uid).exists())


def test_setup_error_line_names_the_pod_and_its_file(served: Served) -> None:
    uid = "cccccccc-2222-4000-8000-000000000001"
    tail = served.drop(
        "named.yaml",
        pod(
            "named", uid, "    - {name: bad, configMap: {name: app, items: [{key: k, path: x}]}}\n"
        ),
    )
    try:
        line = _wait_failed(served, uid, "bad", tail)
        assert "default/named" in line, line
        assert "named.yaml" in line, line
    finally:
        served.remove("named.yaml")
        wait_for(lambda: not (served.agent.root / "pods" / uid).exists())


def test_ten_thousand_keys_are_served(served: Served) -> None:
    uid = "dddddddd-0000-4000-8000-000000000001"
    data = "".join(f"  k{i}: v{i}\n" for i in range(10_000))
    served.drop("many.yaml", f"kind: ConfigMap\nmetadata: {{name: many}}\ndata:\n{data}")
    served.drop("many-pod.yaml", pod("many", uid, "    - {name: many, configMap: {name: many}}\n"))
    volume = served.agent.wait_mounted(served.agent.volume(uid, "configmap", "many"), timeout_s=60)
    names = os.listdir(volume)
    assert len(names) == 10_000 + 2  # the keys, ..data and one version directory
    for i in (0, 1234, 9999):
        assert (volume / f"k{i}").read_bytes() == f"v{i}".encode()
    served.remove("many-pod.yaml")
    served.remove("many.yaml")
    wait_for(lambda: not (served.agent.root / "pods" / uid).exists(), timeout_s=30)


# -- symlink tricks in hostPath and local paths ---------------------------------------------------


def _host_path_pod(name: str, uid: str, path: Path, kind: str) -> str:
    return pod(name, uid, f"    - {{name: bad, hostPath: {{path: '{path}', type: {kind}}}}}\n")


def test_host_path_type_checks_follow_symlinks_and_create_nothing(served: Served) -> None:
    scratch = served.scratch / "hostpath"
    scratch.mkdir()
    (scratch / "file").write_text("f")
    (scratch / "dir").mkdir()
    (scratch / "to-file").symlink_to(scratch / "file")
    (scratch / "to-dir").symlink_to(scratch / "dir")
    (scratch / "dangling-dir").symlink_to(scratch / "made-dir")
    (scratch / "dangling-file").symlink_to(scratch / "made-file")
    cases = [
        ("to-file", "Directory", "is not a directory"),
        ("to-dir", "File", "is not a file"),
        ("dangling-dir", "DirectoryOrCreate", "is not a directory"),
        ("dangling-file", "FileOrCreate", "is not a file"),
    ]
    for index, (link, kind, message) in enumerate(cases):
        uid = f"eeeeeeee-0000-4000-8000-{index:012d}"
        tail = served.drop(
            f"hp-{index}.yaml", _host_path_pod(f"hp-{index}", uid, scratch / link, kind)
        )
        line = _wait_failed(served, uid, "bad", tail)
        assert f"hostPath type check failed: {scratch / link} {message}" in line, line
    # The OrCreate types did not create anything through a dangling symlink.
    assert not (scratch / "made-dir").exists()
    assert not (scratch / "made-file").exists()
    # A symlink to the right type is accepted, as kubelet does.
    ok_uid = "eeeeeeee-1111-4000-8000-000000000000"
    served.drop("hp-ok.yaml", _host_path_pod("hp-ok", ok_uid, scratch / "to-dir", "Directory"))
    served.agent.wait_state(ok_uid, "bad", "mounted")
    for index in range(len(cases)):
        served.remove(f"hp-{index}.yaml")
    served.remove("hp-ok.yaml")
    for index in range(len(cases)):
        uid = f"eeeeeeee-0000-4000-8000-{index:012d}"
        wait_for(lambda u=uid: not (served.agent.root / "pods" / u).exists())  # type: ignore[misc]
    wait_for(lambda: not (served.agent.root / "pods" / ok_uid).exists())


LOCAL_PV = """\
kind: PersistentVolume
metadata: {{name: {name}}}
spec:
  local: {{path: '{path}'}}
  claimRef: {{namespace: default, name: {name}}}
---
kind: PersistentVolumeClaim
metadata: {{name: {name}}}
spec: {{volumeName: {name}}}
"""


def test_teardown_never_follows_symlinks_out_of_a_volume(served: Served) -> None:
    """A container plants symlinks to the host in its emptyDir and local volume; removing the
    pod unmounts and deletes only what is inside the volume."""
    scratch = served.scratch / "teardown"
    outside = scratch / "outside"
    outside.mkdir(parents=True)
    (outside / "precious").write_text("keep me")
    disk = scratch / "disk"
    disk.mkdir()
    (disk / "on-disk").write_text("keep me too")
    (scratch / "disk-link").symlink_to(disk)
    uid = "ffffffff-0000-4000-8000-000000000001"
    served.drop("local-pv.yaml", LOCAL_PV.format(name="pv-link", path=scratch / "disk-link"))
    served.drop(
        "planted.yaml",
        pod(
            "planted",
            uid,
            "    - {name: scratch, emptyDir: {}}\n"
            "    - {name: data, persistentVolumeClaim: {claimName: pv-link}}\n",
        ),
    )
    root = served.agent.root / "pods" / uid / "volumes"
    empty_dir = root / "kubernetes.io~empty-dir" / "scratch"
    local = served.agent.wait_mounted(root / "kubernetes.io~local-volume" / "pv-link")
    wait_for(empty_dir.is_dir)
    assert (local / "on-disk").read_text() == "keep me too"  # the bind followed the link
    (empty_dir / "escape").symlink_to(outside)
    (empty_dir / "sub").mkdir()
    (empty_dir / "sub" / "escape-file").symlink_to(outside / "precious")
    (local / "escape").symlink_to(outside)
    served.remove("planted.yaml")
    wait_for(lambda: not (served.agent.root / "pods" / uid).exists())
    assert (outside / "precious").read_text() == "keep me"
    assert (disk / "on-disk").read_text() == "keep me too"
    assert (scratch / "disk-link").is_symlink()
    assert mounts_below(scratch) == []
    served.remove("local-pv.yaml")


# -- secrets in error lines -----------------------------------------------------------------------


def test_bad_secret_edit_never_logs_the_value(served: Served) -> None:
    marker = base64.b32encode(os.urandom(10)).decode().lower()
    tail = served.drop(
        "leak.yaml",
        f"kind: Secret\nmetadata: {{name: leak}}\nstringData:\n  token: !!int {marker}\n",
    )
    error_line(tail, "manifest rejected", "leak.yaml")
    served.remove("leak.yaml")
    assert marker not in served.agent.log_text()


def test_special_files_in_the_manifest_directory_are_skipped(served: Served) -> None:
    """A FIFO (whose open would block), a symlink to /dev/zero (endless) and a directory, all
    with manifest names: none is read as a manifest, and the agent keeps watching."""
    tail = LogTail(served.agent.log_path)
    os.mkfifo(served.manifests / "fifo.yaml")
    (served.manifests / "zero.yaml").symlink_to("/dev/zero")
    (served.manifests / "dir.yaml").mkdir()
    tail.wait_line("manifest read", "zero.yaml", "removed=True")
    # The watch still works: a real file after them is read.
    served.drop("after-special.yaml", "kind: ConfigMap\nmetadata: {name: after-special}\n")
    tail.wait_line("manifest read", "after-special.yaml", "objects=1")
    assert "fifo.yaml" not in tail.text
    assert "dir.yaml" not in tail.text
    for name in ("fifo.yaml", "zero.yaml", "after-special.yaml"):
        served.remove(name)
    (served.manifests / "dir.yaml").rmdir()


def test_second_agent_on_the_same_root_says_so_in_one_line(served: Served) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fusevol",
            "run",
            "--manifests",
            str(served.manifests),
            "--root",
            str(served.agent.root),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    lock = served.agent.root / "fusevol" / "lock"
    assert result.stderr.splitlines() == [
        f"fusevol: another fusevol agent is using {lock} (pid {served.agent.pid})"
    ]


# -- one of the served pod's own objects missing ---------------------------------------------------

OTHER_UID = "77777777-2222-4333-8444-555555555555"


def _served_untouched(agent: AgentProcess) -> None:
    for (plugin, volume), files in FILES.items():
        for name, content in files.items():
            assert (agent.volume(POD_UID, plugin, volume) / name).read_bytes() == content


def test_missing_configmap_is_retried_until_it_appears(
    agent: AgentProcess, manifests: Path
) -> None:
    agent.expect_log(r"mount failed .*configmap \"later\" not found")
    needs = pod_set_pod(name="needs", uid=OTHER_UID).replace("{name: app}", "{name: later}")
    (manifests / "needs.yaml").write_text(needs)
    wait_for(lambda: agent.volume_status(OTHER_UID, "config").get("state") == "failed")
    status = agent.volume_status(OTHER_UID, "config")
    assert status["last_error"] == 'configmap "later" not found'
    assert 'configmap "later" not found' in agent.log_text()
    # The pod's other volume is served meanwhile, and so is everything else.
    agent.wait_mounted(agent.volume(OTHER_UID, "secret", "creds"))
    _served_untouched(agent)

    (manifests / "later.yaml").write_text(
        "kind: ConfigMap\nmetadata: {name: later}\ndata: {k: here}\n"
    )
    volume = agent.wait_mounted(agent.volume(OTHER_UID, "configmap", "config"), timeout_s=5)
    assert (volume / "k").read_text() == "here"


def test_deleted_object_keeps_the_files_of_running_pods(
    agent: AgentProcess, manifests: Path
) -> None:
    agent.expect_log(r"configmap \"app\" not found")
    (manifests / "configmap.yaml").unlink()
    wait_for(lambda: agent.volume_status(POD_UID, "config").get("state") == "update-failed")
    assert agent.volume_status(POD_UID, "config")["last_error"] == 'configmap "app" not found'
    _served_untouched(agent)
