"""The agent as kubelet's volume manager: all volume types under one reconciler, restarts."""

from __future__ import annotations

import itertools
import json
import os
import re
from datetime import datetime
from pathlib import Path

from tests.agent import AgentProcess, mounts_below, running_agent, wait_for

HELPERS = Path(__file__).resolve().parent.parent / "helpers"


def uid(i: int) -> str:
    return f"00000000-0000-4000-8000-{i:012d}"


def pod(i: int, volumes: str, mounts: str = "") -> str:
    return f"""
kind: Pod
metadata: {{name: pod-{i}, namespace: default, uid: {uid(i)}}}
spec:
  containers: [{{name: c{mounts}}}]
  volumes:
{volumes}
---
"""


SHARED = """
kind: ConfigMap
metadata: {name: app}
data: {a: "1"}
---
kind: Secret
metadata: {name: creds}
stringData: {token: t}
---
"""


def mount_ids(root: Path) -> dict[str, str]:
    """Mount point -> mount ID, for every mount below `root`."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        rows = [line.split() for line in f]
    prefix = str(root) + "/"
    return {row[4]: row[0] for row in rows if row[4].startswith(prefix)}


# -- restart ---------------------------------------------------------------------------------------


def test_kill_9_then_restart_adopts_what_is_still_desired(tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "data").write_text("local data")
    (manifests / "shared.yaml").write_text(
        SHARED
        + f"""
kind: PersistentVolume
metadata: {{name: pv-local}}
spec:
  local: {{path: {disk}}}
  claimRef: {{namespace: default, name: data}}
---
kind: PersistentVolumeClaim
metadata: {{name: data}}
spec: {{volumeName: pv-local}}
"""
    )
    volumes = """\
    - {name: scratch, emptyDir: {medium: Memory}}
    - {name: data, persistentVolumeClaim: {claimName: data}}
    - {name: config, configMap: {name: app}}"""
    for i in range(20):
        (manifests / f"pod-{i}.yaml").write_text(pod(i, volumes))
    root = tmp_path / "root"

    with running_agent(manifests, root) as first:
        for i in range(20):
            first.wait_state(uid(i), "config", "mounted", timeout_s=30)
            first.wait_state(uid(i), "scratch", "mounted", timeout_s=30)
            first.wait_state(uid(i), "data", "mounted", timeout_s=30)
        for i in range(20):
            scratch = first.volume(uid(i), "empty-dir", "scratch")
            (scratch / "written-before").write_text(f"pod {i}")
        before = mount_ids(root)
        first.kill()
        (manifests / "pod-19.yaml").unlink()

        with running_agent(manifests, root) as second:
            wait_for(lambda: not (root / "pods" / uid(19)).exists(), timeout_s=30)
            for i in range(19):
                second.wait_state(uid(i), "config", "mounted", timeout_s=30)
            after = mount_ids(root)
            for i in range(19):
                scratch = second.volume(uid(i), "empty-dir", "scratch")
                local = second.volume(uid(i), "local-volume", "pv-local")
                # Adopted: the same mounts (IDs unchanged), the same content.
                assert after[str(scratch)] == before[str(scratch)]
                assert after[str(local)] == before[str(local)]
                assert (scratch / "written-before").read_text() == f"pod {i}"
                assert (local / "data").read_text() == "local data"
                # Served again from memory, with the same content.
                assert (second.volume(uid(i), "configmap", "config") / "a").read_text() == "1"
            assert not [p for p in after if f"/{uid(19)}/" in p]
            assert (disk / "data").read_text() == "local data"  # the removed pod's PV is intact
            second.stop()


# -- churn -----------------------------------------------------------------------------------------


def test_200_pods_with_3_volumes_leave_nothing_behind(tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "shared.yaml").write_text(SHARED)
    volumes = """\
    - {name: config, configMap: {name: app}}
    - {name: creds, secret: {secretName: creds}}
    - {name: scratch, emptyDir: {}}"""
    with running_agent(manifests, tmp_path / "root") as agent:
        baseline = agent.snapshot()["statistics"]["fuse_tree"]["nodes"]
        (manifests / "pods.yaml").write_text("".join(pod(i, volumes) for i in range(200)))
        wait_for(lambda: len(mounts_below(agent.root / "pods")) == 400, timeout_s=120)
        for i in (0, 99, 199):
            agent.wait_state(uid(i), "scratch", "mounted", timeout_s=60)
        (manifests / "pods.yaml").unlink()
        wait_for(lambda: not list((agent.root / "pods").iterdir()), timeout_s=120)
        assert mounts_below(agent.root / "pods") == []
        wait_for(
            lambda: agent.snapshot()["statistics"]["fuse_tree"]["nodes"] == baseline, timeout_s=10
        )
        wait_for(lambda: agent.snapshot()["statistics"]["executor"]["pending"] == 0)
        agent.stop()


# -- failures and backoff --------------------------------------------------------------------------

_ATTEMPT = re.compile(
    r"^(\d\d:\d\d:\d\d\.\d{3}) .* mount failed volume=\S+config .*retry_in=(\S+)s"
)


LOG_SLACK_S = 0.05


def test_missing_object_is_retried_on_kubelets_backoff(tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "pod.yaml").write_text(pod(1, "    - {name: config, configMap: {name: later}}"))
    with running_agent(
        manifests, tmp_path / "root", expect_log=('mount failed .*configmap "later" not found',)
    ) as agent:
        wait_for(lambda: len(_attempts(agent)) >= 5, timeout_s=20)
        attempts = _attempts(agent)
        assert [delay for _, delay in attempts[:5]] == [0.5, 1.0, 2.0, 4.0, 8.0]
        # The log records' clock lags each failure by the time the agent takes to format it
        # (tens of ms on a loaded machine) and shows whole ms: LOG_SLACK_S for that. The exact
        # backoff times are checked on trio's clock in tests/unit/test_executor.py.
        for (t0, delay), (t1, _) in itertools.pairwise(attempts):
            assert delay - LOG_SLACK_S <= t1 - t0 < delay + 0.5, (t0, t1, delay)
        assert agent.volume_status(uid(1), "config")["last_error"] == 'configmap "later" not found'

        (manifests / "later.yaml").write_text("kind: ConfigMap\nmetadata: {name: later}\n")
        agent.wait_state(uid(1), "config", "mounted", timeout_s=2)  # at once, not after 16 s
        agent.stop()


def _attempts(agent: AgentProcess) -> list[tuple[float, float]]:
    found = []
    for line in agent.log_text().splitlines():
        match = _ATTEMPT.match(line)
        if match:
            clock = datetime.strptime(match[1], "%H:%M:%S.%f")
            seconds = clock.hour * 3600 + clock.minute * 60 + clock.second + clock.microsecond / 1e6
            found.append((seconds, float(match[2])))
    return found


def test_unbound_claim_waits_for_its_volume(tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    disk = tmp_path / "disk"
    disk.mkdir()
    (manifests / "claim.yaml").write_text("kind: PersistentVolumeClaim\nmetadata: {name: data}\n")
    (manifests / "pod.yaml").write_text(
        pod(1, "    - {name: data, persistentVolumeClaim: {claimName: data}}")
    )
    with running_agent(
        manifests,
        tmp_path / "root",
        expect_log=("mount failed .*PVC default/data is not bound to a volume",),
    ) as agent:
        wait_for(lambda: agent.volume_status(uid(1), "data").get("state") == "failed")
        error = agent.volume_status(uid(1), "data")["last_error"]
        assert error == "PVC default/data is not bound to a volume"
        (manifests / "pv.yaml").write_text(
            f"kind: PersistentVolume\nmetadata: {{name: pv-1}}\nspec: {{local: {{path: {disk}}}}}\n"
        )
        (manifests / "claim.yaml").write_text(
            "kind: PersistentVolumeClaim\nmetadata: {name: data}\nspec: {volumeName: pv-1}\n"
        )
        agent.wait_state(uid(1), "data", "mounted")
        assert str(agent.volume(uid(1), "local-volume", "pv-1")) in mounts_below(agent.root)
        agent.stop()


# -- nfs through a recording mount helper ----------------------------------------------------------


def test_nfs_argv_inline_pv_and_annotation(tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    log = tmp_path / "argv.jsonl"
    (manifests / "nfs.yaml").write_text(
        """
kind: PersistentVolume
metadata:
  name: pv-nfs
  annotations: {volume.beta.kubernetes.io/mount-options: "nfsvers=4.2,hard"}
spec:
  nfs: {server: nfs.example, path: /exports/pv}
  mountOptions: [soft]
---
kind: PersistentVolumeClaim
metadata: {name: shared}
spec: {volumeName: pv-nfs}
---
"""
        + pod(
            1,
            """\
    - {name: inline, nfs: {server: 10.1.2.3, path: /exports/inline, readOnly: true}}
    - {name: claimed, persistentVolumeClaim: {claimName: shared}}""",
        )
    )
    env = {"PATH": f"{HELPERS}:{os.environ['PATH']}", "FUSEVOL_TEST_MOUNT_LOG": str(log)}
    with running_agent(manifests, tmp_path / "root", env=env) as agent:
        agent.wait_state(uid(1), "inline", "mounted")
        agent.wait_state(uid(1), "claimed", "mounted")
        argvs = {tuple(json.loads(line)) for line in log.read_text().splitlines()}
        inline = agent.volume(uid(1), "nfs", "inline")
        claimed = agent.volume(uid(1), "nfs", "pv-nfs")
        assert ("mount", "-t", "nfs", "-o", "ro", "10.1.2.3:/exports/inline", str(inline)) in argvs
        assert (
            "mount",
            "-t",
            "nfs",
            "-o",
            "hard,nfsvers=4.2",
            "nfs.example:/exports/pv",
            str(claimed),
        ) in argvs
        agent.stop()


def test_failed_nfs_mount_leaves_no_dir_and_no_mount(tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "pod.yaml").write_text(
        pod(1, "    - {name: inline, nfs: {server: nfs.example, path: /x}}")
    )
    env = {
        "PATH": f"{HELPERS}:{os.environ['PATH']}",
        "FUSEVOL_TEST_MOUNT_LOG": str(tmp_path / "argv.jsonl"),
        "FUSEVOL_TEST_MOUNT_EXIT": "32",
    }
    with running_agent(
        manifests,
        tmp_path / "root",
        env=env,
        expect_log=("mount failed .*mount: simulated failure",),
    ) as agent:
        wait_for(lambda: agent.volume_status(uid(1), "inline").get("state") == "failed")
        assert "exit status 32" in str(agent.volume_status(uid(1), "inline")["last_error"])
        assert not agent.volume(uid(1), "nfs", "inline").exists()
        assert mounts_below(agent.root / "pods") == []
        agent.stop()


# -- nested mountpoints ----------------------------------------------------------------------------


def test_nested_mountpoint_directory_survives_updates(tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "shared.yaml").write_text(SHARED)
    mounts = """,
    volumeMounts: [{name: config, mountPath: /etc/app},
                   {name: creds, mountPath: /etc/app/secrets/inner}]"""
    (manifests / "pod.yaml").write_text(
        pod(
            1,
            "    - {name: config, configMap: {name: app}}\n"
            "    - {name: creds, secret: {secretName: creds}}",
            mounts,
        )
    )
    with running_agent(manifests, tmp_path / "root") as agent:
        agent.wait_state(uid(1), "config", "mounted")
        config = agent.volume(uid(1), "configmap", "config")
        assert (config / "secrets").is_dir()
        assert not (config / "secrets").is_symlink()
        assert oct(os.stat(config / "secrets").st_mode & 0o7777) == oct(0o755)
        assert not (agent.volume(uid(1), "secret", "creds") / "inner").exists()
        (manifests / "shared.yaml").write_text(SHARED.replace('a: "1"', 'a: "2"'))
        wait_for(lambda: (config / "a").read_text() == "2")
        assert (config / "secrets").is_dir()
        agent.stop()
