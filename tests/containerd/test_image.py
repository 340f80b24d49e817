"""The agent's image (Containerfile, built offline by .ci/image), run with containerd as the chart's
DaemonSet runs it.

The module builds the image once (`bash .ci/image`: cached layers make a rebuild after a change of
fusevol/ a matter of a minute, and no change a matter of seconds), imports the OCI archive into a
containerd of its own (tests.containerd.runtime) with `ctr images import`, and runs it as
helm/fusevol/templates/daemonset.yaml does: privileged, on the host network, `/dev/fuse`, the agent
root bound at the same path with `rshared` propagation and the container's root `rshared` (what
CRI makes of `mountPropagation: Bidirectional`), the manifest directory read-only, and `fusevol
run` with the chart's arguments. What it serves is read on the host, through the propagated
mounts, and from a second container binding the pod volumes as the README says (`rslave`).
Stopping is kubelet's: SIGTERM to the container's init, the launcher.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import shutil
import subprocess
import tarfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import fusevol
from fusevol.node import layout
from tests.agent import NODE, mounts_below, wait_for, write_atomically
from tests.containerd.runtime import Containerd, bind, build_rootfs, needs_containerd
from tests.manifests import POD_UID, configmap, write_pod_set

if TYPE_CHECKING:
    from collections.abc import Iterator

REPO = Path(__file__).resolve().parents[2]
VERSION = fusevol.__version__
ARCHIVE = REPO / "dist" / f"fusevol-{VERSION}.oci.tar"
IMAGE = f"docker.io/library/fusevol:{VERSION}"
"""`fusevol:<version>`, as kubelet and containerd's CRI normalise the chart's default image."""
MAX_UNPACKED_MB = 200
"""The image's file system, measured inside it (MiB, `du -sxm /`): 195 when this was written (the
Debian 12 slim base 75 MB, the run stage's Debian packages 46, the virtual environment 44, the
bytecode of what the agent imports 20); 375 before the Containerfile left out perl, the kubernetes
client's unused API classes and models, the bytecode nothing imports and more. This fails if one of
them comes back, or if the build stage's compilers and headers did."""

IMPORT_CHECK = """
import importlib, importlib.util, os, pkgutil, sys, fusevol, kubernetes.config
for module in pkgutil.walk_packages(fusevol.__path__, "fusevol."):
    if not module.name.endswith(".__main__"):
        importlib.import_module(module.name)
files = [getattr(module, "__file__", None) or "" for module in list(sys.modules.values())]
print("imports", *sorted(f for f in files
    if f.endswith(".py") and not os.path.exists(importlib.util.cache_from_source(f))))
"""
"""Run with `python3 -B` in the image: every module of fusevol imports (what the Containerfile
leaves out of the kubernetes client and the other packages is nothing they import) and every module
imported then was precompiled (the holder's root is read-only: what is not is compiled at each of
its starts). Prints `imports` and the sources imported without bytecode."""

pytestmark = [
    needs_containerd,
    pytest.mark.containerd,
    pytest.mark.skipif(
        any(shutil.which(tool) is None for tool in ("buildah", "mmdebstrap")),
        reason="needs buildah and mmdebstrap (.ci/setup) to build the image",
    ),
]


@pytest.fixture(scope="module")
def image(containerd: Containerd, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Build the image (cached by .ci/image) and import it: the image's name in `containerd`."""
    started = time.monotonic()
    built = subprocess.run(
        ["bash", ".ci/image"], cwd=REPO, capture_output=True, text=True, timeout=1800
    )
    assert built.returncode == 0, built.stdout + built.stderr
    build_s = time.monotonic() - started
    imported = _ctr(containerd, "images", "import", str(ARCHIVE), timeout=600)
    assert IMAGE in imported.stdout, imported.stdout
    _figure(
        tmp_path_factory,
        f"image: .ci/image took {build_s:.0f} s here (cached layers);"
        f" {ARCHIVE.name} is {ARCHIVE.stat().st_size / 2**20:.0f} MiB",
    )
    return IMAGE


def _ctr(
    containerd: Containerd, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`ctr` with more patience than Containerd.ctr's 30 s (imports, first starts)."""
    result = subprocess.run(
        ["ctr", "--address", str(containerd.socket), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result


def _figure(tmp_path_factory: pytest.TempPathFactory, line: str) -> None:
    with (tmp_path_factory.getbasetemp() / "containerd-figures.txt").open("a") as f:
        f.write(line + "\n")
    print(f"\n[containerd] {line}")


def _archive_config() -> tuple[dict[str, Any], dict[str, Any]]:
    """(the index's manifest descriptor, the image configuration), read from the OCI archive."""
    with tarfile.open(ARCHIVE) as archive:

        def blob(name: str) -> Any:
            member = archive.extractfile(name)
            assert member is not None, name
            return json.load(member)

        descriptor = blob("index.json")["manifests"][0]
        manifest = blob("blobs/" + descriptor["digest"].replace(":", "/"))
        config = blob("blobs/" + manifest["config"]["digest"].replace(":", "/"))
    return descriptor, config


def test_image_is_the_packages_and_nothing_more(
    containerd: Containerd, image: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The archive names the image fusevol:<version>; its labels, entry point and contents."""
    descriptor, config = _archive_config()
    assert descriptor["annotations"]["org.opencontainers.image.ref.name"] == IMAGE
    labels = config["config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert "org.opencontainers.image.source" in labels
    assert config["config"]["Entrypoint"] == ["fusevol"]
    # The Containerfile's default VERSION (a build without --build-arg) is the package's too.
    defaults = re.findall(r"^ARG VERSION=(\S+)$", (REPO / "Containerfile").read_text(), re.M)
    assert defaults == [VERSION], defaults

    script = f"""
        fusevol --version
        python3 -c 'import pyfuse3; print("patched", hasattr(pyfuse3, "negotiated_capabilities"))'
        python3 -B -c {shlex.quote(IMPORT_CHECK)}
        cd /tmp && git init -q r &&
            git -C r -c user.name=t -c user.email=t@t commit -q --allow-empty -m c &&
            git clone -q file:///tmp/r c && git -C c checkout -q HEAD && git -C c reset -q --hard &&
            echo "git clones"
        rm -rf /tmp/r /tmp/c
        for tool in fusermount3 mount umount mount.nfs git gcc cc pip pip3 cython; do
            command -v $tool >/dev/null && echo "has $tool"
        done
        find /var/lib/apt/lists /root/.cache -mindepth 1 2>/dev/null
        find /var/cache/apt -name '*.deb'
        echo "size $(du -sxm / | cut -f1)"
    """
    # The report goes to a file on a bound host directory, not through ctr's pipe: Debian 12's ctr
    # loses the end of a short-lived task's output now and then under load (as it does an exec's,
    # tests.containerd.runtime.Containerd.exec); `du -x` stays off the bind.
    report = tmp_path_factory.mktemp("contents")
    wrapped = f"exec >/report/out\n{script}"
    mount = bind(report, "/report")
    _ctr(containerd, "run", "--rm", "--mount", mount, image, "contents", "sh", "-c", wrapped)
    out = (report / "out").read_text().split("\n")
    assert out[:4] == [f"fusevol {VERSION}", "patched True", "imports", "git clones"], out
    present = {line.split()[1] for line in out if line.startswith("has ")}
    assert present == {"fusermount3", "mount", "umount", "mount.nfs", "git"}, out
    size_mb = int(next(line.split()[1] for line in out if line.startswith("size ")))
    assert size_mb <= MAX_UNPACKED_MB, out
    assert not [line for line in out if line and not line.startswith(("fusevol", "patched",
        "imports", "git clones", "has ", "size "))], out  # fmt: skip
    _figure(tmp_path_factory, f"image: {size_mb} MB unpacked (du -sxm / inside it)")


class DaemonSetPod:
    """The agent's container as the DaemonSet runs it, one per generation (agent-1, agent-2...)."""

    def __init__(self, containerd: Containerd, image: str, root: Path, manifests: Path) -> None:
        self.containerd, self.image, self.root, self.manifests = containerd, image, root, manifests
        self.name = ""
        self.generation = 0

    def start(self) -> None:
        self.generation += 1
        self.name = f"agent-{self.generation}"
        self.log = self.root.parent / f"{self.name}.log"
        _ctr(
            self.containerd,
            "run",
            "-d",
            "--privileged",
            "--net-host",
            "--rootfs-propagation",
            "rshared",
            "--log-uri",
            f"file://{self.log}",
            "--env",
            f"NODE_NAME={NODE}",
            "--mount",
            "type=bind,src=/dev/fuse,dst=/dev/fuse,options=rbind",
            "--mount",
            bind(self.root, str(self.root), "rshared"),
            "--mount",
            bind(self.manifests, str(self.manifests), "ro"),
            self.image,
            self.name,
            # The chart's command and arguments (the port: any free one, on the host network).
            *("fusevol", "run", "--root", str(self.root), "--node-name", NODE),
            *("--manifests", str(self.manifests), "--log-level", "debug", "--http-port", "0"),
        )

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def signal(self, name: str) -> None:
        _ctr(self.containerd, "task", "kill", "--signal", name, self.name)

    def wait_exit(self, timeout_s: float) -> int:
        """The container's exit status, once its init has exited; the container is removed."""

        def stopped() -> bool:
            tasks = _ctr(self.containerd, "task", "ls").stdout
            return any(line.split()[:1] == [self.name] and "STOPPED" in line
                       for line in tasks.splitlines())  # fmt: skip

        wait_for(stopped, timeout_s=timeout_s, interval_s=0.05)
        deleted = subprocess.run(
            ["ctr", "--address", str(self.containerd.socket), "task", "delete", self.name],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        _ctr(self.containerd, "container", "delete", self.name)
        return deleted.returncode

    def remove(self) -> None:
        """Whatever state it is in."""
        for args in (
            ("task", "kill", "--signal", "SIGKILL", self.name),
            ("task", "delete", "--force", self.name),
            ("container", "delete", self.name),
        ):
            subprocess.run(
                ["ctr", "--address", str(self.containerd.socket), *args],
                capture_output=True,
                timeout=30,
                check=False,
            )

    def wait_volumes(self, timeout_s: float = 60) -> None:
        def mounted() -> bool:
            status = json.loads(layout.status_file(self.root).read_text())
            states = {
                volume["name"]: volume["state"]
                for pod in status["pods"]
                if pod["uid"] == POD_UID
                for volume in pod["volumes"]
            }
            return states == {"config": "mounted", "creds": "mounted"}

        try:
            wait_for(mounted, timeout_s=timeout_s, interval_s=0.05)
        except TimeoutError:
            pytest.fail(f"{self.name} did not mount the volumes:\n{self.log_text()}")


@pytest.fixture
def shared_root(tmp_path: Path) -> Iterator[Path]:
    """The agent root, a shared mount of its own: Bidirectional propagation needs the host side
    shared (kubelet refuses it otherwise); whatever is left below it is unmounted at the end."""
    root = tmp_path / "root"
    root.mkdir()
    subprocess.run(["mount", "--bind", str(root), str(root)], check=True)
    try:
        subprocess.run(["mount", "--make-rshared", str(root)], check=True)
        yield root
    finally:
        for path in reversed(mounts_below(root)):
            subprocess.run(["umount", "-l", path], check=False)
        subprocess.run(["umount", "-l", str(root)], check=False)


def test_daemonset_container_serves_the_host_and_hands_over(
    containerd: Containerd,
    image: str,
    shared_root: Path,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = shared_root
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    write_pod_set(manifests)
    config = root / "pods" / POD_UID / "volumes" / "kubernetes.io~configmap" / "config"
    creds = root / "pods" / POD_UID / "volumes" / "kubernetes.io~secret" / "creds"
    agent = DaemonSetPod(containerd, image, root, manifests)
    app = ""
    try:
        agent.start()
        agent.wait_volumes()
        # On the host: the mounts the container made below the root propagated here.
        assert {str(config), str(creds)} <= set(mounts_below(root)), mounts_below(root)
        assert (config / "a").read_bytes() == b"alpha"
        assert (creds / "token").read_bytes() == b"t0ken"
        assert (creds / "token").stat().st_mode & 0o777 == 0o400
        # In a second container binding them as the README says.
        app = containerd.run(
            "app",
            build_rootfs(tmp_path / "rootfs"),
            bind(config, "/etc/config", "ro", "rslave"),
            bind(creds, "/etc/creds", "ro", "rslave"),
            command=("sleep", "3600"),
        )
        assert containerd.exec(app, "cat", "/etc/config/a").stdout == "alpha"
        assert containerd.exec(app, "cat", "/etc/creds/token").stdout == "t0ken"
        assert containerd.exec(app, "cat", "/etc/creds/token", user=1000).returncode != 0

        # An edit of the ConfigMap shows through, on the host and in the container.
        write_atomically(manifests / "configmap.yaml", configmap(a="edited"))
        wait_for(lambda: (config / "a").read_bytes() == b"edited")
        wait_for(lambda: containerd.exec(app, "cat", "/etc/config/a").stdout == "edited")

        # SIGTERM, as kubelet stops the pod: the launcher (the container's init) hands over and
        # exits 0 at once; the pod volumes stay mounted. Its lame duck dies with the container
        # (helm/fusevol/README.md): until the next agent has stacked its binds, reads that reach
        # the FUSE server fail with ENOTCONN.
        stopping = time.monotonic()
        agent.signal("SIGTERM")
        status = agent.wait_exit(timeout_s=30)
        stopped_s = time.monotonic() - stopping
        assert status == 0, agent.log_text()
        assert {str(config), str(creds)} <= set(mounts_below(root)), mounts_below(root)
        with pytest.raises(OSError, match="Transport endpoint is not connected") as dead:
            os.listdir(config)
        assert dead.value.errno == errno.ENOTCONN

        # The next pod: its agent stacks fresh binds; the host and the rslave container see them.
        layout.status_file(root).unlink(missing_ok=True)
        starting = time.monotonic()
        agent.start()
        agent.wait_volumes()
        wait_for(lambda: (config / "a").read_bytes() == b"edited", timeout_s=10)
        served_s = time.monotonic() - starting
        wait_for(
            lambda: containerd.exec(app, "cat", "/etc/config/a").stdout == "edited", timeout_s=10
        )
        assert containerd.exec(app, "ls", "/etc/config").returncode == 0

        # SIGINT tears down: nothing is left mounted below the root.
        agent.signal("SIGINT")
        assert agent.wait_exit(timeout_s=90) == 0, agent.log_text()
        assert mounts_below(root) == []
    finally:
        if app:
            containerd.remove(app)
        agent.remove()
    _figure(
        tmp_path_factory,
        f"image: SIGTERM to exit {stopped_s:.1f} s; the next container served again"
        f" {served_s:.1f} s after its start",
    )
