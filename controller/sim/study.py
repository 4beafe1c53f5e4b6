"""One study: a trace, a cluster, and the policies to compare, replayed one after the other.

Everything that could fail on bad input (the trace, the cluster, the column mapping, the policies, the
configuration) is read and checked before the first replay, so a study either runs whole or not at all.
The jobs are completed (accounts, time limits) once, so every policy replays identical jobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from garrison.controller.sim.cluster import SimCluster, parse_cluster
from garrison.controller.sim.metrics import ReplayResult
from garrison.controller.sim.policies import POLICY_NAMES, Policy, default_partition, load_policy
from garrison.controller.sim.replay import ReplayOptions, check_fits, replay
from garrison.controller.sim.trace import (
    ELASTICFLOW,
    TIME_UNITS,
    ColumnMapping,
    CompletionModel,
    TraceError,
    TraceJob,
    complete_jobs,
    read_trace_counted,
)


@dataclass(frozen=True)
class Study:
    trace_path: Path
    cluster: SimCluster
    jobs: tuple[TraceJob, ...]
    policies: tuple[Policy, ...]
    options: ReplayOptions
    left_out: str = ""  # the trace's rows not replayed, and why (TraceRead.left_out_text)

    def run(self) -> list[ReplayResult]:
        return [replay(self.cluster, self.jobs, policy, self.options) for policy in self.policies]


def policy_names(requested: Sequence[str]) -> list[str]:
    """``all`` expands to every policy; duplicates are dropped, order kept."""
    names: list[str] = []
    for item in requested:
        for name in (POLICY_NAMES if item == "all" else (item,)):
            if name not in names:
                names.append(name)
    return names


def prepare(
    trace_path: str | Path,
    cluster_spec: str,
    policies: Sequence[str] = ("all",),
    *,
    config_file: str | Path | None = None,
    columns: str | None = None,
    model: CompletionModel | None = None,
    options: ReplayOptions | None = None,
    preemption: bool = False,
    header: Sequence[str] | None = None,
    time_unit: str = "s",
) -> Study:
    """Read and check everything a study needs; raises TraceError, ClusterError or PolicyError. ``time_unit``:
    the unit of the trace's plain numbers of time (TIME_UNITS)."""
    mapping = ColumnMapping.parse(columns) if columns else None
    if header is not None and mapping is None:
        raise TraceError("--header needs --columns: which of the named columns holds what")
    if time_unit not in TIME_UNITS:
        raise TraceError(f"--time-unit {time_unit!r}: use one of {', '.join(TIME_UNITS)}")
    if time_unit != "s":
        mapping = replace(mapping or ELASTICFLOW, seconds_per_unit=TIME_UNITS[time_unit])
    read = read_trace_counted(trace_path, mapping, header)
    traced = read.jobs
    cluster = parse_cluster(cluster_spec)
    config_path = Path(config_file) if config_file is not None else None
    loaded = tuple(load_policy(name, config_path, preemption=preemption) for name in policy_names(policies))
    _check_qos(traced, loaded[0], str(trace_path))
    jobs = complete_jobs(traced, model or CompletionModel())
    jobs = fit_time_limits(jobs, traced, default_partition(loaded[0]).max_time_s, str(trace_path))
    check_fits(cluster, jobs, str(trace_path), loaded[0])
    return Study(Path(trace_path), cluster, tuple(jobs), loaded, options or ReplayOptions(), read.left_out_text())


def _check_qos(jobs: Sequence[TraceJob], policy: Policy, source: str) -> None:
    """A QoS the accounting does not know is refused, as the daemon refuses it at submission (a trace's own
    classes, such as Alibaba's LS and BE, are not this cluster's QoS: map them in the --config's QoS table)."""
    known = policy.accounting.qos_map
    for job in jobs:
        if job.qos is not None and job.qos not in known:
            names = ", ".join(sorted(known)) or "none"
            raise TraceError(f"{source}, line {job.line}: unknown QoS {job.qos!r} (known: {names}; define it in "
                             f"--config's QoS table)")


def fit_time_limits(
    jobs: Sequence[TraceJob], traced: Sequence[TraceJob], max_time_s: int, source: str
) -> list[TraceJob]:
    """Hold time limits to the partition's maximum, as the daemon does at submission: a limit the trace
    gives above it is refused (the daemon would refuse the job), a drawn one is lowered to it (a user
    asks for no more than the maximum; a job longer than that is stopped at its limit, a TIMEOUT)."""
    out = []
    for job, original in zip(jobs, traced, strict=True):
        limit = job.time_limit_s
        if limit is not None and limit > max_time_s:
            if original.time_limit_s is not None:
                raise TraceError(
                    f"{source}, line {job.line}: time limit {limit}s of job {job.job_id} exceeds the partition "
                    f"maximum of {max_time_s}s"
                )
            job = replace(job, time_limit_s=max_time_s)
        out.append(job)
    return out
