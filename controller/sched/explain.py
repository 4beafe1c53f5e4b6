"""Why a job waits, or can never run, in words a user can act on: pure text from the core's typed records.

The core decides in types (feasibility.Verdict, the cycle's per-job WaitRecord); this module is the one
place that turns them into sentences, for submission errors, gjob and ``gqueue --explain``, and gsim.
"""

from __future__ import annotations

import enum
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from garrison.controller.sched.capacity import Capacity
from garrison.controller.sched.cycle_state import time_limit_of
from garrison.controller.sched.feasibility import IdleCluster, NodeTally
from garrison.controller.sched.framework import Request
from garrison.controller.sched.placement import Placer, request_for
from garrison.controller.sched.plan import Plan, Reason
from garrison.controller.sched.quota import QuotaBlock, QuotaTally
from garrison.controller.sched.quota import Reason as QuotaReason
from garrison.controller.sched.snapshot import PendingJob, Snapshot

if TYPE_CHECKING:
    from garrison.controller.sched.cycle import SchedulerConfig

# What each filter's rejection means for the user, and the option that caused it (the filters' own reasons
# say it from the node's side).
FILTER_WORDS = {
    "NodeReady": "down or drained",
    "PartitionMember": "not in the partition",
    "NodeNotExcluded": "excluded by -x/--exclude",
    "NodeFeatures": "without the -C/--constraint features",
    "NodeListed": "not in -w/--nodelist",
    "GpuCapacity": "with too few GPUs of the type and memory asked for",
    "CpuMemoryFit": "with too few CPUs or too little memory for the job's share",
}


def describe_request(request: Request) -> str:
    """'8 GPUs of type a100 on one node', '2 nodes with 4 GPUs each', '16 GPUs'."""
    shape = request.shape
    kind = f" of type {request.gpu_type}" if request.gpu_type else ""
    if request.gpu_mem_mib:
        kind += f" with {request.gpu_mem_mib} MiB each"
    if shape.total_gpus == 0:
        return f"{shape.node_count or 1} node(s) without GPUs"
    if shape.node_count == 1:
        return f"{shape.total_gpus} GPUs{kind} on one node"
    if shape.node_count is None:
        return f"{shape.total_gpus} GPUs{kind}"
    if shape.gpus_per_node is not None:
        return f"{shape.node_count} nodes with {shape.gpus_per_node} GPUs{kind} each"
    return f"{shape.total_gpus} GPUs{kind} on {shape.node_count} nodes"


def never_text(request: Request, tally: NodeTally, partition: str) -> str:
    """Why no registered node of the partition could ever run the request, e.g. "no node of partition
    'main' can run 16 GPUs on one node: of 4 nodes, 4 with too few GPUs ... (largest: 8)"."""
    what = describe_request(request)
    if tally.evaluated == 0:
        return f"partition {partition!r} has no node to run {what}"
    parts = [f"{n} {FILTER_WORDS.get(name, reason)}" for name, reason, n in tally.filtered if name != "NodeReady"]
    if tally.passing:
        parts.append(f"{tally.passing} too small together" if tally.passing > 1 else "1 too small")
    text = f"no node of partition {partition!r} can ever run {what}: of {tally.evaluated} node(s), {', '.join(parts)}"
    if request.shape.total_gpus:
        text += f" (largest: {tally.largest if tally.passing else tally.largest_any} GPUs)"
    return text


# -- why a pending job waits (gjob, gqueue --explain) -----------------------------------------------------


class WaitKind(enum.Enum):
    STARTING = "starting"  # the last cycle started it
    GATED = "gated"  # held, dependency, begin time, partition or QoS rule, array limit
    QUOTA = "quota"  # a quota or QoS limit
    NEVER = "never"  # no up node could ever run it
    PREEMPTING = "preempting"  # victims are being stopped for it
    RESERVED = "reserved"  # it has a reservation: it starts then
    BLOCKED = "blocked"  # resources busy, and no reservation of its own (this cycle)
    BEHIND = "behind"  # higher-priority jobs go first (not placed this cycle)


# What a gate's reason code means, in words a user can act on.
GATE_WORDS = {
    Reason.HELD: "held: release it with gcontrol release",
    Reason.DEPENDENCY: "waiting for its -d dependency (or, for -d singleton, its running namesake)",
    Reason.DEPENDENCY_NEVER_SATISFIED: "its -d dependency can never be satisfied: cancel it",
    Reason.BEGIN_TIME: "not before its --begin time",
    Reason.ARRAY_LIMIT: "its array's %limit of running tasks is reached",
    Reason.PARTITION_TIME_LIMIT: "its time limit exceeds its partition's maximum",
    Reason.PARTITION_INVALID: "its partition no longer exists",
    Reason.ACCOUNT_NOT_ALLOWED: "its partition no longer admits its account",
    Reason.QOS_NOT_ALLOWED: "its partition does not allow its QoS",
    Reason.QOS_TIME_LIMIT: "its time limit exceeds its QoS's maximum",
}


QUOTA_REASONS = frozenset({QuotaReason.QUOTA_GPUS, QuotaReason.QUOTA_JOBS, QuotaReason.QUOTA_GPU_HOURS,
                           QuotaReason.QOS_GPUS_PER_USER, QuotaReason.QOS_JOBS_PER_USER})


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why one pending job waits, from the last cycle's snapshot and plan (Nomad's AllocMetric for it)."""

    job_id: int
    kind: WaitKind
    reason: str  # the reason code gqueue shows
    position: int  # in queue order, 1 = next (0: not in that cycle)
    estimated_start: float | None
    tally: NodeTally  # nodes evaluated, and how many each filter ruled out at that moment
    lines: tuple[str, ...]  # the sentences gjob and gqueue --explain print
    quota: QuotaBlock | None = None
    reserved_for: int | None = None


def _clock(epoch: float, now: float) -> str:
    """'~14:20', or '~2026-12-03 14:20' when not today."""
    then, today = time.localtime(epoch), time.localtime(now)
    same_day = then.tm_yday == today.tm_yday and then.tm_year == today.tm_year
    return "~" + time.strftime("%H:%M" if same_day else "%Y-%m-%d %H:%M", then)


def explain_wait(snapshot: Snapshot, plan: Plan, config: SchedulerConfig, now: float, job_id: int, *,
                 positions: Mapping[int, int] | None = None,
                 pending: Mapping[int, PendingJob] | None = None) -> Explanation | None:
    """Why ``job_id`` waits, recomputed for that job alone on the cycle's own snapshot and plan: the same
    filters, on the nodes as the cycle left them for it (the starts and reservations of the jobs ahead).

    ``positions`` (each job's 1-based place in ``plan.order``) and ``pending`` (the snapshot's pending jobs by
    id), where the caller keeps them for the cycle, spare the passes over the whole queue that finding the job
    and its place otherwise take: gjob on one pending task among 50,000 (issue 23)."""
    from garrison.controller.sched.cycle import _pipeline

    if pending is not None:
        job = pending.get(job_id)
    else:
        job = next((j for j in snapshot.pending if j.job_id == job_id), None)
    if job is None:
        return None
    if positions is None:
        position = plan.order.index(job_id) + 1 if job_id in plan.order else 0
        ahead_ids = set(plan.order[: max(position - 1, 0)])

        def is_ahead(other: int) -> bool:
            return other in ahead_ids
    else:
        position = positions.get(job_id, 0)
        places = positions

        def is_ahead(other: int) -> bool:
            return 0 < places.get(other, 0) < position
    partition = snapshot.accounting.partition_map.get(job.partition)
    limit = time_limit_of(job, partition)
    request = request_for(job_id, job.spec, job.partition, limit)
    what = describe_request(request)
    estimated = plan.estimated_starts.get(job_id)
    placer = Placer(_pipeline(config.scorer_weights), config.score_limit)
    capacity = Capacity(snapshot.nodes)
    for start in plan.starts:
        if is_ahead(start.job_id):
            capacity.take(start.allocation)
    for reservation in plan.reservations:
        if is_ahead(reservation.job_id):
            capacity.reserve(reservation.allocation, reservation.start, reservation.job_id)
    tally = _tally_now(capacity, placer, request, now + limit)
    reason = plan.waiting.get(job_id, "")

    def done(kind: WaitKind, *lines: str, quota: QuotaBlock | None = None, reserved_for: int | None = None,
             tally: NodeTally = tally) -> Explanation:
        return Explanation(job_id, kind, reason, position, estimated, tally, lines, quota, reserved_for)

    if any(s.job_id == job_id for s in plan.starts):
        return done(WaitKind.STARTING, "started by the last scheduling cycle")
    if reason in GATE_WORDS:
        return done(WaitKind.GATED, GATE_WORDS[reason])
    if reason in QUOTA_REASONS:
        quotas = QuotaTally(snapshot.accounting, snapshot.running, snapshot.usage, now, snapshot.accounting.default_qos)
        jobs = pending if pending is not None else {j.job_id: j for j in snapshot.pending}
        for start in plan.starts:
            if is_ahead(start.job_id) and start.job_id in jobs:
                started = jobs[start.job_id]
                quotas.started(started, started.spec.total_gpus(), time_limit_of(started, partition))
        block = quotas.blocking_limit(job, job.spec.total_gpus(), limit)
        if block is not None:
            return done(WaitKind.QUOTA, f"{block.scope} {block.name} is at its {block.resource} quota "
                                        f"({_number(block.used)} of {_number(block.limit)})", quota=block)
    if reason in (Reason.NODES_UNAVAILABLE, Reason.NODES_DRAINED):
        verdict = IdleCluster(capacity.views, placer).verdict(request)
        if reason == Reason.NODES_DRAINED:
            return done(WaitKind.NEVER, f"{what}: only nodes that are drained now could run it; an admin must "
                                        "resume them (or cancel the job)", tally=verdict.tally)
        text = never_text(request, verdict.tally, job.partition)
        return done(WaitKind.NEVER, f"never (on the nodes that are up): {text}",
                    tally=verdict.tally)
    if reason == Reason.PREEMPTING:
        return done(WaitKind.PREEMPTING, f"{what}: lower-QoS jobs are being preempted to make room; it starts "
                                         "when they have stopped")
    capable = sum(n for name, _, n in tally.filtered if name == "GpuFree") + tally.passing
    busy = _busy_line(what, tally, capable, snapshot, estimated, now)
    holder = plan.blocked_by.get(job_id)
    if holder is not None:
        busy += f" (reserved for job {holder})"
    if any(r.job_id == job_id for r in plan.reservations):
        assert estimated is not None
        return done(WaitKind.RESERVED, busy, f"reserved: estimated start {_clock(estimated, now)}")
    lines = [busy]
    if position > 1 and reason != Reason.RESOURCES:
        behind = f"behind {position - 1} job(s) of higher priority"
        lines.append(behind + (f"; estimated start {_clock(estimated, now)}" if estimated is not None else ""))
        return done(WaitKind.BEHIND, *lines, reserved_for=holder)
    return done(WaitKind.BLOCKED, *lines, reserved_for=holder)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def _busy_line(what: str, tally: NodeTally, capable: int, snapshot: Snapshot, estimated: float | None,
               now: float) -> str:
    if capable == 0:
        return f"{what}: no node can hold it now ({_filtered_words(tally)})"
    text = f"{what}: {capable} node(s) could hold it, all busy"
    if estimated is not None and estimated > now:
        text += f" until {_clock(estimated, now)}"
    else:
        ends = [max(now, r.expected_end) for r in snapshot.running]
        if ends:
            text += f" (the next running job ends by {_clock(min(ends), now)})"
    return text


def _filtered_words(tally: NodeTally) -> str:
    return ", ".join(f"{n} {FILTER_WORDS.get(name, reason)}" for name, reason, n in tally.filtered) or "none in its partition"


def _tally_now(capacity: Capacity, placer: Placer, request: Request, end: float) -> NodeTally:
    """Every node of the request's partition through the filters as the cycle left them for it: the first
    filter that rules each node out (GpuFree, CpuMemoryFit "busy", NodeExclusive... for now; the others for
    good)."""
    counts: Counter[tuple[str, str]] = Counter()
    order = {f.name: i for i, f in enumerate(placer.pipeline.filters)}
    evaluated = passing = largest = 0
    for index, view in enumerate(capacity.views):
        if request.partition not in view.partitions:
            continue
        evaluated += 1
        candidate = capacity.candidate(request, index, end)
        for step in placer.pipeline.filters:
            status = step.check(request, candidate)
            if not status.ok:
                counts[(step.name, status.reason)] += 1
                break
        else:
            passing += 1
            largest = max(largest, len(candidate.usable))
    filtered = tuple((name, reason, n) for (name, reason), n in
                     sorted(counts.items(), key=lambda item: order.get(item[0][0], 99)))
    return NodeTally(evaluated=evaluated, filtered=filtered, passing=passing, largest=largest)
