"""Pure pieces of gacct: time arguments, and job records and usage as a table, CSV or JSON.

No I/O here (the clock and the time zone are arguments), so every view is testable as text.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Sequence
from datetime import datetime, timedelta, tzinfo
from typing import Any

from garrison.cli.render import format_duration
from garrison.cli.usage_format import attempt_usage_json, usage_cells

_UNITS = {
    "": 1, "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
    "w": 604800, "week": 604800, "weeks": 604800,
}
_RELATIVE = re.compile(r"^now\s*([+-])\s*(\d+)\s*([a-z]*)$")
TIME_FORMATS_HELP = (
    "YYYY-MM-DD[THH:MM[:SS]], now, today (or midnight), yesterday, or now-N[s|m|h|d|w] (e.g. now-7days)"
)


class TimeSpecError(ValueError):
    """A -S/-E value gacct cannot read; the message says what it accepts."""


def parse_time(text: str, now: datetime) -> float:
    """Epoch seconds for a -S/-E value, read in ``now``'s time zone (the user's local one in gacct)."""
    value = text.strip().lower()
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if value == "now":
        return now.timestamp()
    if value in ("today", "midnight"):
        return midnight.timestamp()
    if value == "yesterday":
        return (midnight - timedelta(days=1)).timestamp()
    relative = _RELATIVE.match(value)
    if relative:
        sign, count, unit = relative.groups()
        if unit not in _UNITS:
            raise TimeSpecError(f"unknown time unit {unit!r} in {text!r}: use s, m, h, d or w")
        seconds = int(count) * _UNITS[unit]
        return now.timestamp() + (seconds if sign == "+" else -seconds)
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        raise TimeSpecError(f"cannot read the time {text!r}: use {TIME_FORMATS_HELP}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=now.tzinfo)
    return parsed.timestamp()


def _local(value: float, zone: tzinfo | None) -> str:
    if not value:
        return "-"
    return datetime.fromtimestamp(value, zone).strftime("%Y-%m-%dT%H:%M:%S")


def _elapsed(start: float, end: float, now: float) -> float:
    if not start:
        return 0.0
    return max((end or now) - start, 0.0)


def _exit_code(message: Any) -> str:
    return str(message.exit_code) if message.HasField("exit_code") else "-"


def _nodes(allocation: Sequence[Any]) -> str:
    return ",".join(node.node for node in allocation) or "-"


def _host_list(allocation: Sequence[Any]) -> str:
    """The attempt's nodes as a Slurm host list (``node[1-4]``), as sacct's NodeList shows them."""
    from garrison.model.hostlist import compress_hostlist

    names = [node.node for node in allocation]
    return compress_hostlist(names) if names else "-"


def _gpu_hours(gpu_seconds: float) -> str:
    return f"{gpu_seconds / 3600:.2f}"


RECORD_COLUMNS = (
    "JOBID", "NAME", "USER", "ACCOUNT", "PARTITION", "STATE", "START", "END", "ELAPSED", "GPUS", "CPUS",
    "GPU-HOURS", "NODELIST", "EXITCODE", "MAXRSS", "TOTALCPU", "CPUEFF", "GPUUTIL", "GPUMEM",
)
# The table without -o stops at EXITCODE, as sacct's does; -o MaxRSS,TotalCPU,CPUEff,... shows the usage.
DEFAULT_COLUMN_COUNT = RECORD_COLUMNS.index("EXITCODE") + 1


def record_rows(jobs: Sequence[Any], now: float, zone: tzinfo | None, with_attempts: bool = True) -> list[tuple[str, ...]]:
    """One row per job and, below it, one per attempt (JOBID 12.0, 12.1 ...), like sacct's job steps."""
    rows: list[tuple[str, ...]] = []
    for job in jobs:
        last = job.attempts[-1] if job.attempts else None
        rows.append((
            job.display_id, job.name, job.user, job.account, job.partition, job.state,
            _local(job.start_time, zone), _local(job.end_time, zone),
            format_duration(_elapsed(job.start_time, job.end_time, now)),
            str(last.gpus if last is not None else job.requested_gpus),
            str(_cpus(last.allocation)) if last is not None else "-", _gpu_hours(job.gpu_seconds),
            _host_list(last.allocation) if last is not None else "-", _exit_code(job),
            *_usage_cells(last, now),
        ))
        if not with_attempts:
            continue
        for attempt in job.attempts:
            rows.append((
                f"{job.display_id}.{attempt.attempt}", "", "", "", "", attempt.state,
                _local(attempt.start_time, zone), _local(attempt.end_time, zone),
                format_duration(_elapsed(attempt.start_time, attempt.end_time, now)),
                str(attempt.gpus), str(_cpus(attempt.allocation)), _gpu_hours(attempt.gpu_seconds),
                _host_list(attempt.allocation), _exit_code(attempt), *_usage_cells(attempt, now),
            ))
    return rows


# The table without -o: sacct's habit of fixed widths, a longer value cut with '+', so that a row fits 160
# columns (with the widest times, 19 characters each). JOBID, the times and the numbers are never cut.
DEFAULT_WIDTHS = {"NAME": 10, "USER": 8, "ACCOUNT": 8, "PARTITION": 9, "NODELIST": 12, "STATE": 10}
DEFAULT_LAYOUT = tuple(
    (index, DEFAULT_WIDTHS.get(column)) for index, column in enumerate(RECORD_COLUMNS[:DEFAULT_COLUMN_COUNT])
)


# sacct's --format field names (and the table's own headers) -> the table column they choose.
FORMAT_FIELDS = {
    "jobid": "JOBID", "jobname": "NAME", "name": "NAME", "user": "USER", "account": "ACCOUNT",
    "partition": "PARTITION", "state": "STATE", "start": "START", "end": "END", "elapsed": "ELAPSED",
    "gpus": "GPUS", "allocgpus": "GPUS", "cpus": "CPUS", "alloccpus": "CPUS", "ncpus": "CPUS",
    "gpuhours": "GPU-HOURS", "gpu-hours": "GPU-HOURS", "nodelist": "NODELIST", "exitcode": "EXITCODE",
    "maxrss": "MAXRSS", "totalcpu": "TOTALCPU", "cpueff": "CPUEFF", "cpuefficiency": "CPUEFF",
    "gpuutil": "GPUUTIL", "gpumem": "GPUMEM",
}


class FormatError(ValueError):
    """A --format gacct cannot read; the message names the field."""


def format_columns(spec: str) -> list[tuple[int, int | None]]:
    """sacct's ``--format FIELD[%WIDTH],...``: each field's column in RECORD_COLUMNS, and its width."""
    chosen: list[tuple[int, int | None]] = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        name, percent, width = item.partition("%")
        column = FORMAT_FIELDS.get(name.strip().lower())
        if column is None:
            known = ", ".join(sorted({f for f in FORMAT_FIELDS if f.isalpha()}))
            raise FormatError(f"unknown field {name.strip()!r} (known: {known})")
        if percent and not (width.isascii() and width.isdigit() and 0 < int(width) <= 1000):
            raise FormatError(f"the width in {item!r} must be a number from 1 to 1000")
        chosen.append((RECORD_COLUMNS.index(column), int(width) if percent else None))
    if not chosen:
        raise FormatError("no fields given")
    return chosen


def select_columns(rows: Sequence[Sequence[str]], chosen: Sequence[tuple[int, int | None]]
                   ) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The headers and rows with only the chosen columns, in that order; a value longer than its width is
    cut and ends with ``+``, as sacct shows it."""
    def fit(text: str, width: int | None) -> str:
        if width is None or len(text) <= width:
            return text
        return text[: width - 1] + "+" if width > 1 else "+"

    headers = tuple(fit(RECORD_COLUMNS[index], width) for index, width in chosen)
    return headers, [tuple(fit(row[index], width) for index, width in chosen) for row in rows]


def _usage_cells(attempt: Any | None, now: float) -> tuple[str, ...]:
    """A job's line shows its last attempt's usage (the one that counts, as sacct's job line)."""
    if attempt is None:
        return usage_cells(None, 0.0, 0)
    elapsed = _elapsed(attempt.start_time, attempt.end_time, now)
    return usage_cells(attempt.usage if attempt.HasField("usage") else None, elapsed, _cpus(attempt.allocation))


def _usage_json(attempt: Any | None, now: float) -> dict[str, Any] | None:
    if attempt is None or not attempt.HasField("usage"):
        return None
    return attempt_usage_json(attempt.usage, _elapsed(attempt.start_time, attempt.end_time, now), _cpus(attempt.allocation))


def _cpus(allocation: Sequence[Any]) -> int:
    """CPUs the attempt held on all its nodes (sacct's AllocCPUS); 0 when it asked for none."""
    return sum(len(n.cpus) for n in allocation)


def _attempt_json(attempt: Any, now: float) -> dict[str, Any]:
    return {
        "attempt": attempt.attempt,
        "state": attempt.state,
        "start_time": attempt.start_time or None,
        "end_time": attempt.end_time or None,
        "elapsed_s": round(_elapsed(attempt.start_time, attempt.end_time, now), 3),
        "exit_code": attempt.exit_code if attempt.HasField("exit_code") else None,
        "reason": attempt.reason,
        "gpus": attempt.gpus,
        "cpus": _cpus(attempt.allocation),
        "gpu_hours": round(attempt.gpu_seconds / 3600, 6),
        "allocation": [{"node": n.node, "gpus": list(n.gpus), "cpus": list(n.cpus), "mem_mb": n.mem_mb}
                       for n in attempt.allocation],
        "usage": _usage_json(attempt, now),
    }


def record_json(job: Any, now: float) -> dict[str, Any]:
    return {
        "job_id": job.display_id,
        "name": job.name,
        "user": job.user,
        "uid": job.uid,
        "account": job.account,
        "partition": job.partition,
        "state": job.state,
        "reason": job.reason,
        "submit_time": job.submit_time,
        "start_time": job.start_time or None,
        "end_time": job.end_time or None,
        "elapsed_s": round(_elapsed(job.start_time, job.end_time, now), 3),
        "time_limit_s": job.time_limit_s,
        "exit_code": job.exit_code if job.HasField("exit_code") else None,
        "requested_gpus": job.requested_gpus,
        "restart_count": job.restart_count,
        "gpu_hours": round(job.gpu_seconds / 3600, 6),
        "usage": _usage_json(job.attempts[-1] if job.attempts else None, now),
        "attempts": [_attempt_json(a, now) for a in job.attempts],
    }


def records_json(jobs: Sequence[Any], now: float) -> str:
    return json.dumps({"jobs": [record_json(job, now) for job in jobs]}, indent=2)


CSV_FIELDS = (
    "job_id", "attempt", "name", "user", "account", "partition", "state", "submit_time", "start_time", "end_time",
    "elapsed_s", "gpus", "gpu_hours", "nodes", "exit_code", "reason", "cpus",
    "max_rss_bytes", "total_cpu_s", "cpu_efficiency_pct", "gpu_utilization_pct", "gpu_memory_bytes",
)
USAGE_CSV_KEYS = CSV_FIELDS[CSV_FIELDS.index("max_rss_bytes"):]


def _usage_csv(attempt: Any | None, now: float) -> list[Any]:
    found = _usage_json(attempt, now) or {}
    return ["" if found.get(key) is None else found[key] for key in USAGE_CSV_KEYS]


def _iso(value: float, zone: tzinfo | None) -> str:
    return datetime.fromtimestamp(value, zone).isoformat(timespec="seconds") if value else ""


def records_csv(jobs: Sequence[Any], now: float, zone: tzinfo | None, with_attempts: bool = True) -> str:
    """A header and one line per job and per attempt (the attempt column is empty on job lines); times in
    ISO 8601 with their UTC offset, so a spreadsheet and a script read the same instant."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    for job in jobs:
        last = job.attempts[-1] if job.attempts else None
        writer.writerow([
            job.display_id, "", job.name, job.user, job.account, job.partition, job.state,
            _iso(job.submit_time, zone), _iso(job.start_time, zone), _iso(job.end_time, zone),
            f"{_elapsed(job.start_time, job.end_time, now):.3f}",
            last.gpus if last is not None else job.requested_gpus, f"{job.gpu_seconds / 3600:.6f}",
            _nodes(last.allocation) if last is not None else "",
            job.exit_code if job.HasField("exit_code") else "", job.reason,
            _cpus(last.allocation) if last is not None else "", *_usage_csv(last, now),
        ])
        if not with_attempts:
            continue
        for attempt in job.attempts:
            writer.writerow([
                job.display_id, attempt.attempt, "", job.user, job.account, job.partition, attempt.state,
                "", _iso(attempt.start_time, zone), _iso(attempt.end_time, zone),
                f"{_elapsed(attempt.start_time, attempt.end_time, now):.3f}", attempt.gpus,
                f"{attempt.gpu_seconds / 3600:.6f}", _nodes(attempt.allocation),
                attempt.exit_code if attempt.HasField("exit_code") else "", attempt.reason,
                _cpus(attempt.allocation), *_usage_csv(attempt, now),
            ])
    return out.getvalue()


USAGE_COLUMNS = ("ACCOUNT", "USER", "GPU-HOURS", "JOBS", "ATTEMPTS")


def usage_rows(rows: Sequence[Any]) -> list[tuple[str, ...]]:
    """Each (account, user), then a total per account and one for the whole period."""
    table: list[tuple[str, ...]] = []
    by_account: dict[str, list[Any]] = {}
    for row in rows:
        by_account.setdefault(row.account, []).append(row)
    for account, members in by_account.items():
        for row in members:
            table.append((account, row.user, _gpu_hours(row.gpu_seconds), str(row.jobs), str(row.attempts)))
        if len(members) > 1:
            table.append((account, "(total)", _gpu_hours(sum(r.gpu_seconds for r in members)),
                          str(sum(r.jobs for r in members)), str(sum(r.attempts for r in members))))
    if len(by_account) > 1 or not rows:
        table.append(("(all)", "", _gpu_hours(sum(r.gpu_seconds for r in rows)), str(sum(r.jobs for r in rows)),
                      str(sum(r.attempts for r in rows))))
    return table


def usage_json(response: Any) -> str:
    return json.dumps(
        {
            "start_time": response.start_time,
            "end_time": response.end_time,
            "usage": [
                {"account": r.account, "user": r.user, "gpu_hours": round(r.gpu_seconds / 3600, 6),
                 "gpu_seconds": round(r.gpu_seconds, 3), "jobs": r.jobs, "attempts": r.attempts}
                for r in response.rows
            ],
        },
        indent=2,
    )


def usage_csv(response: Any) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(("account", "user", "gpu_hours", "jobs", "attempts"))
    for r in response.rows:
        writer.writerow((r.account, r.user, f"{r.gpu_seconds / 3600:.6f}", r.jobs, r.attempts))
    return out.getvalue()


def usage_header(response: Any, zone: tzinfo | None) -> str:
    return f"GPU usage from {_local(response.start_time, zone)} to {_local(response.end_time, zone)}"
