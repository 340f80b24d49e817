"""A pod's containers run by containerd without kubelet, with the mounts `fusevol mounts` gives:
`fusevol wait`, then `ctr run` with `fusevol mounts --format ctr` for each container.

One container mounts the whole configMap volume; the other mounts a key by `subPath` and a nested
directory by `subPathExpr` (a downward-API label in its env), through the subPath views, which
follow the current version (kubelet's subPath never updates). A third runs with the second's
mounts but a plain rbind (rprivate) instead of rslave. Everything is read from inside the
containers: `ctr task exec` as uid 1000, and loops writing a line per change (LineClock).
"""

from __future__ import annotations

import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.agent import (
    AgentProcess,
    force_stop,
    mounts_below,
    running_agent,
    wait_for,
    write_atomically,
)
from tests.containerd.runtime import Containerd, LineClock, bind, needs_containerd

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytestmark = [needs_containerd, pytest.mark.containerd]

UID = "cccccccc-0000-4000-8000-000000000019"
FILLER = "".join(f"line {i:04d} of the properties file\n" for i in range(3000))
"""About 100 KiB: more than one read of a reader holding the file open."""


def configmap(version: str) -> str:
    return f"""\
apiVersion: v1
kind: ConfigMap
metadata: {{name: web-config, namespace: default}}
data:
  app.properties: |
    version={version}
{"".join("    " + line + chr(10) for line in FILLER.splitlines())}
  front.conf: "conf={version}"
"""


POD = f"""\
apiVersion: v1
kind: Pod
metadata: {{name: web, namespace: default, uid: {UID}, labels: {{tier: front}}}}
spec:
  containers:
    - name: whole
      volumeMounts: [{{name: config, mountPath: /etc/config}}]
    - name: parts
      env:
        - {{name: TIER, valueFrom: {{fieldRef: {{fieldPath: "metadata.labels['tier']"}}}}}}
      volumeMounts:
        - {{name: config, mountPath: /etc/app.properties, subPath: app.properties}}
        - {{name: config, mountPath: /etc/conf, subPathExpr: "conf/$(TIER)"}}
  volumes:
    - name: config
      configMap:
        name: web-config
        items:
          - {{key: app.properties, path: app.properties}}
          - {{key: front.conf, path: conf/front/app.conf}}
"""

CHANGES = (
    'last=; while :; do read -r a < {file}; b=$(cat {conf} 2>&1); v="$a $b";'
    ' if [ "$v" != "$last" ]; then echo "$v"; last=$v; fi; usleep 20000; done >> /out/changes'
)
"""A line per change of the file's first line and of the nested directory's file."""
WHOLE_LOOP = CHANGES.format(
    file="/etc/config/app.properties", conf="/etc/config/conf/front/app.conf"
)
PARTS_LOOP = (
    # A reader opens the subPath file, reads its first line, holds it open until /out/go, then
    # reads the rest, with read(2) (dd; busybox's cat uses sendfile, which reads through the
    # page cache that all opens of the view share: README, "subPath views"); meanwhile a loop
    # notes each change of the file's first line and of the nested directory's file.
    "(exec 3</etc/app.properties; busybox dd bs=10 count=1 <&3 > /out/first 2>/dev/null;"
    " while [ ! -e /out/go ]; do usleep 10000; done;"
    " busybox dd bs=4096 <&3 > /out/rest 2>/dev/null; touch /out/done) & "
    + CHANGES.format(file="/etc/app.properties", conf="/etc/conf/app.conf")
)


def fusevol(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fusevol", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "config.yaml").write_text(configmap("1"))
    (manifests / "pod.yaml").write_text(POD)
    with running_agent(manifests, tmp_path / "root") as running:
        yield running


def ctr_mounts(root: Path, container: str) -> list[str]:
    """`fusevol mounts --format ctr` for `container`, as `--mount` values."""
    result = fusevol("mounts", "--root", str(root), "default/web", "--container", container)
    assert result.returncode == 0, result.stderr
    words = shlex.split(result.stdout)
    assert words[::2] == ["--mount"] * (len(words) // 2), words
    return words[1::2]


def test_containers_get_their_mounts_from_fusevol_and_subpaths_follow_updates(
    containerd: Containerd,
    rootfs: Path,
    agent: AgentProcess,
    tmp_path: Path,
    report: Callable[[str], None],
) -> None:
    waited = fusevol("wait", "--root", str(agent.root), "default/web", "--timeout", "30s")
    assert waited.returncode == 0, waited.stderr
    whole, parts = ctr_mounts(agent.root, "whole"), ctr_mounts(agent.root, "parts")
    assert whole == [
        f"type=bind,src={agent.volume(UID, 'configmap', 'config')},dst=/etc/config,"
        "options=rbind:ro:rslave"
    ]
    views = agent.root / "pods" / UID / "volume-subpaths" / "config" / "parts"
    assert parts == [
        f"type=bind,src={views / '0'},dst=/etc/app.properties,options=rbind:ro:rslave",
        f"type=bind,src={views / '1'},dst=/etc/conf,options=rbind:ro:rslave",
    ]
    private = [m.replace(":rslave", ":rprivate") for m in parts]
    outs = {name: tmp_path / f"out-{name}" for name in ("whole", "parts", "private")}
    for out in outs.values():
        out.mkdir()
    started = [
        containerd.run(
            "whole", rootfs, *whole, bind(outs["whole"], "/out", "rw"), command=_sh(WHOLE_LOOP)
        ),
        containerd.run(
            "parts", rootfs, *parts, bind(outs["parts"], "/out", "rw"), command=_sh(PARTS_LOOP)
        ),
        containerd.run(
            "private",
            rootfs,
            *private,
            bind(outs["private"], "/out", "rw"),
            command=_sh(PARTS_LOOP),
        ),
    ]
    clocks = {name: LineClock(out / "changes") for name, out in outs.items()}
    try:
        # Both containers read their mounts as uid 1000.
        for user in (1000, 0):
            result = containerd.exec("whole", "cat", "/etc/config/conf/front/app.conf", user=user)
            assert result.stdout == "conf=1", result
            head = containerd.exec("parts", "cat", "/etc/app.properties", user=user).stdout
            assert head == "version=1\n" + FILLER, head[:100]
            result = containerd.exec("parts", "cat", "/etc/conf/app.conf", user=user)
            assert result.stdout == "conf=1", result
        listing = containerd.exec("parts", "ls", "/etc/conf", user=1000).stdout.split()
        assert listing == ["app.conf"]
        for name in clocks:
            clocks[name].wait_for("version=1 conf=1", after=0)
        for name in ("parts", "private"):
            wait_for(lambda n=name: (outs[n] / "first").read_text() == "version=1\n")  # type: ignore[misc]

        # Edits: seen through the whole volume and through both views within 1 s.
        latencies: dict[str, list[float]] = {name: [] for name in clocks}
        for i in range(2, 12):
            edited = time.monotonic()
            write_atomically(agent.manifests / "config.yaml", configmap(str(i)))
            for name in clocks:
                at = clocks[name].wait_for(f"version={i} conf={i}", after=edited, timeout_s=5)
                latencies[name].append(at - edited)
            # A new open reads the new version whole (its size changes at version 10).
            for name in ("parts", "private"):
                result = containerd.exec(name, "cat", "/etc/app.properties", user=1000)
                assert result.stdout == f"version={i}\n" + FILLER, (name, i, result.stdout[:40])
        # The readers that held the file open since version 1 read version 1 to its end.
        for name in ("parts", "private"):
            (outs[name] / "go").touch()
            wait_for(lambda n=name: (outs[n] / "done").exists())  # type: ignore[misc]
            assert (outs[name] / "rest").read_text() == FILLER
    finally:
        for clock in clocks.values():
            clock.close()
    for name, values in latencies.items():
        assert max(values) < 1.0, (name, values)
        report(
            f"subPath edit seen in container {name!r}: median "
            f"{statistics.median(values) * 1000:.0f} ms, max {max(values) * 1000:.0f} ms (10 edits)"
        )
    for name in started:
        containerd.remove(name)
    agent.stop()  # SIGINT: views, volumes and the follow server gone
    assert mounts_below(agent.root) == []


def test_subpath_views_survive_agent_restarts(
    containerd: Containerd,
    rootfs: Path,
    agent: AgentProcess,
    tmp_path: Path,
    report: Callable[[str], None],
) -> None:
    """An upgrade (SIGTERM, start) and a crash (kill -9 of `fusevol run`, start): the views stay
    bound (the follow server outlives the agent), in an rslave and in an rprivate container, and
    the next edit is seen through them."""
    assert fusevol("wait", "--root", str(agent.root), "default/web").returncode == 0
    parts = ctr_mounts(agent.root, "parts")
    out, private_out = tmp_path / "out", tmp_path / "private-out"
    out.mkdir()
    private_out.mkdir()
    containerd.run("parts", rootfs, *parts, bind(out, "/out", "rw"), command=_sh(PARTS_LOOP))
    containerd.run(
        "private",
        rootfs,
        *[m.replace(":rslave", ":rprivate") for m in parts],
        bind(private_out, "/out", "rw"),
        command=_sh(PARTS_LOOP),
    )
    clocks = [LineClock(out / "changes"), LineClock(private_out / "changes")]
    agents = [agent]
    views_before = _views(agent.root)
    try:
        for clock in clocks:
            clock.wait_for("version=1 conf=1", after=0)
        for generation, stop in enumerate([AgentProcess.hand_over, AgentProcess.kill], start=2):
            stop(agents[-1])
            agents.append(AgentProcess(manifests=agent.manifests, root=agent.root).start())
            waited = fusevol("wait", "--root", str(agent.root), "default/web", "--timeout", "30s")
            assert waited.returncode == 0, waited.stderr
            assert _views(agent.root) == views_before  # the same binds, nothing stacked
            edited = time.monotonic()
            write_atomically(agent.manifests / "config.yaml", configmap(str(generation)))
            for clock in clocks:
                seen = clock.wait_for(
                    f"version={generation} conf={generation}", after=edited, timeout_s=5
                )
                assert seen - edited < 1.0
            report(f"subPath views after {stop.__name__}: unchanged, the next edit seen in both")
    finally:
        for clock in clocks:
            clock.close()
        containerd.remove("parts")
        containerd.remove("private")
        agents[-1].stop()
        for each in agents:
            force_stop(each)
    assert mounts_below(agent.root) == []


def _views(root: Path) -> list[str]:
    return [p for p in mounts_below(root) if "/volume-subpaths/" in p]


def _sh(script: str) -> tuple[str, ...]:
    return ("sh", "-c", script)


SECRET_POD = """\
apiVersion: v1
kind: Secret
metadata: {name: creds, namespace: default}
stringData: {token: t0ken}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: flags, namespace: default}
data: {a: "1"}
---
apiVersion: v1
kind: Pod
metadata: {name: keys, namespace: default, uid: eeeeeeee-0000-4000-8000-000000000019}
spec:
  containers:
    - name: app
      volumeMounts:
        - {name: creds, mountPath: /run/token, subPath: token}
        - {name: flags, mountPath: /etc/flag-b, subPath: b}
  volumes:
    - {name: creds, secret: {secretName: creds, defaultMode: 0400}}
    - {name: flags, configMap: {name: flags}}
"""
KEYS_UID = "eeeeeeee-0000-4000-8000-000000000019"


def test_views_keep_modes_refuse_writes_wait_for_their_path_and_go_with_the_pod(
    containerd: Containerd, rootfs: Path, tmp_path: Path
) -> None:
    """A secret key's view keeps its mode (root's 0400: uid 1000 refused), writes are EROFS; a
    subPath the ConfigMap does not have yet keeps `wait` waiting, naming the mount, until an edit
    brings it; a deleted pod takes its views along; SIGINT stops the follow server."""
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "keys.yaml").write_text(SECRET_POD)
    agent = AgentProcess(manifests=manifests, root=tmp_path / "root").start()
    # A view whose path the current version lacks is logged, and made with the version that
    # brings it.
    agent.expect_log("subPath view not made .*no such file or directory in the volume's current")
    try:
        root = str(agent.root)
        waited = fusevol("wait", "--root", root, "default/keys", "--timeout", "2s")
        assert waited.returncode == 1
        assert (
            "container 'app' volumeMount 1 (flags at /etc/flag-b): subPath view 'b' not set up"
            in waited.stderr
        ), waited.stderr
        write_atomically(
            manifests / "keys.yaml", SECRET_POD.replace('{a: "1"}', '{a: "1", b: "2"}')
        )
        waited = fusevol("wait", "--root", root, "default/keys", "--timeout", "30s")
        assert waited.returncode == 0, waited.stderr
        mounts = shlex.split(
            fusevol("mounts", "--root", root, "default/keys", "--container", "app").stdout
        )[1::2]
        name = containerd.run("keys", rootfs, *mounts, command=("sleep", "600"))
        try:
            assert containerd.exec(name, "cat", "/run/token").stdout == "t0ken"
            assert containerd.exec(name, "stat", "-c", "%a %u", "/run/token").stdout.strip() == (
                "400 0"
            )
            denied = containerd.exec(name, "cat", "/run/token", user=1000)
            assert "Permission denied" in denied.stderr + denied.stdout, denied
            assert containerd.exec(name, "cat", "/etc/flag-b", user=1000).stdout == "2"
            for command in ("echo x > /etc/flag-b", "echo x > /run/token"):
                result = containerd.exec(name, "sh", "-c", command)
                assert "Read-only file system" in result.stderr + result.stdout, (command, result)
        finally:
            containerd.remove(name)
        pod_dir = agent.root / "pods" / KEYS_UID
        assert len(_views(agent.root)) == 2
        (manifests / "keys.yaml").write_text(SECRET_POD.split("---\n")[0])  # the pod goes
        wait_for(lambda: not pod_dir.exists())
        assert _views(agent.root) == []
        follow = agent.root / "fusevol" / "follow"
        assert str(follow) in mounts_below(agent.root)  # the server stays while the agent runs
        agent.stop()  # SIGINT: no mount left, the follow server included
        assert mounts_below(agent.root) == []
        assert (
            subprocess.run(
                ["pgrep", "-f", f"fusevol.fuse.follow --root {agent.root}"], check=False
            ).returncode
            == 1
        )
    finally:
        force_stop(agent)


SHARED = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: shared, namespace: default}
data: {a: "1"}
"""
SHARING_PODS = "".join(
    f"""\
---
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  containers:
    - name: app
      volumeMounts: [{mount}]
  volumes:
    - {{name: shared, configMap: {{name: shared}}}}
"""
    for name, mount in (
        ("key-b", "{name: shared, mountPath: /etc/b, subPath: b}"),
        ("also-b", "{name: shared, mountPath: /etc/b, subPath: b}"),
    )
)


def test_a_view_comes_with_the_version_that_brings_its_path_in_a_shared_subtree(
    tmp_path: Path,
) -> None:
    """Two pods whose volumes share one subtree, each with a subPath view of key `b`, which the
    ConfigMap does not have at first: one pod's refresh publishes the version that brings it, the
    other's volume is current then, and its view is bound all the same."""
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "pods.yaml").write_text(SHARED + SHARING_PODS)
    agent = AgentProcess(manifests=manifests, root=tmp_path / "root").start()
    # A view whose path the current version lacks is logged, and made with the version that
    # brings it.
    agent.expect_log("subPath view not made .*no such file or directory in the volume's current")
    try:
        root = str(agent.root)
        for pod in ("default/key-b", "default/also-b"):
            assert fusevol("wait", "--root", root, pod, "--timeout", "1s").returncode == 1
        for round_ in range(3):  # the views come with the first version that has b, then follow
            text = SHARED.replace('{a: "1"}', f'{{a: "{round_}", b: "b{round_}"}}')
            write_atomically(manifests / "pods.yaml", text + SHARING_PODS)
            for pod in ("default/key-b", "default/also-b"):
                waited = fusevol("wait", "--root", root, pod, "--timeout", "10s")
                assert waited.returncode == 0, waited.stderr
            views = _views(agent.root)
            assert len(views) == 2
            assert [Path(view).read_text() for view in views] == [f"b{round_}"] * 2
        agent.stop()
        assert mounts_below(agent.root) == []
    finally:
        force_stop(agent)
