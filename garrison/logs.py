"""Structured logs: one event per line on stderr (journald picks them up), key=value after the message."""

from __future__ import annotations

import logging
import os
import sys


def setup_logging(daemon: str) -> None:
    level = os.environ.get("GARRISON_LOG_LEVEL", "INFO").upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s {daemon}[%(process)d] %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level, logging.INFO))
