"""Logging set-up: one line per event, `key=value` fields, to stderr.

Under systemd (JOURNAL_STREAM set) each line starts with its syslog priority (`<3>` for errors), so
journald records the level. Never log payload bytes or sensitive mount options: modules log names,
versions and errors only, and `model.Secret`/`FileProjection` hide their bytes from `repr`.
"""

from __future__ import annotations

import logging
import os
import sys

_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}


class _JournalFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"<{_PRIORITY.get(record.levelno, 6)}>{super().format(record)}"


def setup(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if os.environ.get("JOURNAL_STREAM"):
        handler.setFormatter(_JournalFormatter("%(name)s: %(message)s"))
    else:
        handler.setFormatter(
            logging.Formatter(
                "%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s", "%H:%M:%S"
            )
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("pyfuse3").setLevel(logging.WARNING)
