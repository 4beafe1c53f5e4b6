"""Rendering replay figures: a table (metrics down, policies across), JSON, and PNG plots."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from garrison.controller.sim.metrics import ReplayResult

Summary = Mapping[str, float | int | str]

# (key, label, kind): kind says how to format the value.
TABLE_ROWS: tuple[tuple[str, str, str], ...] = (
    ("jobs", "jobs", "int"),
    ("unfinished", "never finished", "int"),
    ("avg_jct_s", "avg JCT", "duration"),
    ("p50_jct_s", "p50 JCT", "duration"),
    ("p95_jct_s", "p95 JCT", "duration"),
    ("p99_jct_s", "p99 JCT", "duration"),
    ("avg_wait_s", "avg wait", "duration"),
    ("p50_wait_s", "p50 wait", "duration"),
    ("p95_wait_s", "p95 wait", "duration"),
    ("p99_wait_s", "p99 wait", "duration"),
    ("max_wait_s", "max wait", "duration"),
    ("makespan_s", "makespan", "duration"),
    ("utilization", "GPU utilisation", "percent"),
    ("idle_gpu_hours_waiting", "idle GPU-hours, jobs waiting", "float"),
    ("idle_gpu_hours_fitting", "  ... one of them would fit", "float"),
    ("jain_fairness", "Jain fairness (accounts)", "ratio"),
    ("preemptions", "preemptions", "int"),
    ("gpu_hours_lost", "GPU-hours lost", "float"),
    ("timeouts", "timeouts", "int"),
    ("estimate_submit_p50_error_s", "est. start error at submit, p50", "duration"),
    ("estimate_submit_p90_error_s", "  ... p90", "duration"),
    ("estimate_submit_coverage", "  ... jobs with an estimate", "percent"),
    ("estimate_hour_p50_error_s", "est. start error 1 h before, p50", "duration"),
    ("estimate_hour_p90_error_s", "  ... p90", "duration"),
    ("estimate_hour_coverage", "  ... jobs with an estimate", "percent"),
    ("cycles", "scheduling cycles", "int"),
    ("rejected_starts", "starts refused by the re-check", "int"),
    ("wall_s", "replay wall time", "wall"),
)


def format_duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.2f} h"
    return f"{seconds / 86400:.2f} d"


def format_value(value: float | int | str, kind: str) -> str:
    if isinstance(value, str):
        return value
    if kind == "int":
        return str(int(value))
    if kind == "duration":
        return format_duration(float(value))
    if kind == "percent":
        return f"{100 * float(value):.1f}%"
    if kind == "ratio":
        return f"{float(value):.3f}"
    if kind == "wall":
        return f"{float(value):.2f} s"
    return f"{float(value):.1f}"


def table_rows(summaries: Sequence[Summary]) -> list[tuple[str, ...]]:
    return [
        (label, *(format_value(s[key], kind) for s in summaries))
        for key, label, kind in TABLE_ROWS
        if all(key in s for s in summaries)
    ]


def rich_table(summaries: Sequence[Summary], title: str = "") -> Any:
    from rich.table import Table

    table = Table(title=title or None, title_justify="left")
    table.add_column("metric")
    for summary in summaries:
        table.add_column(str(summary["policy"]), justify="right")
    for row in table_rows(summaries):
        table.add_row(*row)
    return table


def plain_table(summaries: Sequence[Summary]) -> str:
    headers = ("metric", *(str(s["policy"]) for s in summaries))
    rows = [headers, *table_rows(summaries)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(headers))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [cell.rjust(widths[i + 1]) for i, cell in enumerate(row[1:])]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def to_json(summaries: Sequence[Summary], context: Mapping[str, Any]) -> str:
    return json.dumps({**context, "policies": [dict(s) for s in summaries]}, indent=2)


def write_jobs_csv(results: Sequence[ReplayResult], path: Path) -> None:
    """One row per job and policy: when it was submitted, first started and ended (virtual seconds)."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["policy", "job_id", "trace_job_id", "account", "gpus", "submit_s", "start_s", "end_s",
                         "wait_s", "jct_s", "preemptions", "timed_out"])
        for result in results:
            for job in result.jobs:
                writer.writerow([
                    result.policy, job.job_id, job.trace_id, job.account, job.gpus, job.submit,
                    "" if job.first_start is None else job.first_start, "" if job.end is None else job.end,
                    "" if job.wait is None else job.wait, "" if job.jct is None else job.jct,
                    job.preemptions, int(job.timed_out),
                ])


def step_average(times: Sequence[float], values: Sequence[int], bins: int) -> tuple[list[float], list[float]]:
    """Time-weighted averages of a step function over ``bins`` equal intervals (plots stay readable)."""
    start, stop = (times[0], times[-1]) if times else (0.0, 0.0)
    if len(times) < 2 or stop <= start:
        return list(times), [float(v) for v in values]
    width = (stop - start) / bins
    sums = [0.0] * bins
    for i in range(len(times) - 1):
        left, right, value = times[i], times[i + 1], values[i]
        index = min(int((left - start) / width), bins - 1)
        while left < right:
            bin_end = start + (index + 1) * width if index < bins - 1 else stop
            if bin_end <= left and index < bins - 1:  # float rounding put left at the end of this bin
                index += 1
                continue
            edge = min(right, bin_end) if index < bins - 1 else right
            sums[index] += value * (edge - left)
            left = edge
            index += 1
    centres = [start + (i + 0.5) * width for i in range(bins)]
    return centres, [s / width for s in sums]


def write_plots(results: Sequence[ReplayResult], out_dir: Path, bins: int = 400) -> list[Path]:
    """queue_length.png, utilization.png and jct_cdf.png in ``out_dir``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def save(fig: Any, name: str) -> None:
        path = out_dir / name
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    origin = min((r.times[0] for r in results if r.times), default=0.0)

    fig, ax = plt.subplots(figsize=(9, 4))
    for result in results:
        x, y = step_average(result.times, result.queue_length, bins)
        ax.plot([(t - origin) / 86400 for t in x], y, label=result.policy, linewidth=1)
    ax.set_xlabel("time (days)")
    ax.set_ylabel("pending jobs")
    ax.set_title("Queue length")
    ax.legend()
    save(fig, "queue_length.png")

    fig, ax = plt.subplots(figsize=(9, 4))
    for result in results:
        x, y = step_average(result.times, result.busy_gpus, bins)
        ax.plot([(t - origin) / 86400 for t in x], [100 * v / result.total_gpus for v in y],
                label=result.policy, linewidth=1)
    ax.set_xlabel("time (days)")
    ax.set_ylabel("GPUs busy (%)")
    ax.set_ylim(0, 105)
    ax.set_title("GPU utilisation")
    ax.legend()
    save(fig, "utilization.png")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for result in results:
        jcts = sorted(j.jct / 3600 for j in result.jobs if j.jct is not None)
        if jcts:
            ax.step(jcts, [(i + 1) / len(jcts) for i in range(len(jcts))], where="post", label=result.policy)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT CDF")
    ax.legend()
    save(fig, "jct_cdf.png")
    return written
