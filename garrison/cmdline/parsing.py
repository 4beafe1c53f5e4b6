"""Pure parsers for gsub's option values and ``#GSUB`` directives.

Nothing here touches the terminal, the file system or the network, so every rule can be tested directly.
The formats follow sbatch wherever sbatch has one, so users can carry their habits (and scripts) over.
The CLI checks these for the user's convenience only: the controller validates every request again.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from garrison.cmdline.argparser import UsageError as UsageError  # raised by every parser here; re-exported
from garrison.model import hostlist
from garrison.model.jobspec import UNLIMITED_TIME_S

# Values end up in protobuf integer fields and database columns; refusing absurd numbers here gives the
# user a clear message instead of an overflow somewhere further down.
MAX_INT_VALUE = 2**31 - 1
MAX_ARRAY_ELEMENTS = 100_000

_DIGITS = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() would also accept "²" and other digits
_GPU_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_MEMORY = re.compile(r"([0-9]+)([KMGT]?)B?", re.IGNORECASE)
_MB_PER_UNIT = {"": 1, "M": 1, "G": 1024, "T": 1024 * 1024}
_ARRAY_ELEMENT = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TIME_FORMATS = "M, M:S, H:M:S, D-H, D-H:M or D-H:M:S"


def parse_count(text: str, *, minimum: int = 1) -> int:
    """A plain ASCII decimal number of at least ``minimum``. Errors read well after an option name."""
    if not _DIGITS.fullmatch(text):
        if text.startswith("-") and _DIGITS.fullmatch(text[1:]):
            raise UsageError(f"must be at least {minimum}, got {text!r}")
        raise UsageError(f"must be a whole number, got {text!r}")
    value = int(text)
    if value < minimum:
        raise UsageError(f"must be at least {minimum}, got {text!r}")
    if value > MAX_INT_VALUE:
        raise UsageError(f"is too large: {text!r}")
    return value


def parse_node_count(text: str) -> int:
    """-N/--nodes: N, or sbatch's MIN-MAX range, which asks for at least MIN nodes: Garrison allocates MIN (one
    of the allocations Slurm may give; the job reads its count from SLURM_NNODES either way)."""
    low, has_range, high = text.strip().partition("-")
    minimum = parse_count(low)
    if has_range and parse_count(high) < minimum:
        raise UsageError(f"the range {text.strip()!r} ends below its start")
    return minimum


_BARE_JOB_ID = re.compile(r"[0-9]+(?:_[0-9]+)?")


def slurm_dependency(text: str) -> str:
    """-d/--dependency as the controller reads it (controller/dependency.py): an item that is a job id alone
    (``-d 12``, Slurm's old form, still accepted by sbatch) means ``afterany:12``, as slurmctld reads it."""
    stripped = text.strip()
    if not stripped:
        raise UsageError("must not be empty")
    separator = "?" if "?" in stripped else ","
    return separator.join(f"afterany:{item.strip()}" if _BARE_JOB_ID.fullmatch(item.strip()) else item.strip()
                          for item in stripped.split(separator))


MAX_NICE = 2_147_483_645  # sbatch's range (the controller checks it again)


def parse_nice(text: str) -> int:
    """--nice=N: a whole number, negative allowed (admins only; the controller decides)."""
    digits = text[1:] if text[:1] in "+-" else text
    if not _DIGITS.fullmatch(digits):
        raise UsageError(f"must be a whole number, got {text!r}")
    value = int(text)
    if abs(value) > MAX_NICE:
        raise UsageError(f"must be between -{MAX_NICE} and {MAX_NICE}, got {text!r}")
    return value


_BEGIN_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_BEGIN_FORMATS = ("now[+N[minutes|hours|days|weeks]], HH:MM[:SS][AM|PM], YYYY-MM-DD[THH:MM[:SS]], MM/DD[/YY], "
                  "midnight, noon, teatime, today or tomorrow (a date and a time may go together)")
# sbatch's words for times of day (Slurm's, fika and elevenses included).
_BEGIN_WORDS = {"midnight": (0, 0), "noon": (12, 0), "elevenses": (11, 0), "fika": (15, 0), "teatime": (16, 0)}
# The pieces of a begin time, tried in this order at each place (parse_time.c's grammar, our own reading):
_BEGIN_PIECES = re.compile(
    r"""(?P<epoch>uts(?P<seconds>[0-9]{7,12}))
      | (?P<now>now(?:\s*(?P<sign>[+-])\s*(?P<count>[0-9]{1,9})\s*
            (?P<unit>seconds|second|secs|sec|s|minutes|minute|mins|min|m|hours|hour|h|days|day|d|weeks|week|w)?)?)
      | (?P<day>today|tomorrow)
      | (?P<word>midnight|noon|elevenses|fika|teatime)
      | (?P<clock>(?P<hour>[0-9]{1,2}):(?P<minute>[0-9]{2})(?::(?P<second>[0-9]{2}))?(?:\s*(?P<half>am|pm))?)
      | (?P<iso>(?P<iso_year>[0-9]{4})-(?P<iso_month>[0-9]{1,2})-(?P<iso_day>[0-9]{1,2}))
      | (?P<date>(?P<month>[0-9][0-9]?)[./]?(?P<mday>[0-9][0-9]?)(?:[./]?(?P<year>[0-9]{2}))?)
    (?![0-9a-z])""",
    re.IGNORECASE | re.VERBOSE,
)
_BEGIN_SEPARATORS = re.compile(r"(?:[\s-]|T(?=[0-9]))*")  # "T" only before a time: not the one of "Today"


def parse_begin_time(text: str, now: float) -> float:
    """sbatch --begin, as an epoch time on this machine's clock (local time), with Slurm's forms and rules:

    "now", "now+90" (seconds), "now+2hours", "now-1day"; "16:00", "16:00:30", "4:00PM" (today, or tomorrow
    once that minute has passed today), "midnight", "noon", "elevenses" (11:00), "fika" (15:00) and
    "teatime" (16:00) likewise; "today" and "tomorrow" (their first second); "2026-12-24", "12/24",
    "12/24/26", "1224" (that day's first second; without a year, this year's if still to come, else next
    year's); a date and a time together, in either order, apart by a space, "-" or "T" ("2026-12-24T08:00",
    "12/24-16:00", "4:00PM tomorrow"); "uts1767225600" (seconds since the epoch). A time in the past is
    allowed: the job may start at once.
    """
    import time

    spec = text.strip()

    def bad() -> UsageError:
        return UsageError(f"invalid begin time {text!r}: expected {_BEGIN_FORMATS}")

    year = month = mday = hour = minute = None
    second = 0
    relative: float | None = None  # now[+-N] alone: to the fraction of a second, not truncated to one
    pieces = 0
    pos = _BEGIN_SEPARATORS.match(spec).end()  # type: ignore[union-attr]
    if pos == len(spec):
        raise bad()
    while pos < len(spec):
        piece = _BEGIN_PIECES.match(spec, pos)
        if piece is None:
            raise bad()
        pieces += 1
        if piece["epoch"]:
            return float(piece["seconds"])
        if piece["now"]:
            delta = int(piece["count"] or 0) * _BEGIN_UNITS[(piece["unit"] or "s")[0].lower()]
            relative = now + (delta if piece["sign"] != "-" else -delta)
            year, month, mday, hour, minute, second = time.localtime(relative)[:6]
        elif piece["day"]:
            at = time.localtime(now + (86400 if piece["day"].lower() == "tomorrow" else 0))
            year, month, mday = at[:3]
        elif piece["word"]:
            (hour, minute), second = _BEGIN_WORDS[piece["word"].lower()], 0
        elif piece["clock"]:
            hour, minute, second = int(piece["hour"]), int(piece["minute"]), int(piece["second"] or 0)
            half = (piece["half"] or "").lower()
            if hour > 23 or minute > 59 or second > 59 or (half and not 1 <= hour <= 12):
                raise bad()
            if half:
                hour = hour % 12 + (12 if half == "pm" else 0)
        elif piece["iso"]:
            year, month, mday = int(piece["iso_year"]), int(piece["iso_month"]), int(piece["iso_day"])
        else:
            month, mday = int(piece["month"]), int(piece["mday"])
            year = 2000 + int(piece["year"]) if piece["year"] else None
        if month is not None and not (1 <= month <= 12 and 1 <= (mday or 0) <= 31):
            raise bad()
        pos = _BEGIN_SEPARATORS.match(spec, piece.end()).end()  # type: ignore[union-attr]

    if relative is not None and pieces == 1:
        return relative
    today = time.localtime(now)
    if hour is None:  # a date alone: its first second
        hour, minute, second = 0, 0, 0
    assert minute is not None
    if month is None:  # a time alone: today's if that minute is still to come, else tomorrow's
        later = (hour, minute) > (today.tm_hour, today.tm_min)
        year, month, mday = time.localtime(now + (0 if later else 86400))[:3]
    assert mday is not None
    if year is None:  # a day without a year: this year's if still to come, else next year's
        coming = (month, mday, hour, minute) > (today.tm_mon, today.tm_mday, today.tm_hour, today.tm_min)
        year = today.tm_year + (0 if coming else 1)
    begin = time.mktime((year, month, mday, hour, minute, second, 0, 0, -1))
    if time.localtime(begin)[:3] != (year, month, mday):  # 02/30 and the like: mktime would roll it over
        raise bad()
    return begin


def parse_submit_time_limit(text: str) -> int:
    """sbatch's and srun's ``--time``: ``parse_time_limit``, or ``UNLIMITED``/``INFINITE``/``0``/``-1`` (case as
    you like): no limit but the partition's and the QoS's maximum (UNLIMITED_TIME_S, which the controller
    resolves)."""
    if text.strip().upper() in ("UNLIMITED", "INFINITE", "0", "-1"):
        return UNLIMITED_TIME_S
    return parse_time_limit(text)


def parse_time_limit(text: str) -> int:
    """Slurm's time formats, returned in seconds.

    "M", "M:S", "H:M:S", "D-H", "D-H:M", "D-H:M:S". No field is bounded, as none is in Slurm's own parser
    (parse_time.c): "00:60:00" is an hour and "1:75" two minutes and fifteen seconds, and real scripts
    write the former.
    """

    def bad(reason: str) -> UsageError:
        return UsageError(f"invalid time limit {text!r}: {reason}")

    def field(value: str) -> int:
        if not _DIGITS.fullmatch(value):
            raise bad(f"expected {_TIME_FORMATS}")
        return int(value)

    days_text, has_days, clock = text.strip().rpartition("-")
    parts = [field(part) for part in clock.split(":")]
    if len(parts) > 3:
        raise bad(f"expected {_TIME_FORMATS}")
    if has_days:  # D-H[:M[:S]]
        days = field(days_text)
        hours, minutes, seconds = (*parts, 0, 0)[:3]
    else:  # M, M:S or H:M:S
        days = 0
        hours, minutes, seconds = ((0, *parts, 0) if len(parts) < 3 else parts)[:3]

    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total <= 0:
        raise bad("must be longer than zero")
    if total > MAX_INT_VALUE:
        raise bad("too long")
    return total


def parse_gpu_request(text: str) -> tuple[str | None, int]:
    """ "N" or "TYPE:N" (as in ``--gpus a100:8``) -> (type or None, N); N is at least 1."""
    gpu_type, has_type, count_text = text.strip().rpartition(":")
    if has_type and not _GPU_TYPE.fullmatch(gpu_type):
        raise UsageError(f"invalid GPU request {text!r}: expected N or TYPE:N, such as 8 or a100:8")
    try:
        count = parse_count(count_text)
    except UsageError as problem:
        raise UsageError(f"invalid GPU request {text!r}: the count {problem}") from None
    return (gpu_type if has_type else None), count


def parse_memory_mb(text: str, *, zero_allowed: bool = False) -> int:
    """Memory with an optional K/M/G/T suffix and an optional B (binary units, as in Slurm: 90G, 90GB,
    512M, 1T); a plain number is megabytes. Zero only with ``zero_allowed`` (``--mem=0``: all of each
    node's memory)."""
    match = _MEMORY.fullmatch(text.strip())
    if match is None:
        raise UsageError(
            f"invalid memory size {text!r}: expected a number with an optional K, M, G or T suffix"
        )
    number, unit = int(match.group(1)), match.group(2).upper()
    # Kilobytes round up so a small request never becomes a zero-megabyte one.
    megabytes = -(-number // 1024) if unit == "K" else number * _MB_PER_UNIT[unit]
    if megabytes == 0 and zero_allowed:
        return 0
    if megabytes <= 0:
        raise UsageError(f"invalid memory size {text!r}: must be larger than zero")
    if megabytes > MAX_INT_VALUE:
        raise UsageError(f"invalid memory size {text!r}: too large")
    return megabytes


# Generic resources sites define to ask for GPUs with at least so much memory each (vmem:10G, VRAM:12G,
# gpumem:11G, gpu_mem:48000 in MB, VramPerGpu:20G: all in real scripts, beside gpu:N): what --gpu-mem asks.
_GPU_MEMORY_GRES = frozenset({"vmem", "vram", "gpumem", "gpumemory", "vrampergpu", "gpuram"})


def split_gpu_memory(text: str) -> tuple[str, int | None]:
    """``--gres`` without its GPU-memory items, and the memory they ask of each GPU in MB (the largest where
    several do; None where none does): ``gpu:1,vmem:10G`` -> (``gpu:1``, 10240)."""
    if ":" not in text:
        return text, None
    kept: list[str] = []
    memory: int | None = None
    for item in text.split(","):
        name, _, value = item.strip().partition(":")
        if name.lower().replace("_", "").replace("-", "") not in _GPU_MEMORY_GRES:
            kept.append(item)
            continue
        try:
            megabytes = parse_memory_mb(value)
        except UsageError:
            raise UsageError(f"invalid --gres {text!r}: {name} takes a memory size, such as {name}:16G") from None
        memory = max(memory or 0, megabytes)
    return ",".join(kept), memory


def parse_gres(text: str) -> tuple[str | None, int]:
    """sbatch's ``--gres=gpu[:TYPE][:N]`` -> (type or None, GPUs per node). Garrison schedules GPUs only:
    any other resource name is an error naming it.

    ``none`` and a count of 0 (``gpu:0``, common in real scripts that run on a GPU partition without GPUs)
    are (None, 0): no GPUs, as Slurm reads them, for a job and for a step (srun's ``--gres=none``)."""
    if text.strip().lower() == "none":
        return None, 0
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise UsageError(f"invalid --gres {text!r}: expected gpu[:TYPE]:N, such as gpu:4 or gpu:a100:4")
    others = [item.split(":", 1)[0] for item in items if item.split(":", 1)[0] != "gpu"]
    if others:
        raise UsageError(f"unknown generic resource {others[0]!r}: Garrison schedules only gpu (gpu[:TYPE]:N)")
    if len(items) > 1:
        raise UsageError(f"invalid --gres {text!r}: give gpu once")
    parts = items[0].split(":")[1:]
    if len(parts) > 2 or any(not part for part in parts):
        raise UsageError(f"invalid --gres {text!r}: expected gpu[:TYPE]:N, such as gpu:4 or gpu:a100:4")
    if not parts:
        return None, 1
    if len(parts) == 1 and not parts[0].isdigit():
        return parse_gpu_request(f"{parts[0]}:1")  # gpu:a100 is one GPU of that type, as in Slurm
    try:
        if parts[-1].isdigit() and int(parts[-1]) == 0:
            if len(parts) == 2:
                parse_gpu_request(f"{parts[0]}:1")  # the type's spelling is still checked
            return None, 0
        return parse_gpu_request(":".join(parts))
    except UsageError:
        raise UsageError(f"invalid --gres {text!r}: expected gpu[:TYPE]:N, such as gpu:4 or gpu:a100:4") from None


_TRES_ITEM = re.compile(r"(cpu|gres[/:]gpu)(?::([A-Za-z0-9][A-Za-z0-9._-]*))?(?:[=:]([0-9]+))?", re.IGNORECASE)


def parse_tres_per_task(text: str) -> tuple[int | None, str | None]:
    """sbatch's and srun's ``--tres-per-task=cpu=4,gres/gpu:a100=1`` -> (CPUs per task, GPUs per task as
    --gpus-per-task takes them: ``N`` or ``TYPE:N``), None for what it leaves out.

    As Slurm writes each item, ``TRES[/NAME]=COUNT``; ``:`` before the count and ``gres:gpu`` (the older
    spelling, which Slurm's own --gpus-per-task turns into) are read too, and a gres without a count is one.
    Garrison schedules CPUs and GPUs per task: any other resource (a license, a shard) is an error naming it.
    """
    cpus: int | None = None
    gpus: str | None = None
    for item in (part.strip() for part in text.split(",")):
        if not item:
            raise UsageError(f"invalid {text!r}: an empty item (expected cpu=N or gres/gpu[:TYPE]=N, comma-separated)")
        match = _TRES_ITEM.fullmatch(item)
        if match is None:
            name = re.split(r"[=:]", item, maxsplit=1)[0]
            if name.lower() in ("cpu", "gres/gpu", "gres:gpu"):
                raise UsageError(f"invalid item {item!r}: expected cpu=N or gres/gpu[:TYPE]=N")
            raise UsageError(f"{name!r} is not a resource Garrison gives per task: use cpu=N or gres/gpu[:TYPE]=N")
        kind, gpu_type, count_text = match.group(1).lower(), match.group(2), match.group(3)
        if gpu_type is not None and gpu_type.isdigit() and count_text is None:
            gpu_type, count_text = None, gpu_type  # gres/gpu:2, cpu:4: the count after a colon
        if kind == "cpu":
            if gpu_type is not None or count_text is None:
                raise UsageError(f"invalid item {item!r}: expected cpu=N")
            if cpus is not None:
                raise UsageError("cpu is given twice")
            cpus = _item_count(item, count_text)
        else:
            if gpus is not None:
                raise UsageError("gres/gpu is given twice")
            count = _item_count(item, count_text or "1")
            gpus = f"{gpu_type}:{count}" if gpu_type else str(count)
    return cpus, gpus


def _item_count(item: str, count_text: str) -> int:
    try:
        return parse_count(count_text)
    except UsageError as problem:
        raise UsageError(f"{item!r}: the count {problem}") from None


@dataclass(frozen=True)
class ArraySpec:
    """The task indices of a job array, ascending and distinct, and how many may run at once."""

    indices: tuple[int, ...]
    max_running: int | None


def parse_array(text: str) -> ArraySpec:
    """sbatch's ``--array``: comma-separated N, N-M or N-M:STEP elements, optionally ending in %LIMIT.

    Overlapping elements merge, as in Slurm. At most MAX_ARRAY_ELEMENTS indices; the size of a range is
    checked before it is expanded, so "0-999999999" is refused without building a billion integers.
    """

    def bad(reason: str) -> UsageError:
        return UsageError(f"invalid array {text!r}: {reason}")

    elements_text, has_limit, limit_text = text.strip().partition("%")
    max_running = None
    if has_limit:
        try:
            max_running = parse_count(limit_text)
        except UsageError as problem:
            raise bad(f"the %limit {problem}") from None
    if not elements_text:
        raise bad("no indices given")

    indices: set[int] = set()
    for element in elements_text.split(","):
        match = _ARRAY_ELEMENT.fullmatch(element)
        if match is None:
            raise bad(f"element {element!r} is not N, N-M or N-M:STEP")
        start = int(match.group(1))
        end = int(match.group(2)) if match.group(2) is not None else start
        step = int(match.group(3)) if match.group(3) is not None else 1
        if end < start:
            raise bad(f"range {element!r} ends before it starts")
        if step == 0:
            raise bad(f"step in {element!r} must be at least 1")
        if end > MAX_INT_VALUE:
            raise bad(f"index in {element!r} is too large")
        if (end - start) // step + 1 > MAX_ARRAY_ELEMENTS:
            raise bad(f"more than {MAX_ARRAY_ELEMENTS} tasks")
        indices.update(range(start, end + 1, step))
        if len(indices) > MAX_ARRAY_ELEMENTS:
            raise bad(f"more than {MAX_ARRAY_ELEMENTS} tasks")
    return ArraySpec(indices=tuple(sorted(indices)), max_running=max_running)


def _strip_trailing_comment(text: str) -> str:
    """Cut ``text`` at its first ``#`` outside quotes and not escaped, as sbatch reads its directives (a ``#``
    ends the line's options even inside a word: ``--begin=09:00# a note`` is ``--begin=09:00``). A directive
    may carry a note (``#GSUB -N 2  # two nodes``); a ``#`` in a value is quoted or escaped (``--output='a#b'``,
    ``--output=a\\#b``), as it must be for sbatch.
    """
    quote: str | None = None
    escaped = False
    for position, char in enumerate(text):
        if escaped:
            escaped = False
        elif quote is not None:
            if char == quote:
                quote = None
            elif char == "\\" and quote == '"':
                escaped = True
        elif char in "'\"":
            quote = char
        elif char == "\\":
            escaped = True
        elif char == "#":
            return text[:position]
    return text


def read_directive_lines(script_text: str, directive: str = "#GSUB") -> list[tuple[int, list[str]]]:
    """Each directive line of the script's leading comment block as (1-based line number, words).

    Like sbatch with ``#SBATCH``: the directive must start the line; scanning stops at the first line
    that is neither blank nor a comment, so a directive further down (say, in a heredoc) is ignored.
    A "##GSUB" line is a plain comment, which is the usual way to switch a directive off.
    """
    found: list[tuple[int, list[str]]] = []
    for line_number, line in enumerate(script_text.splitlines(), start=1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        if not line.startswith(directive):
            continue
        rest = line[len(directive) :]
        if rest and not rest[0].isspace():
            continue  # "#GSUBX" is some other tool's comment, not ours
        try:
            words = shlex.split(_strip_trailing_comment(rest))
        except ValueError as error:  # shlex's only failure: an unclosed quote or a trailing backslash
            raise UsageError(f"line {line_number}: cannot split directive: {error}") from None
        if words:
            found.append((line_number, words))
    return found


def read_directives(script_text: str, directive: str = "#GSUB") -> list[str]:
    """All directive words of the script's leading comment block, in order, as one argv list."""
    return [word for _, words in read_directive_lines(script_text, directive) for word in words]


def _split_export_items(text: str) -> list[str]:
    """Split on commas outside quotes, so FOO="a,b" stays one item."""
    items: list[str] = []
    current: list[str] = []
    quote: str | None = None
    for char in text:
        if quote is not None:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == ",":
            items.append("".join(current))
            current = []
            continue
        current.append(char)
    if quote is not None:
        raise UsageError(f"invalid --export {text!r}: unclosed quote")
    items.append("".join(current))
    return items


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def parse_export(text: str, environ: Mapping[str, str]) -> dict[str, str]:
    """sbatch's ``--export``: the job's environment built from the submitter's ``environ``.

    "ALL" copies everything, "NONE" nothing; otherwise a comma list of NAME (copy the current value,
    skipped when unset, as sbatch does) and NAME=VALUE, with "ALL" anywhere in it to start from a full
    copy. Explicit NAME=VALUE items win over the copy wherever ALL appears.
    """
    items = _split_export_items(text.strip())
    if any(not item for item in items):
        raise UsageError(f"invalid --export {text!r}: empty entry")
    keywords = [item.upper() for item in items if item.upper() in ("ALL", "NONE")]
    if "NONE" in keywords:
        if len(items) > 1:
            raise UsageError(f"invalid --export {text!r}: NONE cannot be combined with other entries")
        return {}
    exported = dict(environ) if keywords else {}
    for item in items:
        if item.upper() == "ALL":
            continue
        name, has_value, value = item.partition("=")
        if not _ENV_NAME.fullmatch(name):
            raise UsageError(f"invalid --export {text!r}: {item!r} is not NAME or NAME=VALUE")
        if has_value:
            exported[name] = _unquote(value)
        elif name in environ:
            exported[name] = environ[name]
    return exported


def parse_constraint_text(text: str) -> str:
    """-C/--constraint: a feature expression (``a100&ib``, ``a100|h100``), checked and kept as given, except
    that a comma is ``&``, as slurmctld reads it (``-C gpu,ss11,a100``: it replaces every comma with ``&``)."""
    from garrison.model.features import ConstraintError, parse_constraint

    expression = text.strip().replace(",", "&")
    try:
        parse_constraint(expression)
    except ConstraintError as err:
        raise UsageError(str(err)) from None
    return expression


def parse_exclusive(text: str) -> bool:
    """--exclusive (alone), or sbatch's =user, =mcs and =topo, which Garrison takes as whole nodes too."""
    if text not in ("node", "user", "mcs", "topo"):
        raise UsageError(f"expected --exclusive alone or --exclusive=user|mcs|topo, got {text[:40]!r}")
    return True


def expand_hostlist(text: str) -> list[str]:
    """gsub's reading of a host list (-x, -w): the shared parser, its errors as usage errors."""
    try:
        return hostlist.expand_hostlist(text)
    except hostlist.HostListError as err:
        raise UsageError(str(err)) from None
