"""Backoff: how long a reflector waits before it retries a failed list or watch (its step 5), or
relists after a second 410 in a row (step 4), as client-go's reflector does.

Excludes: what is retried, and when a retry is due (`reflector`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(slots=True)
class Backoff:
    """client-go's reflector backoff: 0.8 s doubling to 30 s, up to 100 % jitter, then capped."""

    initial_s: float = 0.8
    max_s: float = 30.0
    failures: int = 0

    def next_delay(self) -> float:
        base = min(self.initial_s * 2**self.failures, self.max_s)
        self.failures += 1
        return float(min(base * (1 + random.random()), self.max_s))

    def reset(self) -> None:
        self.failures = 0
