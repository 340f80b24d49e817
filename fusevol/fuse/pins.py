"""Served names the kernel may not forget: the agent's side of the pin holder
(`fusevol.fuse.pin_helper`, which says why a descriptor each).

The publisher says what to hold and what to let go of (`Publisher`: a version's names once it
is visible and warm, the old version's before it is removed); the holder applies it in that
order, batch by batch, in its own process. Pins are best effort: a volume beyond the bound, or
every volume after the holder died, is served as before, its names looked up again after the
kernel dropped them.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, cast

import trio

from fusevol.base.helper_parent import HelperProcess

log = logging.getLogger(__name__)

_BATCH = 256
"""Ops sent to the holder in one call."""
_REAP_S = 1.0
"""How long a stop waits for the killed holder to exit."""


@dataclass(slots=True)
class _Op:
    request: list[Any]
    done: trio.Event | None = field(default=None)


class Pins:
    def __init__(self, limit: int) -> None:
        """Hold at most `limit` names in all; 0 holds none."""
        self._limit = limit
        self._send, self._receive = trio.open_memory_channel[_Op](math.inf)
        self._working = limit > 0
        self.held = 0
        """Names held, as the holder last said."""

    def pin(self, root: str, names: list[str], *, listed: bool = False) -> None:
        """Have the kernel keep `root/name` for each of `names` (relative to the volume's root
        on the agent's mount), after what was asked before; `listed`: names the kernel may not
        hold yet (a version that was not warmed), whose directories are listed first. Returns
        at once."""
        if self._working and names:
            self._send.send_nowait(_Op(["pin", root, names, listed]))

    def unpin(self, root: str, names: list[str] | None = None) -> None:
        """Let go of `names` and of everything below each (None: of everything under `root`).
        Returns at once."""
        if self._working and names != []:
            self._send.send_nowait(_Op(_release(root, names)))

    async def released(self, root: str, names: list[str] | None = None) -> None:
        """Let go of `names` and of everything below each (None: of everything under `root`),
        and return once the holder has: the kernel may then forget them when they are removed."""
        if not self._working:
            return
        op = _Op(_release(root, names), trio.Event())
        self._send.send_nowait(op)
        assert op.done is not None
        await op.done.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the holder (from the trio thread: its parent for PR_SET_PDEATHSIG) and apply
        what is asked, in order, until cancelled; then kill it, which lets go of everything."""
        task_status.started()
        if not self._working:
            return
        try:
            helper = HelperProcess("fusevol.fuse.pin_helper")
        except OSError as exc:
            log.warning("pin holder not started, cold reads look names up again error=%s", exc)
            self._stop()
            return
        try:
            _, limit = cast("list[Any]", await helper.call(["limit", self._limit]))
            if limit < self._limit:
                log.info("pinned names bounded by open files limit=%d asked=%d", limit, self._limit)
            while True:
                batch = [await self._receive.receive()]
                while len(batch) < _BATCH:
                    try:
                        batch.append(self._receive.receive_nowait())
                    except trio.WouldBlock:
                        break
                try:
                    _, self.held = cast(
                        "list[Any]", await helper.call(["apply", [op.request for op in batch]])
                    )
                finally:
                    for op in batch:
                        if op.done is not None:
                            op.done.set()
        except OSError as exc:
            log.warning("pin holder failed, cold reads look names up again error=%s", exc)
        finally:
            self._stop()
            helper.kill()
            # Reaped aside: a holder killed mid-lookup dies once the trio thread answered it.
            with trio.CancelScope(shield=True), trio.move_on_after(_REAP_S):
                await trio.to_thread.run_sync(helper.wait, abandon_on_cancel=True)

    def _stop(self) -> None:
        """Pin nothing from now on, and keep nobody waiting for what will not be done."""
        self._working = False
        self.held = 0
        while True:
            try:
                op = self._receive.receive_nowait()
            except trio.WouldBlock:
                break
            if op.done is not None:
                op.done.set()


def _release(root: str, names: list[str] | None) -> list[Any]:
    return ["drop", root] if names is None else ["unpin", root, names]
