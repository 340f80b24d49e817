"""The agent's lifecycle: named phases, the transitions allowed between them in one table, each
transition logged. `fusevol.agent.app` drives it; the hand-over (`fusevol.agent.handover`) and the
FUSE server read it.

    STARTING      ─ready─▶ SERVING      ─SIGTERM─▶ HANDING_OVER ─launched─▶ LAME_DUCK
    SERVING       ─SIGINT─▶ TEARING_DOWN ─────────────────────────────▶ STOPPED
    STARTING      ─SIGTERM, SIGINT or a failure before ready─▶ HANDING_OVER, TEARING_DOWN
    HANDING_OVER  ─no launcher (nothing will answer FUSE for us)─▶ STOPPED
    LAME_DUCK     ─a successor takes the connection─▶ TRANSFERRING ─▶ STOPPED
    LAME_DUCK     ─a successor stacked its binds, or none came─▶ STOPPED

- STARTING: the agent lock is ours; the node's volumes are reconstructed, the FUSE file system
  mounted (or a predecessor's taken over), the source read once.
- SERVING: ready; the reconciler runs.
- HANDING_OVER: SIGTERM (systemd's stop or restart, a DaemonSet rollout): reconciling has
  stopped, every pod volume stays mounted for the next agent.
- TEARING_DOWN: SIGINT, or a failure: every pod volume is unmounted, the pod directories go.
- LAME_DUCK: the lock is released, the launcher has exited; the FUSE server answers for the pod
  binds until a successor stacks its own binds or takes the connection over (or a timeout).
  From here on the FUSE mountpoint is no longer ours to unmount.
- TRANSFERRING: a successor takes the connection over: our FUSE server stops reading, the
  descriptors go to it.
- STOPPED: nothing is served any more; the process exits.
"""

from __future__ import annotations

import enum
import logging

import trio

log = logging.getLogger(__name__)


class Phase(enum.Enum):
    STARTING = "starting"
    SERVING = "serving"
    HANDING_OVER = "handing-over"
    TEARING_DOWN = "tearing-down"
    LAME_DUCK = "lame-duck"
    TRANSFERRING = "transferring"
    STOPPED = "stopped"


TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.STARTING: frozenset({Phase.SERVING, Phase.HANDING_OVER, Phase.TEARING_DOWN}),
    Phase.SERVING: frozenset({Phase.HANDING_OVER, Phase.TEARING_DOWN}),
    Phase.HANDING_OVER: frozenset({Phase.LAME_DUCK, Phase.STOPPED}),
    Phase.TEARING_DOWN: frozenset({Phase.STOPPED}),
    Phase.LAME_DUCK: frozenset({Phase.TRANSFERRING, Phase.STOPPED}),
    Phase.TRANSFERRING: frozenset({Phase.STOPPED}),
    Phase.STOPPED: frozenset(),
}
"""Each phase -> the phases it may go to: the only place the order of a stop is written."""


class IllegalTransition(RuntimeError):
    """A transition the table does not allow: a bug of the agent, never of its input."""


class Lifecycle:
    """The agent's phase, and whether its FUSE server runs (which is not a phase: it runs from
    STARTING until the end of LAME_DUCK or TRANSFERRING)."""

    def __init__(self) -> None:
        self.phase = Phase.STARTING
        self._visited = {Phase.STARTING}
        self.fuse_up = False
        self._fuse_stopped = trio.Event()

    def enter(self, phase: Phase, why: str) -> None:
        """Go to `phase`; IllegalTransition if the table does not allow it from here."""
        if phase not in TRANSITIONS[self.phase]:
            raise IllegalTransition(f"agent lifecycle: {self.phase.value} -> {phase.value} ({why})")
        log.info("lifecycle %s -> %s: %s", self.phase.value, phase.value, why)
        self.phase = phase
        self._visited.add(phase)

    def has_been(self, phase: Phase) -> bool:
        return phase in self._visited

    @property
    def stopping(self) -> bool:
        """A stop has begun (whatever its kind)."""
        return self.phase not in (Phase.STARTING, Phase.SERVING)

    @property
    def mount_handed_on(self) -> bool:
        """The FUSE mountpoint is the next agent's (or detached for it): never unmount it."""
        return self.has_been(Phase.LAME_DUCK)

    def fuse_started(self) -> None:
        self.fuse_up = True

    def fuse_stopped(self) -> None:
        self.fuse_up = False
        self._fuse_stopped.set()

    async def wait_fuse_stopped(self) -> None:
        await self._fuse_stopped.wait()
