"""Reading kubelet's `kubernetes.io/config.seen` out of a downward API annotations file."""

from __future__ import annotations

import re
from datetime import datetime

SEEN = re.compile(r'^kubernetes\.io/config\.seen="([^"]*)"$', re.MULTILINE)
GO_RFC3339_NANO_FIXED = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.(\d{9})(Z|[+-]\d\d:\d\d)")


def seen_in(annotations: bytes) -> str:
    """The `kubernetes.io/config.seen` value of an annotations file."""
    match = SEEN.search(annotations.decode())
    assert match, annotations
    return match[1]


def check_seen(value: str, *, after_ns: int, before_ns: int) -> None:
    """`value` is Go's `time.Format(RFC3339NanoFixed)` (nine digits, zone `Z` or `+hh:mm`) of a
    time between the two bounds."""
    match = GO_RFC3339_NANO_FIXED.fullmatch(value)
    assert match, f"{value!r} is not RFC3339NanoFixed"
    zone = "+00:00" if match[3] == "Z" else match[3]
    seconds = int(datetime.fromisoformat(match[1] + zone).timestamp())
    ns = seconds * 10**9 + int(match[2])
    assert after_ns <= ns <= before_ns, (value, after_ns, before_ns)
