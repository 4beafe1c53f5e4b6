"""Structured logs: one event per line on stderr, ``key=value`` fields after the message.

A line reads ``TIME DAEMON[PID] LEVEL LOGGER: message key=value key="value with spaces"``. Under systemd,
stderr goes to the journal, which stamps the time, the unit and the pid itself: the line then carries a
``<N>`` syslog priority prefix instead, so ``journalctl -p warning`` filters by level. Newlines inside a
message or a traceback are escaped as ``\\n``: the journal (and grep) see one event per line, never a
traceback spread over thirty entries.

Job events carry ``job=<id>`` and ``node=<name>`` (``node=-`` when no node is involved), so
``journalctl -u garrison-controller | grep 'job=123 '`` follows one job.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

# Syslog priorities for the journal's "<N>" line prefix (sd-daemon(3)).
_PRIORITIES = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}


def kv(**fields: object) -> str:
    """``key=value`` pairs in the given order; values with spaces, quotes or ``=`` are quoted."""
    return " ".join(f"{key}={_value(value)}" for key, value in fields.items())


def _value(value: object) -> str:
    text = "-" if value is None or value == "" else str(value)
    if any(c in text for c in ' "=\\\n\t'):
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


def _one_line(text: str) -> str:
    return text.replace("\r", "").replace("\n", "\\n")


def without_traceback(record: logging.LogRecord) -> bool:
    """A logging filter: the record's exception as its last line (``OperationalError: ...``), not a traceback."""
    if record.exc_info and record.exc_info[1] is not None:
        error = record.exc_info[1]
        record.msg = f"{record.getMessage()}: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        record.args = None
        record.exc_info = None
        record.exc_text = None
    return True


class OneLineFormatter(logging.Formatter):
    """Formats each record, traceback included, on a single line."""

    def __init__(self, daemon: str, journal: bool) -> None:
        super().__init__()
        self.daemon = daemon
        self.journal = journal

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            message = f"{message} exception={_value(record.exc_text)}"
        if record.stack_info:
            message = f"{message} stack={_value(self.formatStack(record.stack_info))}"
        message = _one_line(message)
        if self.journal:
            priority = _PRIORITIES.get(record.levelno, 6 if record.levelno < logging.WARNING else 3)
            return f"<{priority}>{record.levelname} {record.name}: {message}"
        return f"{self.formatTime(record)} {self.daemon}[{record.process}] {record.levelname} {record.name}: {message}"


def stderr_is_journal(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether stderr is connected to the journal (systemd sets JOURNAL_STREAM=DEVICE:INODE for that)."""
    stream = environ.get("JOURNAL_STREAM", "")
    device, _, inode = stream.partition(":")
    if not device.isdigit() or not inode.isdigit():
        return False
    try:
        stat = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return stat.st_dev == int(device) and stat.st_ino == int(inode)


def setup_logging(daemon: str) -> None:
    level = os.environ.get("GARRISON_LOG_LEVEL", "INFO").upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter(daemon, journal=stderr_is_journal()))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level, logging.INFO))
    # What OneLineFormatter leaves out, not looked up for every record: the caller's file, line and function (a
    # walk up the stack), the thread's name and the multiprocessing process name. A job's changes are a few
    # lines each, on the controller's event loop (issue 23).
    logging._srcfile = None  # type: ignore[attr-defined]  # documented: "set _srcfile to None" skips findCaller
    logging.logThreads = False
    logging.logMultiprocessing = False
    # SQLAlchemy's pool logs the traceback of a failed reset (a ROLLBACK on a connection PostgreSQL has just
    # dropped) at ERROR: the store has met the same failure and handles it (its outage mode), so the pool's
    # account is kept to its one line, the exception's last line appended.
    logging.getLogger("sqlalchemy.pool").addFilter(without_traceback)
    # Seven lines about Alembic's own plugins at every start say nothing to an operator; its migration
    # lines ("Running upgrade 0001 -> 0002") stay.
    logging.getLogger("alembic.runtime.plugins").setLevel(max(root.level, logging.WARNING))
