"""Frozen volumes, shown: `fusevol status`, `/metrics` (`fusevol_frozen_volumes`) and a Warning
event on the pod (reason `FrozenVolume`) for each pod volume that some container still reads
through a FUSE connection no agent serves (`fusevol.mount.frozen` finds them).

Such binds appear only when an agent starts on a connection it could not take over, so the
search runs once the agent serves, and again every `CHECK_S` only while the node still has stale
binds: the containers that read them go as their pods are recreated, and the warning with them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import trio

from fusevol.mount import frozen
from fusevol.node import layout

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from fusevol.model import Pod
    from fusevol.mount.frozen import FrozenVolume
    from fusevol.volumemanager.cache.desired import DesiredState

log = logging.getLogger(__name__)

CHECK_S = 10.0
"""How often the node is searched again while it has stale binds."""
REASON = "FrozenVolume"


class FrozenVolumes:
    def __init__(
        self,
        *,
        root: Path,
        kubelet_dir: Path | None,
        desired: DesiredState,
        warn: Callable[[Pod, str, str], None],
        changed: Callable[[], None],
    ) -> None:
        """Searches the pod volumes below `root` and, for CSI targets, `kubelet_dir`.
        `warn(pod, volume, message)` records the Warning event; `changed()` has the status
        snapshot written again."""
        self._mountpoint = str(layout.fuse_mountpoint(root))
        self._below = [str(layout.pods_dir(root))]
        if kubelet_dir is not None:  # CSI targets
            self._below.append(str(kubelet_dir / "pods"))
        self._desired = desired
        self._warn = warn
        self._changed = changed
        self.found: list[FrozenVolume] = []
        """What the last search found: stale binds, read by containers or not."""
        self._warned: set[tuple[str, str, str]] = set()

    @property
    def frozen(self) -> list[FrozenVolume]:
        """The stale binds some container reads (or may: `containers` None)."""
        return [volume for volume in self.found if volume.containers != 0]

    async def run(self) -> None:
        """Search now, then every CHECK_S while the node has stale binds."""
        while True:
            found = await trio.to_thread.run_sync(frozen.find, self._mountpoint, self._below)
            if found is None:
                return  # not our mount (yet): nothing to compare with
            if found != self.found:
                self.found = found
                self._report()
                self._changed()
            if not found:
                return
            await trio.sleep(CHECK_S)

    def _report(self) -> None:
        for volume in self.frozen:
            key = (volume.uid, volume.volume, volume.device)
            if key in self._warned:
                continue
            self._warned.add(key)
            pod = self._desired.pod(volume.uid)
            message = message_for(volume)
            name = f"{pod.namespace}/{pod.name}" if pod else volume.uid
            log.warning("frozen volume pod=%s volume=%s: %s", name, volume.volume, message)
            if pod is not None:
                self._warn(pod, volume.volume, message)

    def snapshot(self) -> list[dict[str, Any]]:
        """For the status snapshot: each frozen volume, named."""
        out = []
        for volume in self.frozen:
            pod = self._desired.pod(volume.uid)
            out.append(
                {
                    "uid": volume.uid,
                    "namespace": pod.namespace if pod else "",
                    "pod": pod.name if pod else "",
                    "volume": volume.volume,
                    "path": volume.path,
                    "containers": volume.containers,
                    "message": message_for(volume),
                }
            )
        return out

    def gauges(self) -> list[tuple[dict[str, str], float]]:
        """`fusevol_frozen_volumes`: per frozen volume, the containers reading it (1 if the agent
        cannot see them)."""
        out = []
        for volume in self.frozen:
            pod = self._desired.pod(volume.uid)
            labels = {
                "namespace": pod.namespace if pod else "",
                "pod": pod.name if pod else volume.uid,
                "volume": volume.volume,
            }
            out.append((labels, float(volume.containers or 1)))
        return out


def message_for(volume: FrozenVolume) -> str:
    readers = (
        "containers started before the agent's last start may read it"
        if volume.containers is None
        else f"{volume.containers} container(s) read it"
    )
    return (
        f'volume "{volume.volume}" is bound to a FUSE connection no fusevol agent serves'
        f" (device {volume.device}): {readers}, and see its old content (or errors) and no"
        " update again; recreate the pod"
    )
