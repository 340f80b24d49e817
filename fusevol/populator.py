"""Populator: the pods in the object store -> the desired state of world.

The store holds exactly the pods of this node (each source filters by node), so populating is a
diff of the store's pods against the desired state's. `has_added_pods` turns true after the first
pass that follows the sources' complete initial listing: until then nothing may be torn down, or a
restart would unmount volumes whose pods simply have not been read yet (kubelet's
`HasAddedPods`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fusevol.cache.desired import DesiredState
    from fusevol.cache.store import ObjectStore

log = logging.getLogger(__name__)


class Populator:
    def __init__(self, *, store: ObjectStore, desired: DesiredState) -> None:
        self._store = store
        self._desired = desired
        self._has_added_pods = False

    @property
    def has_added_pods(self) -> bool:
        return self._has_added_pods

    def populate(self) -> None:
        """One full pass. Cheap when nothing changed; idempotent."""
        synced = self._store.synced
        pods = {pod.uid: pod for pod in self._store.pods()}
        for pod in self._desired.pods():
            if pod.uid not in pods:
                self._desired.delete_pod(pod.uid)
                log.info("pod removed pod=%s/%s uid=%s", pod.namespace, pod.name, pod.uid)
        for pod in pods.values():
            if self._desired.set_pod(pod):
                log.debug("pod added or updated pod=%s/%s uid=%s", pod.namespace, pod.name, pod.uid)
        if synced:
            self._has_added_pods = True
