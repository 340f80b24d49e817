"""CSI targets bound into real containers as CRI binds them (containerd + runc): kubelet's
volume mount is a plain `rbind:ro` (rprivate, CRI's default `None`), or `rbind:ro:rslave` with
`mountPropagation: HostToContainer`. What a container sees is read from inside it, as uid 1000
too, and an edit of the ConfigMap through the API must show inside within 1 s."""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any

import pytest

from tests.containerd.runtime import Containerd, LineClock, bind, build_rootfs, needs_containerd
from tests.csi.conftest import api, csi_agent, csi_volume, kubelet_dir, pod  # noqa: F401

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.helpers.apiserver import ApiServer

pytestmark = [needs_containerd, pytest.mark.containerd]

CHANGE_LOOP = (
    'last=; while :; do v=$(cat /etc/config/a 2>&1); if [ "$v" != "$last" ]; then echo "$v";'
    " last=$v; fi; usleep 500; done >> /out/changes"
)


@pytest.fixture
def containerd(tmp_path: Path) -> Iterator[Containerd]:
    daemon = Containerd(tmp_path / "containerd")
    try:
        yield daemon
    finally:
        daemon.stop()


def configmap(value: str) -> dict[str, Any]:
    return {"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a": value}}


def test_csi_targets_in_containers_plain_and_host_to_container(
    api: ApiServer,  # noqa: F811
    csi_agent: Callable[..., Any],  # noqa: F811
    containerd: Containerd,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rootfs = build_rootfs(tmp_path / "rootfs")
    api.create(configmap("alpha"))
    web = pod(volumes=[csi_volume("config", configMap="app")])
    api.create(web)
    with csi_agent() as (_agent, kubelet):
        target = kubelet.publish(web, "config")
        clocks = {}
        for propagation in ("rprivate", "rslave"):
            out = tmp_path / f"out-{propagation}"
            out.mkdir()
            options = ("ro",) if propagation == "rprivate" else ("ro", "rslave")
            name = containerd.run(
                f"csi-{propagation}",
                rootfs,
                bind(target, "/etc/config", *options),
                bind(out, "/out", "rw"),
                command=("sh", "-c", CHANGE_LOOP),
            )
            clocks[name] = LineClock(out / "changes")
            clocks[name].wait_for("alpha", after=0)
            for user in (0, 1000):
                result = containerd.exec(name, "cat", "/etc/config/a", user=user)
                assert result.stdout == "alpha", result
            mode = containerd.exec(name, "stat", "-L", "-c", "%a", "/etc/config/a")
            assert mode.stdout.strip() == "644"
            written = containerd.exec(name, "sh", "-c", "echo x > /etc/config/a")
            assert "Read-only file system" in written.stderr + written.stdout
        latencies: dict[str, list[float]] = {name: [] for name in clocks}
        try:
            for i in range(10):
                started = time.monotonic()
                api.update(configmap(f"v{i}"))
                for name, clock in clocks.items():
                    seen = clock.wait_for(f"v{i}", after=started, timeout_s=5)
                    latencies[name].append(seen - started)
        finally:
            for clock in clocks.values():
                clock.close()
        for name, values in latencies.items():
            assert max(values) < 1.0, (name, values)
            with capsys.disabled():
                print(
                    f"\n[containerd] CSI target, {name}: API edit seen inside in median "
                    f"{statistics.median(values) * 1000:.1f} ms, max {max(values) * 1000:.1f} ms"
                )
        for name in list(clocks):
            containerd.remove(name)
        kubelet.unpublish(web, "config")
