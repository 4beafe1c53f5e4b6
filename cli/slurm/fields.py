"""What squeue, sinfo, sacct and sstat share: Slurm's state names, exit codes, field widths and the three
ways their output is laid out.

- ``PercentFormat``: squeue's and sinfo's ``-o`` strings (``"%.18i %.9P %8j %R"``): ``%[.|-][SIZE]LETTER``,
  ``.`` right-justifies, otherwise left; a value is cut to SIZE; text between fields is copied, ``%%`` is ``%``.
- ``parse_long_format``: squeue's ``-O`` lists (``jobid:10,name:.20``), each field 20 wide unless given.
- ``FieldList``: sacct's and sstat's ``-o`` lists (``JobID,JobName%30,State``) printed as a table (header,
  a line of dashes, a value longer than its width cut with ``+``), ``-p`` (each value followed by ``|``) or
  ``-P`` (values joined by ``|``).

Pure functions and classes over plain values, so every layout is testable as text.
"""

from __future__ import annotations

import time

from garrison.cmdline.usage import UsageError
from garrison.model.state_codes import STATE_CODES, STATE_NAMES

TYPE_CHECKING = False  # not typing's, nor dataclasses: squeue starts as fast as gqueue (~10 ms less)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any, TypeVar

    T = TypeVar("T")

# Slurm's compact job state codes (squeue %t), long name -> code, and back
SHORT_STATES, LONG_STATES = STATE_CODES, STATE_NAMES
# The states a job ends in when something stopped it from outside: its exit code is the signal's.
_SIGNALLED_STATES = {"CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED"}
SIGNAL_BASE = 128  # a process killed by signal N exits 128+N in Garrison's records (the shell's habit)


def job_output_path(job: Any, pattern: str) -> str:
    """Where the output pattern ``pattern`` (--output or --error; '' for Slurm's default) of the batch job
    ``job`` (a GetJob answer) resolves: rank 0 on its first node, as scontrol's StdOut= and squeue --json's
    standard_output show it."""
    from garrison.model.outputpath import resolve_output_path

    return resolve_output_path(pattern or None, workdir=job.spec.workdir, job_id=job.job_id, rank=0, node_rank=0,
                               array_job_id=job.array_job_id if job.HasField("array_job_id") else None,
                               array_task_id=job.array_task_id if job.HasField("array_task_id") else None,
                               user=job.user, job_name=job.name)


def short_state(state: str) -> str:
    return SHORT_STATES.get(state, state[:2])


def state_names(given: Sequence[str]) -> list[str]:
    """The long names of ``-t/--state`` values, which may be short (``PD,R``) or long (``pending``), any
    case; ``ALL`` is kept. An unknown one is a usage error."""
    names = []
    for value in given:
        upper = value.strip().upper()
        if not upper:
            continue
        if upper == "ALL" or upper in SHORT_STATES:
            names.append(upper)
        elif upper in LONG_STATES:
            names.append(LONG_STATES[upper])
        elif upper == "CANCELED":
            names.append("CANCELLED")
        else:
            raise UsageError(f"invalid job state {value!r} (known: {', '.join(SHORT_STATES)}, or their codes)")
    return names


def exit_code_text(code: int | None, state: str = "") -> str:
    """Slurm's ``CODE:SIGNAL``: ``0:0``, ``1:0``; a job stopped from outside (cancelled, timed out, ...)
    whose process died of signal N shows ``0:N``, as sacct shows ``0:15``."""
    if code is None:
        return "0:0"
    if code < 0:
        return f"0:{-code}"
    if state in _SIGNALLED_STATES and SIGNAL_BASE < code < SIGNAL_BASE + 65:
        return f"0:{code - SIGNAL_BASE}"
    return f"{code}:0"


def sacct_state(state: str, uid: int | None = None) -> str:
    """A state as sacct writes it: the same words, ``CANCELLED by UID`` for a cancelled job, and RUNNING for
    a job still starting or stopping (CONFIGURING and COMPLETING are flags on a running job in Slurm; sacct
    shows the base state). submitit counts any state it does not list as unfinished, CONFIGURING among
    them, as finished."""
    if state == "CANCELLED" and uid is not None:
        return f"CANCELLED by {uid}"
    if state in ("CONFIGURING", "COMPLETING"):
        return "RUNNING"
    return state


def clock(epoch: float) -> str:
    """Slurm's timestamps: local time, ``2026-12-06T14:05:00``; ``Unknown`` when not set (sacct's word)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch)) if epoch else "Unknown"


def sacct_duration(seconds: float) -> str:
    """sacct's Elapsed and Timelimit: ``HH:MM:SS``, ``D-HH:MM:SS`` from a day on."""
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{text}" if days else text


def memory_mb(mb: int) -> str:
    """A memory size in Slurm's units: ``512M``, ``4G`` (whole gigabytes), ``0`` for none."""
    if not mb:
        return "0"
    return f"{mb // 1024}G" if mb % 1024 == 0 else f"{mb}M"


def fit(text: str, size: int | None, right: bool) -> str:
    """``text`` cut to ``size`` and padded to it (on the left when ``right``); whole without a size."""
    if size is None:
        return text
    text = text[:size]
    return text.rjust(size) if right else text.ljust(size)


# --- squeue's and sinfo's -o ------------------------------------------------------------------------------

_PERCENT_FIELD = r"%([.-]?)(\d*)([A-Za-z%])"  # compiled where used: re is ~10 M instructions of a scontrol


class Field:
    """One field of a layout: what it shows, its header, and how wide and which way it is justified."""

    __slots__ = ("key", "header", "size", "right")

    def __init__(self, key: str, header: str, size: int | None, right: bool) -> None:
        self.key, self.header, self.size, self.right = key, header, size, right

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Field) and (self.key, self.header, self.size, self.right) == (
            other.key, other.header, other.size, other.right)

    def __hash__(self) -> int:
        return hash((self.key, self.header, self.size, self.right))


class PercentFormat:
    """A parsed ``-o`` string: literal text and fields, whose letters must be keys of ``headers``."""

    def __init__(self, spec: str, headers: Mapping[str, str], option: str = "--format") -> None:
        self.parts: list[str | Field] = []
        position = 0
        import re

        for match in re.finditer(_PERCENT_FIELD, spec):
            if match.start() > position:
                self._literal(spec[position:match.start()], option)
            justify, size, letter = match.groups()
            position = match.end()
            if letter == "%":
                self.parts.append("%")
                continue
            if letter not in headers:
                known = " ".join("%" + k for k in headers)
                raise UsageError(f"{option}: unknown field %{letter} (known: {known})")
            self.parts.append(Field(letter, headers[letter], int(size) if size else None, justify == "."))
        if position < len(spec):
            self._literal(spec[position:], option)

    def _literal(self, text: str, option: str) -> None:
        if "%" in text:
            raise UsageError(f"{option}: a '%' must start a field such as %i or %.8j, or be written %%: {text!r}")
        self.parts.append(text)

    @classmethod
    def of_fields(cls, fields: list[Field]) -> PercentFormat:
        layout = cls("", {})
        layout.parts = list(fields)
        return layout

    def fields(self) -> list[Field]:
        return [part for part in self.parts if isinstance(part, Field)]

    def field_keys(self) -> set[str]:
        return {field.key for field in self.fields()}

    def line(self, value: Callable[[str], str]) -> str:
        return "".join(part if isinstance(part, str) else fit(value(part.key), part.size, part.right)
                       for part in self.parts)

    def header(self) -> str:
        return self.line({f.key: f.header for f in self.fields()}.__getitem__)

    def render(self, rows: Sequence[Callable[[str], str]], header: bool = True) -> list[str]:
        """The header line (unless not wanted) and one line per row; a row is a function from a key to its text."""
        lines = [self.header()] if header else []
        lines.extend(self.line(row) for row in rows)
        return lines


def parse_long_format(spec: str, names: Mapping[str, tuple[str, str]], option: str = "--Format") -> PercentFormat:
    """squeue's ``-O name[:[.]size],...``: ``names`` maps a lower-case field name to (key, header). Each
    field is 20 wide and left-justified unless its size says otherwise (``.`` right-justifies), and the
    fields follow each other with nothing between them, as squeue -O prints them."""
    fields = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, size_text = item.partition(":")
        entry = names.get(name.lower())
        if entry is None:
            raise UsageError(f"{option}: unknown field {name!r} (known: {', '.join(sorted(names))})")
        right = size_text.startswith(".")
        size_text = size_text.lstrip(".")
        if size_text and not size_text.isdigit():
            raise UsageError(f"{option}: the size of {name!r} must be a number: {item!r}")
        size = int(size_text) if size_text else 20
        fields.append(Field(entry[0], entry[1], size, right))
    if not fields:
        raise UsageError(f"{option}: no fields given")
    return PercentFormat.of_fields(fields)


# --- sacct's and sstat's -o ----------------------------------------------------------------------------


class ListField:
    """A field of sacct's -o: its canonical name, and its width (negative: left-justified), as sacct's
    ``print_fields`` has them."""

    __slots__ = ("name", "width")

    def __init__(self, name: str, width: int) -> None:
        self.name, self.width = name, width


class FieldList:
    """A parsed ``-o JobID,JobName%30,State`` against ``known``: the canonical names (sacct's spelling)
    and their default widths. Names match in any case; ``%N`` sets a field's width, right-justified
    (``%-N``: left-justified), as in sacct."""

    def __init__(self, spec: str, known: Mapping[str, int], option: str = "--format") -> None:
        by_lower = {name.lower(): name for name in known}
        self.fields: list[ListField] = []
        for item in spec.split(","):
            item = item.strip()
            if not item:
                continue
            name, percent, width_text = item.partition("%")
            canonical = by_lower.get(name.lower())
            if canonical is None:
                raise UsageError(f"{option}: unknown field {name!r} (known: {', '.join(known)})")
            width = known[canonical]
            if percent:
                try:
                    width = int(width_text)
                except ValueError:
                    raise UsageError(f"{option}: the width of {name!r} must be a number: {item!r}") from None
                if width == 0:
                    raise UsageError(f"{option}: the width of {name!r} must not be 0")
            self.fields.append(ListField(canonical, width))
        if not self.fields:
            raise UsageError(f"{option}: no fields given")

    def render(self, rows: Sequence[Mapping[str, str]], header: bool = True, parsable: str = "") -> list[str]:
        """The lines: ``parsable`` is "" (a table), "p" (``-p``: ``value|`` each) or "P" (``-P``: joined by ``|``)."""
        names = [f.name for f in self.fields]
        lines: list[str] = []
        if parsable:
            tail = "|" if parsable == "p" else ""
            if header:
                lines.append("|".join(names) + tail)
            lines.extend("|".join(row.get(name, "") for name in names) + tail for row in rows)
            return lines
        if header:
            lines.append(" ".join(fit(f.name, abs(f.width), f.width > 0) for f in self.fields) + " ")
            lines.append(" ".join("-" * abs(f.width) for f in self.fields) + " ")
        lines.extend(" ".join(_cell(row.get(f.name, ""), f.width) for f in self.fields) + " " for row in rows)
        return lines


def _cell(text: str, width: int) -> str:
    """sacct's print_fields: cut a longer value to the width with ``+`` as its last character, then pad (a
    header is cut without the ``+``)."""
    size = abs(width)
    if len(text) > size:
        text = text[:size - 1] + "+"
    return text.ljust(size) if width < 0 else text.rjust(size)


def sort_by_letters(items: Sequence[T], spec: str, keys: Mapping[str, Callable[[T], Any]],
                    unknown: Callable[[str], str]) -> list[T]:
    """``items`` in the order of a ``[-]LETTER,...`` spec (squeue's and sprio's ``-S``): the first letter
    decides first, ``-`` sorts that key descending; a letter not in ``keys`` is a UsageError saying
    ``unknown(letter)``."""
    ordered = list(items)
    for item in reversed([part.strip() for part in spec.split(",") if part.strip()]):
        letter = item.lstrip("+-")
        if letter not in keys:
            raise UsageError(unknown(letter))
        ordered.sort(key=keys[letter], reverse=item.startswith("-"))
    return ordered


def split_list(values: Sequence[str]) -> list[str]:
    """Comma lists given once or several times, as one list."""
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


# Garrison's reasons that Slurm names otherwise. A held job is JobHeldUser, as `sbatch --hold` and `scontrol
# hold` by its owner make it under Slurm 22.05 (Garrison does not record whether an admin held it); scripts
# that release their own held jobs look for that word.
_SLURM_REASONS = {"Held": "JobHeldUser"}


def slurm_reason(reason: str) -> str:
    """A pending job's reason as Slurm's commands name it ("None" for none)."""
    return _SLURM_REASONS.get(reason, reason) or "None"


def user_names(values: Sequence[str]) -> list[str]:
    """``-u`` users as Slurm's commands take them: names or numeric uids (cmmid/SA2UK's `squeue -u $UID`,
    which listed nothing here before), comma lists given once or several times. A uid this host does not know
    stays as written and matches nobody."""
    import pwd

    names = []
    for user in split_list(values):
        if user.isdigit():
            try:
                user = pwd.getpwuid(int(user)).pw_name
            except KeyError:
                pass
        names.append(user)
    return names
