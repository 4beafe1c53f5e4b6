"""Job traces: reading CSV files, checking every row, and drawing what a trace lacks.

The ElasticFlow format (``job_id,submission_time,duration,num_gpu``; seconds) is recognised by its header.
Any other CSV is read through a ``ColumnMapping`` that names the columns holding the arrival time, the
duration (or the start and end times it follows from) and the GPU count, and optionally the job id, user,
account, QoS and time limit. A malformed row stops the whole read with ``TraceError`` naming the file, the
line and the column: a replay never starts on half a trace.

Real clusters' traces also hold jobs that have no place in a GPU replay: jobs without GPUs (CPU jobs: most
rows of some traces) and jobs that never ran (cancelled while pending: no run time, or no start or end).
Those are left out, not refused, and counted (``TraceRead``), so a study says what it left out.

Traces rarely say who submitted a job or what time limit was asked for, yet fair share needs accounts and
backfill needs limits. ``complete_jobs`` fills both in deterministically from a seed, before any policy
runs, so every policy replays exactly the same jobs.
"""

from __future__ import annotations

import codecs
import csv
import io
import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from garrison.config import ConfigError, parse_duration

ELASTICFLOW_COLUMNS = ("job_id", "submission_time", "duration", "num_gpu")

# Time limits users typically ask for, in hours: a drawn limit is rounded up to the next of these (and
# past the last one, to whole multiples of it), like users who round to "an hour", "a day", "three days".
COMMON_LIMITS_H = (1, 4, 24, 72, 168, 336)


class TraceError(ValueError):
    """A trace problem, in one line naming the file, the line and the column."""


@dataclass(frozen=True, slots=True)
class ColumnMapping:
    """Which CSV column holds which field. Times and durations are in seconds; a time limit may also be a
    Slurm duration such as ``4:00:00`` or ``1-00:00:00``."""

    arrival: str
    gpus: str
    duration: str | None = None  # or both of start and end: the run time is end - start
    start: str | None = None
    end: str | None = None
    job_id: str | None = None
    user: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: str | None = None
    # Seconds per unit of the plain numbers in the time columns (arrival, duration, start, end, time limit): 1
    # for seconds, 0.001 for milliseconds, 60 for minutes (gsim --time-unit). Dates and Slurm durations are
    # read as they say.
    seconds_per_unit: float = 1.0

    FIELDS = ("arrival", "duration", "gpus", "start", "end", "job_id", "user", "account", "qos", "time_limit")

    @classmethod
    def parse(cls, text: str) -> ColumnMapping:
        """``arrival=submit,duration=run,gpus=ngpu[,user=..,account=..,qos=..,time_limit=..,job_id=..]``, with
        ``start=..,end=..`` in place of ``duration`` where a trace gives when each job ran."""
        values: dict[str, str] = {}
        for item in text.split(","):
            key, sep, column = (part.strip() for part in item.partition("="))
            if not sep or not key or not column:
                raise TraceError(f"column mapping: expected FIELD=COLUMN, got {item.strip()!r}")
            if key not in cls.FIELDS:
                raise TraceError(f"column mapping: unknown field {key!r} (known: {', '.join(cls.FIELDS)})")
            if key in values:
                raise TraceError(f"column mapping: field {key!r} given twice")
            values[key] = column
        if "duration" in values and ("start" in values or "end" in values):
            raise TraceError("column mapping: give either duration or start and end, not both")
        timed = "duration" in values or ("start" in values and "end" in values)
        missing = [f if f != "duration" else "duration (or start and end)"
                   for f in ("arrival", "duration", "gpus") if f not in values and (f != "duration" or not timed)]
        if missing:
            raise TraceError(f"column mapping: missing {', '.join(missing)}")
        return cls(**values)  # type: ignore[arg-type]  # every key is one of FIELDS, each a column name


ELASTICFLOW = ColumnMapping(arrival="submission_time", duration="duration", gpus="num_gpu", job_id="job_id")

# gsim --time-unit: the unit of a trace's plain numbers of time, in seconds.
TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace. ``duration_s`` is the true run time: the replay uses it to end the job, and no
    scheduling policy ever sees it."""

    job_id: str
    line: int  # line of the trace file, for messages
    submit_s: float
    duration_s: float
    gpus: int
    user: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit_s: int | None = None


def _number(text: str, where: str, column: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{where}, column {column!r}: expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"{where}, column {column!r}: expected a non-negative number, got {text!r}")
    return value


_SLASH_DATE = re.compile(r"^\d{4}/\d{1,2}/\d{1,2}(?:[ T]|$)")


def _arrival(text: str, where: str, column: str, unit_s: float = 1.0) -> tuple[float, bool]:
    """An arrival time: a number of ``unit_s`` (seconds by default), or a date and time (``2017-10-09
    07:01:55``, ISO 8601, read as UTC when it names no zone), as seconds since the epoch. Returns (seconds,
    whether it was a date)."""
    if _is_number(text):
        return _number(text, where, column) * unit_s, False
    try:
        # 2020/06/09 18:41:01 (some exports' dates) as 2020-06-09 18:41:01
        when = datetime.fromisoformat(text.replace("/", "-") if _SLASH_DATE.match(text) else text)
    except ValueError:
        raise TraceError(
            f"{where}, column {column!r}: expected seconds or a date and time like '2017-10-09 07:01:55', "
            f"got {text!r}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp(), True


def _gpu_count(text: str, where: str, column: str) -> int:
    """A number of GPUs, 0 included (a CPU job, which the caller leaves out; a share of one is one), or a Slurm
    TRES list as sacct prints AllocTRES (``billing=8,cpu=8,gres/gpu=2,mem=64G,node=1``: 2; no gres/gpu: 0)."""
    if "=" in text:
        return _tres_gpus(text, where, column)
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"{where}, column {column!r}: expected a number of GPUs, got {text!r}")
    # A share of a GPU (0.5: GPU-sharing clusters' traces) takes a whole one here, as Garrison allocates them.
    return math.ceil(value)


def _tres_gpus(text: str, where: str, column: str) -> int:
    """The GPUs of a TRES list: its ``gres/gpu=N``, or else the sum of its typed ``gres/gpu:TYPE=N`` (Slurm
    lists both for a typed request; only the typed ones for some)."""
    plain, typed = None, 0
    for item in text.split(","):
        name, _, count = item.strip().partition("=")
        if name != "gres/gpu" and not name.startswith("gres/gpu:"):
            continue
        if not count.isdigit():
            raise TraceError(f"{where}, column {column!r}: expected a GPU count in {item.strip()!r}, got {text!r}")
        if name == "gres/gpu":
            plain = int(count)
        else:
            typed += int(count)
    return plain if plain is not None else typed


@dataclass(frozen=True, slots=True)
class TraceRead:
    """A trace's jobs with GPUs that ran, and how many rows were left out, and why."""

    jobs: list[TraceJob]
    without_gpus: int = 0  # CPU jobs: nothing to replay on GPUs
    never_ran: int = 0  # no run time (an empty duration, start or end): cancelled before they started
    steps: int = 0  # sacct's rows of job steps (123.batch, 123.0): the job's own row is the job
    without_arrival: int = 0  # an empty arrival cell (a task still waiting when the trace was cut)
    still_running: int = 0  # a start and no end: running when the trace was cut, for how long no one knows

    def left_out_text(self) -> str:
        """``left out: 3 jobs without GPUs, 1 that never ran`` (empty when nothing was)."""
        parts = [f"{self.without_gpus} {'job' if self.without_gpus == 1 else 'jobs'} without GPUs"
                 if self.without_gpus else "",
                 f"{self.never_ran} that never ran (no run time)" if self.never_ran else "",
                 f"{self.steps} job step rows" if self.steps else "",
                 f"{self.without_arrival} without an arrival time" if self.without_arrival else "",
                 f"{self.still_running} still running when the trace ends" if self.still_running else ""]
        shown = ", ".join(part for part in parts if part)
        return f"left out: {shown}" if shown else ""


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


# A job step's id as sacct prints it (123.batch, 123.extern, 123.0, 77_3.0, 9+1.0): its job has a row of its own.
SLURM_STEP_ID = re.compile(r"^\d+(?:_\d+)?(?:\+\d+)?\.[A-Za-z0-9]+$")

# What sacct prints where a time, a limit or a run time is not known, and what pandas, R and databases write
# for a missing value: the cell is read as empty.
NOT_KNOWN = frozenset({"unknown", "none", "unlimited", "infinite", "partition_limit", "invalid",
                       "nan", "na", "n/a", "null", "nat"})


def _known(text: str | None) -> str:
    """``text`` stripped, or "" where it says the value is not known."""
    stripped = (text or "").strip()
    return "" if stripped.lower() in NOT_KNOWN else stripped


def _time_limit(text: str, where: str, column: str, unit_s: float = 1.0) -> int | None:
    stripped = _known(text)
    if not stripped:
        return None
    try:
        # A bare number is seconds (trace convention; or --time-unit's), not Slurm's minutes; anything else is
        # a Slurm duration.
        seconds = (int(math.ceil(float(stripped) * unit_s)) if _is_number(stripped)
                   else parse_duration(stripped, where))
    except ConfigError:
        raise TraceError(
            f"{where}, column {column!r}: expected seconds or a duration like 4:00:00, got {text!r}"
        ) from None
    if seconds <= 0:
        raise TraceError(f"{where}, column {column!r}: a time limit must be positive, got {text!r}")
    return seconds


def read_trace(path: str | Path, mapping: ColumnMapping | None = None,
               header: Sequence[str] | None = None) -> list[TraceJob]:
    """Every job of the CSV at ``path`` that has GPUs and ran, in arrival order (ties keep file order), or
    TraceError. ``header``: the column names of a file without a header line (Alibaba PAI's tables keep
    theirs in separate .header files): every line of the file is then a row."""
    return read_trace_counted(path, mapping, header).jobs


def read_trace_counted(path: str | Path, mapping: ColumnMapping | None = None,
                       header: Sequence[str] | None = None) -> TraceRead:
    """``read_trace``, with the counts of the rows left out."""
    path = Path(path)
    text = _trace_text(path)
    if text.lstrip()[:1] in ("[", "{"):
        raise TraceError(f"{path}: JSON, not CSV: gsim reads a CSV of one job a row (convert it first, e.g. "
                         f"Philly's cluster_job_log with pandas.json_normalize(...).to_csv)")
    given_header = [name.strip() for name in header] if header is not None else None
    without_gpus = never_ran = steps = without_arrival = still_running = 0
    with io.StringIO(text, newline="") as handle:
        # The header is the first line with anything on it: a trace written by hand or cut from a larger
        # file may start with blank lines, and csv reads a blank line as a row of no cells.
        first = next((line for line in handle if line.strip()), "")
        handle.seek(0)
        # sacct -P (--parsable2) separates its fields with '|': such a dump is read as it is. Every cell is
        # stripped, and skipinitialspace lets a quoted cell follow a separator and a space (``a, "b"``).
        reader = csv.reader(handle, delimiter="|" if "|" in first and "," not in first else ",",
                            skipinitialspace=True)
        if given_header is not None:
            header, at_header = given_header, f"{path} (--header)"
        else:
            try:
                header = next([h.strip() for h in row] for row in reader if any(cell.strip() for cell in row))
            except StopIteration:
                raise TraceError(f"{path}: the trace is empty") from None
            except csv.Error as err:
                raise TraceError(f"{path}, line {reader.line_num}: unreadable CSV header: {err}") from None
            at_header = f"{path}, line {reader.line_num}"
        if mapping is None:
            if not set(ELASTICFLOW_COLUMNS) <= set(header):
                raise TraceError(
                    f"{at_header}: not the ElasticFlow format ({','.join(ELASTICFLOW_COLUMNS)}); header is "
                    f"{','.join(header)!r}: give a column mapping (--columns arrival=...,duration=...,gpus=...)"
                )
            mapping = ELASTICFLOW
        index: dict[str, int] = {}
        for field in ColumnMapping.FIELDS:
            column = getattr(mapping, field)
            if column is None:
                continue
            if column not in header:
                hint = "" if given_header is not None else " (a file without a header line: give --header NAMES)"
                raise TraceError(f"{at_header}: no column {column!r} (for {field}) in the header{hint}")
            if header.count(column) > 1:
                # Which of them holds the field is anybody's guess: reading the first could replay the wrong one.
                raise TraceError(f"{at_header}: column {column!r} (for {field}) appears {header.count(column)} "
                                 f"times in the header")
            index[field] = header.index(column)
        jobs: list[TraceJob] = []
        arrivals_dated: bool | None = None  # whether the first row gave its arrival as a date
        try:
            for row in reader:
                line = reader.line_num
                if not row or all(not cell.strip() for cell in row):
                    continue
                where = f"{path}, line {line}"
                if len(row) != len(header):
                    raise TraceError(f"{where}: {len(row)} columns, the header has {len(header)}")

                def cell(field: str, row: Sequence[str] = row) -> str | None:
                    return row[index[field]].strip() if field in index else None

                job_id = cell("job_id") or str(len(jobs) + 1)
                if mapping.job_id is not None and SLURM_STEP_ID.match(job_id):
                    steps += 1
                    continue
                arrival = _known(cell("arrival"))
                if not arrival:  # a task still waiting when the trace was cut, or one that ran before it began
                    without_arrival += 1
                    continue
                submit_s, dated = _arrival(arrival, where, mapping.arrival, mapping.seconds_per_unit)
                if arrivals_dated is None:
                    arrivals_dated = dated
                elif dated != arrivals_dated:
                    # Seconds from a trace's start and seconds since 1970 cannot be ordered together.
                    raise TraceError(
                        f"{where}, column {mapping.arrival!r}: "
                        f"{'a date' if dated else 'a number of seconds'} among arrival times given as "
                        f"{'dates' if arrivals_dated else 'seconds'}, got {cell('arrival')!r}"
                    )
                if mapping.duration is None and _known(cell("start")) and not _known(cell("end")):
                    still_running += 1  # its run time is not known: replaying a guess would invent one
                    continue
                duration = _run_time(cell, mapping, where)
                if not duration:
                    # No run time, or none at all: cancelled before it started (sacct's CANCELLED rows have their
                    # start equal to their end), nothing to replay; a zero-second job would only hold a place in
                    # the queue that it never held.
                    never_ran += 1
                    continue
                # An empty GPU cell is nothing allocated (sacct's AllocTRES of a job that never started).
                gpus = _gpu_count(gpus_text, where, mapping.gpus) if (gpus_text := _known(cell("gpus"))) else 0
                if gpus == 0:
                    without_gpus += 1
                    continue
                jobs.append(
                    TraceJob(
                        job_id=job_id,
                        line=line,
                        submit_s=submit_s,
                        duration_s=duration,
                        gpus=gpus,
                        user=cell("user") or None,
                        account=cell("account") or None,
                        qos=cell("qos") or None,
                        time_limit_s=(
                            _time_limit(cell("time_limit") or "", where, mapping.time_limit,
                                        mapping.seconds_per_unit)
                            if mapping.time_limit
                            else None
                        ),
                    )
                )
        except csv.Error as err:
            raise TraceError(f"{path}, line {reader.line_num}: unreadable CSV: {err}") from None
    if not jobs:
        left = TraceRead([], without_gpus, never_ran, steps, without_arrival, still_running).left_out_text()
        raise TraceError(f"{path}: the trace has no job with GPUs that ran{f' ({left})' if left else ''}")
    jobs.sort(key=lambda j: j.submit_s)  # stable: simultaneous arrivals keep file order
    return TraceRead(jobs, without_gpus, never_ran, steps, without_arrival, still_running)


def _trace_text(path: Path) -> str:
    """The trace file as text: UTF-8 (ASCII included), with or without a byte order mark (spreadsheets and
    Windows tools write one, and it would otherwise stick to the first column's name); anything else is
    refused naming the line of the first byte that is not UTF-8."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise TraceError(f"{path}: cannot read trace: {err.strerror or err}") from None
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):  # UTF-32's marks begin with these too
        raise TraceError(f"{path}: UTF-16 or UTF-32 text; a trace must be UTF-8 (convert it: iconv -t UTF-8)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        before = data[: err.start]
        line = len(before.splitlines()) + (not before or before.endswith((b"\n", b"\r")))
        raise TraceError(f"{path}, line {line}: not UTF-8 text (byte 0x{data[err.start]:02x}); a trace must be "
                         f"UTF-8 (convert it: iconv -t UTF-8)") from None


def _run_seconds(text: str, where: str, column: str, unit_s: float = 1.0) -> float:
    """A run time: a number of ``unit_s`` (seconds by default), or a Slurm duration as sacct prints Elapsed
    (``01:02:03``, ``1-00:00:00``)."""
    if _is_number(text) or text.lstrip().startswith("-"):
        return _number(text, where, column) * unit_s
    try:
        return float(parse_duration(text, where))
    except ConfigError:
        raise TraceError(
            f"{where}, column {column!r}: expected a number of seconds or a duration like 01:02:03, got {text!r}"
        ) from None


def _run_time(cell: Callable[[str], str | None], mapping: ColumnMapping, where: str) -> float | None:
    """A row's run time in seconds: its duration, or its end minus its start (both dates, or both seconds);
    None when the row has none (an empty cell: the job never ran)."""
    if mapping.duration is not None:
        text = _known(cell("duration"))
        return _run_seconds(text, where, mapping.duration, mapping.seconds_per_unit) if text else None
    assert mapping.start is not None and mapping.end is not None  # ColumnMapping.parse asks for both
    started, ended = _known(cell("start")), _known(cell("end"))
    if not started or not ended:
        return None
    start_s, start_dated = _arrival(started, where, mapping.start, mapping.seconds_per_unit)
    end_s, end_dated = _arrival(ended, where, mapping.end, mapping.seconds_per_unit)
    if start_dated != end_dated:
        raise TraceError(f"{where}, column {mapping.end!r}: the start and end must both be dates or both seconds, "
                         f"got {started!r} and {ended!r}")
    if end_s < start_s:
        raise TraceError(f"{where}, column {mapping.end!r}: the job ends ({ended!r}) before it starts ({started!r})")
    return end_s - start_s


def round_up_limit(seconds: float) -> int:
    """The smallest common limit (COMMON_LIMITS_H) at least ``seconds`` long; multiples of the last past it."""
    for hours in COMMON_LIMITS_H:
        if seconds <= hours * 3600:
            return hours * 3600
    step = COMMON_LIMITS_H[-1] * 3600
    return int(math.ceil(seconds / step)) * step


@dataclass(frozen=True, slots=True)
class CompletionModel:
    """How ``complete_jobs`` draws what a trace lacks.

    Users overestimate run times: the asked limit is the true duration times a log-normal factor (median
    ``overestimate_median``, spread ``overestimate_sigma``; never below 1, so no job outlives its limit
    unless a gang slowdown stretches it), rounded up to a common limit. Jobs without an account get one of
    ``accounts`` accounts with Zipf-skewed popularity (account k gets weight 1/(k+1)), because real
    clusters have a few heavy accounts and many light ones, and that is where fair share matters; a user's
    jobs all get the account drawn for the user's first.
    """

    seed: int = 0
    accounts: int = 4
    overestimate_median: float = 2.0
    overestimate_sigma: float = 0.8


def complete_jobs(jobs: Sequence[TraceJob], model: CompletionModel) -> list[TraceJob]:
    """The jobs with every missing account, user and time limit drawn (seeded, in trace order)."""
    if model.accounts < 1:
        raise TraceError("the number of accounts must be at least 1")
    # Separate streams: changing the number of accounts does not change anyone's time limit.
    account_rng = random.Random(f"gsim-accounts:{model.seed}")
    limit_rng = random.Random(f"gsim-limits:{model.seed}")
    names = [f"acct{k}" for k in range(model.accounts)]
    weights = [1.0 / (k + 1) for k in range(model.accounts)]
    mu = math.log(model.overestimate_median)
    out: list[TraceJob] = []
    accounts_of: dict[str, str] = {}  # a user's drawn account: one per user, as on a real cluster
    for job in jobs:
        account = job.account
        if account is None and job.user is not None:
            account = accounts_of.get(job.user)
            if account is None:
                account = accounts_of[job.user] = account_rng.choices(names, weights)[0]
        elif account is None:
            account = account_rng.choices(names, weights)[0]
        user = job.user or f"{account}-user"
        limit = job.time_limit_s
        if limit is None:
            factor = max(1.0, limit_rng.lognormvariate(mu, model.overestimate_sigma))
            limit = round_up_limit(max(job.duration_s * factor, 1.0))
        out.append(replace(job, account=account, user=user, time_limit_s=limit))
    return out
