"""The agent's side of the audit of reads: which served volumes are audited, the audit index
written before each of their versions is visible, and the audit server they are bound from.

An audited volume has a subtree of its own (never shared: its records name one pod), bound at its
pod volume directory from the audit file system (`fusevol.fuse.audit`), which mirrors the agent's
mount and records every open. Which volumes: `fusevol.model.audit`. What the server reads of
each: `fusevol.fuse.audit_index`, written here in a worker thread, before `..data` names a version
(`prepare`) and after (`published`).
"""

from __future__ import annotations

import datetime
import os
from typing import TYPE_CHECKING

import trio

from fusevol.base.errors import VolumeSetupError
from fusevol.fuse.audit_index import IndexWriter, VolumeFacts
from fusevol.fuse.servers import AUDIT
from fusevol.model.audit import AuditLevel, audited, pod_level
from fusevol.projection.origins import origins

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from fusevol.volumemanager.cache.desired import VolumeToServe
    from fusevol.volumemanager.cache.store import ObjectStore


class Auditing:
    def __init__(
        self,
        *,
        root: Path,
        node_name: str,
        default: AuditLevel = AuditLevel.OFF,
        server: str = "agent",
        runtime_state: Path | None = None,
        exists: Callable[[bytes], bool] = lambda _: True,
    ) -> None:
        """`exists(subtree)`: whether the agent's mount holds the subtree (its tree, as taken
        over): the index files of those it does not hold are a previous connection's, removed."""
        self._root = root
        self._default = default
        self._server = server
        self._server_args = () if runtime_state is None else ("--runtime-state", str(runtime_state))
        self._index = IndexWriter(root, node_name=node_name)
        self._subtrees: set[bytes] = set()
        """Audited subtrees with an index file, a previous agent's too: removed with them."""
        for subtree in IndexWriter.listed(root):
            if exists(subtree):
                self._subtrees.add(subtree)
            else:  # a connection that was not taken over: its subtrees went with it
                self._index.remove(subtree)

    def audited(self, volume: VolumeToServe) -> bool:
        """Whether the volume's opens are recorded: the highest level asked for (module
        docstring of `fusevol.model.audit`)."""
        if volume.audit:
            return True
        return audited(max(self._default, pod_level(volume.pod.annotations)), volume.source)

    async def prepare(self, subtree: bytes, volume: VolumeToServe, store: ObjectStore) -> None:
        """Before a version of audited `subtree` is made: the files it will show, pending."""
        assert volume.plugin is not None
        pod = volume.pod
        facts = VolumeFacts(
            pod.namespace, pod.name, pod.uid, volume.spec_name, volume.plugin.short_name
        )
        files = origins(pod, volume.source, store.get)
        set_up = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        self._subtrees.add(subtree)
        await trio.to_thread.run_sync(self._index.prepare, subtree, facts, files, set_up)

    async def published(self, subtree: bytes, version: bytes | None) -> None:
        """The pending files are version `version`'s (the one `..data` names now)."""
        await trio.to_thread.run_sync(self._index.published, subtree, version)

    async def removed(self, subtree: bytes) -> None:
        if subtree in self._subtrees:
            self._subtrees.discard(subtree)
            await trio.to_thread.run_sync(self._index.remove, subtree)

    async def source(self, subtree: bytes) -> Path:
        """Where to bind audited `subtree` from: the audit server's mirror of it (the server
        started first, or waited for)."""
        await trio.to_thread.run_sync(self._ensure_server)
        return AUDIT.mountpoint(self._root) / os.fsdecode(subtree)

    def _ensure_server(self) -> None:
        if self._server == "none":
            raise VolumeSetupError(
                "the volume is to be audited (fusevol.io/audit, of its pod, namespace or CSI "
                "attributes, or --audit) but this node runs no audit server (--audit-server none; "
                "in the chart: audit.enabled)"
            )
        AUDIT.ensure_running(
            self._root, extra_args=self._server_args, start=self._server == "agent"
        )
