"""squeue's ``-o/--format``: a job listing laid out by a format string such as ``"%.18i %.9P %.8j %.2t %R"``.

A field is ``%[.][SIZE]LETTER``. With a size the value is cut to that many characters and padded to it,
on the left when the size is preceded by ``.`` (right-justified), else on the right, as squeue does; without
one it is printed whole. Other text is copied as is, ``%%`` is a ``%``. The letters are squeue's, for the
fields a Garrison job has; an unknown letter is a usage error naming it.

Pure functions over the job messages gqueue receives, so every layout is testable as text.
"""

from __future__ import annotations

import re
import time

from garrison.cli.render import elapsed, format_duration, job_row
from garrison.cmdline.usage import UsageError
from garrison.model.state_codes import STATE_CODES

TYPE_CHECKING = False  # not typing's: importing typing costs gqueue ~5 ms
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

COMPACT_STATES = STATE_CODES  # squeue's compact state codes (%t)
FIELD = re.compile(r"%(\.?)(\d*)([A-Za-z%])")


def _time(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch)) if epoch else "N/A"


def time_limit_text(job: Any) -> str:
    return format_duration(job.time_limit_s) if job.time_limit_s else "UNLIMITED"


def time_left_text(job: Any) -> str:
    if not job.time_limit_s:
        return "UNLIMITED"
    return format_duration(job.time_limit_s - elapsed(job))


def _array_job(job: Any) -> str:
    return str(job.array_job_id) if job.HasField("array_job_id") else str(job.job_id)


def _array_task(job: Any) -> str:
    return str(job.array_task_id) if job.HasField("array_task_id") else "N/A"


# letter -> (header, value)
FIELDS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "i": ("JOBID", lambda j: j.display_id),
    "A": ("ARRAY_JOB_ID", _array_job),
    "F": ("ARRAY_JOB_ID", _array_job),
    "K": ("ARRAY_TASK_ID", _array_task),
    "j": ("NAME", lambda j: j.name),
    "u": ("USER", lambda j: j.user),
    "U": ("UID", lambda j: str(j.uid)),
    "a": ("ACCOUNT", lambda j: j.account),
    "P": ("PARTITION", lambda j: j.partition),
    "T": ("STATE", lambda j: j.state),
    "t": ("ST", lambda j: COMPACT_STATES.get(j.state, j.state[:2])),
    "M": ("TIME", lambda j: format_duration(elapsed(j))),
    "l": ("TIME_LIMIT", time_limit_text),
    "L": ("TIME_LEFT", time_left_text),
    "D": ("NODES", lambda j: str(j.nodes)),
    "N": ("NODELIST", lambda j: ",".join(j.node_list)),
    "R": ("NODELIST(REASON)", lambda j: job_row(j)[-1]),
    "r": ("REASON", lambda j: j.reason or "None"),
    "b": ("TRES_PER_JOB", lambda j: f"gres/gpu:{j.gpus}" if j.gpus else "N/A"),
    "Q": ("PRIORITY", lambda j: str(j.priority)),
    "V": ("SUBMIT_TIME", lambda j: _time(j.submit_time)),
    "S": ("START_TIME", lambda j: _time(j.start_time)),
    "e": ("END_TIME", lambda j: _time(j.end_time)),
}


class QueueFormat:
    """A parsed format string: literal text and fields, ready to lay out any number of jobs."""

    def __init__(self, spec: str) -> None:
        # Each part: a literal string, or (letter, right-justified, size or None).
        self.parts: list[str | tuple[str, bool, int | None]] = []
        position = 0
        for match in FIELD.finditer(spec):
            if match.start() > position:
                self._literal(spec[position : match.start()])
            dot, size, letter = match.groups()
            position = match.end()
            if letter == "%":
                self.parts.append("%")
                continue
            if letter not in FIELDS:
                raise UsageError(f"--format: unknown field %{letter} (known: {' '.join('%' + k for k in FIELDS)})")
            self.parts.append((letter, bool(dot), int(size) if size else None))
        if position < len(spec):
            self._literal(spec[position:])

    def _literal(self, text: str) -> None:
        if "%" in text:
            raise UsageError(f"--format: a '%' must start a field such as %i or %.8j, or be written %%: {text!r}")
        self.parts.append(text)

    def header(self) -> str:
        return self._line(lambda letter: FIELDS[letter][0])

    def line(self, job: Any) -> str:
        return self._line(lambda letter: FIELDS[letter][1](job))

    def _line(self, value: Callable[[str], str]) -> str:
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
                continue
            letter, right, size = part
            text = value(letter)
            if size is not None:
                text = text[:size]
                text = text.rjust(size) if right else text.ljust(size)
            out.append(text)
        return "".join(out).rstrip()

    def render(self, jobs: list[Any], header: bool = True) -> str:
        lines = [self.header()] if header else []
        lines.extend(self.line(job) for job in jobs)
        return "\n".join(lines)
