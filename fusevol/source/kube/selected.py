"""SelectedClaims: the unbound claims the scheduler chose this node for.

A pod whose claim has `volumeBindingMode: WaitForFirstConsumer` is not given a node until the
claim is bound: the scheduler's VolumeBinding plugin picks the node, annotates the claim
`volume.kubernetes.io/selected-node=<node>`, and waits for a provisioner to create a volume there.
So a node-local provisioner cannot wait for the pod to reach its node; it watches the claims, as
external-provisioner does in its per-node deployment. The annotation cannot be selected by the
API server (no field or label selector reaches it), so this is one list+watch of every claim of
the cluster, keeping only the keys of the unbound ones selected for this node; the source then
tracks those claims (and their class) like the claims of its pods, and the populator hands them
to the provisioner.

Excludes: tracking the claims' content (`objects`), deciding to provision (`fusevol.provision`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusevol.kube.query import Callbacks, Query
from fusevol.kube.reflector import Reflector
from fusevol.model import Kind, ObjectKey

if TYPE_CHECKING:
    from collections.abc import Callable

    from fusevol.kube.client import KubeClient, Obj
    from fusevol.kube.listing import Items

SELECTED_NODE = "volume.kubernetes.io/selected-node"


class SelectedClaims:
    def __init__(
        self, *, client: KubeClient, node_name: str, on_change: Callable[[], None]
    ) -> None:
        self._node_name = node_name
        self._on_change = on_change
        self.keys: frozenset[ObjectKey] = frozenset()
        """The unbound claims annotated for this node."""
        self.reflector = Reflector(
            client=client,
            query=Query(Kind.PERSISTENT_VOLUME_CLAIM, None, ""),
            handler=Callbacks(self._replace, self._event),
        )

    async def run(self) -> None:
        await self.reflector.run()

    async def _replace(self, items: Items) -> None:
        self._set(frozenset(key for raw in items if (key := self._selected(raw)) is not None))

    async def _event(self, kind: str, raw: Obj) -> None:
        key = _key(raw)
        selected = kind != "DELETED" and self._selected(raw) is not None
        self._set(self.keys | {key} if selected else self.keys - {key})

    def _set(self, keys: frozenset[ObjectKey]) -> None:
        if keys != self.keys:
            self.keys = keys
            self._on_change()

    def _selected(self, raw: Obj) -> ObjectKey | None:
        meta = raw.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        if annotations.get(SELECTED_NODE) != self._node_name:
            return None
        if (raw.get("spec") or {}).get("volumeName"):
            return None
        return _key(raw)


def _key(raw: Obj) -> ObjectKey:
    meta = raw.get("metadata") or {}
    return ObjectKey(
        Kind.PERSISTENT_VOLUME_CLAIM, str(meta.get("namespace") or "default"), str(meta.get("name"))
    )
