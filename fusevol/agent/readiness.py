"""When the agent is ready, and the ready file that says so.

Ready (`reconciled`): the source has delivered everything once (the store is synced), and a
reconciler pass acted on it; `/readyz` and the CSI server's probe ask it. The ready file
(`--ready-file`: for an exec readiness probe when the HTTP port may be another agent's) is created
once the agent serves with a pass done, and removed as soon as a stop begins. Excludes: whether the
agent is alive (`/healthz`: its FUSE server runs, fusevol.agent.lifecycle).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusevol.agent.lifecycle import Phase

if TYPE_CHECKING:
    from pathlib import Path

    from fusevol.agent.lifecycle import Lifecycle
    from fusevol.volumemanager.cache.store import ObjectStore
    from fusevol.volumemanager.reconciler.loop import Reconciler


class Readiness:
    """Whether the agent is ready, and the ready file (module docstring)."""

    def __init__(
        self,
        *,
        store: ObjectStore,
        reconciler: Reconciler,
        lifecycle: Lifecycle,
        ready_file: Path | None,
    ) -> None:
        self._store = store
        self._reconciler = reconciler
        self._lifecycle = lifecycle
        self._ready_file = ready_file
        self._ready = False
        """The ready file was created (`mark_ready`)."""

    def reconciled(self) -> bool:
        """Ready: the source has delivered everything once, and a reconciler pass acted on it."""
        return self._store.synced and self._reconciler.passes > 0

    def mark_ready(self) -> None:
        """Serving, with a reconciler pass done: the ready file says so (once)."""
        ready_file = self._ready_file
        if (
            ready_file is not None
            and not self._ready
            and self._lifecycle.phase is Phase.SERVING
            and self.reconciled()
        ):
            self._ready = True
            ready_file.parent.mkdir(parents=True, exist_ok=True)
            ready_file.touch()

    def not_ready(self) -> None:
        """A stop began: the ready file goes (whether or not this agent created it)."""
        if self._ready_file is not None:
            self._ready_file.unlink(missing_ok=True)
