"""The discrete-event replay: a virtual cluster, a virtual clock, and the production scheduler.

Events are job arrivals and job ends. At each event time the replay applies the events (ends first, so
their GPUs are free for the jobs that arrive at the same moment), builds a snapshot of the virtual cluster,
calls the scheduling core, and applies the plan exactly as the controller does: through the same attempt
ledger and its ``apply(plan, now)`` (controller/ledger.py), which accepts a start only if the job is still
pending and all its GPUs are still free, and a preemption only if its attempt is still running and not
being stopped already. The ledger is also the replay's record of which GPUs each running attempt holds.

Time between events is skipped: nothing changes then. A cycle is also skipped when it could not start
anything whatever the policy: no job pending, or no GPU free (with preemption off). Every other event
runs one cycle, as the daemon's scheduler does when it is woken by a submission or a finished job.

Jobs run for their true duration, which the scheduler never sees; only their time limit is in the spec.
A job still running at its time limit is stopped there (TIMEOUT), as the controller's timer would; that
only happens when a gang slowdown stretches a job past its limit, or a trace gives a limit below the
duration.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from garrison.controller.clock import ManualClock
from garrison.controller.ledger import AttemptLedger
from garrison.controller.sched.cycle import schedule
from garrison.controller.sched.priority import PriorityContext
from garrison.controller.sim.cluster import SimCluster
from garrison.controller.sim.metrics import ESTIMATE_LEAD_S, ContentionTracker, JobOutcome, ReplayResult
from garrison.controller.sim.policies import Policy, SnapshotBuilder, never_runs
from garrison.controller.sim.trace import TraceError, TraceJob
from garrison.model.domain import Allocation, Node


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    """Knobs applied to every policy alike.

    gang_slowdown: a gang spread over more nodes than it needs runs (1 + gang_slowdown) times longer, and
        again (1 + gang_slowdown) times longer if it also spans more switches than it needs; 0 disables.
    checkpoint_interval_s, restart_cost_s: what a preemption costs (preemption itself is a policy setting,
        see policies.load_policy). A preempted job loses the work since its last checkpoint (every
        checkpoint_interval_s of progress; 0: it checkpoints when warned) and pays restart_cost_s when it
        restarts.
    priority_interval_s: None keeps each policy's own SchedulerConfig.priority_interval_s (0 in gsim's
        presets: every cycle prices the whole queue as of its moment); a number sets it for every policy, as
        the daemon runs (30 s): a cycle then prices its queue as of the last plan's priorities until they are
        that old, and only the jobs that changed since. Faster on deep queues, closer to the daemon, and not
        the same plans.
    """

    gang_slowdown: float = 0.0
    checkpoint_interval_s: float = 3600.0
    restart_cost_s: float = 300.0
    priority_interval_s: float | None = None


@dataclass(slots=True)
class _Job:
    job_id: int
    trace: TraceJob
    account: str
    remaining_s: float  # true work still to do (grows by the restart cost after a preemption)
    first_start: float | None = None
    end: float | None = None
    attempt: int = 0
    allocation: Allocation | None = None
    run_start: float = 0.0
    slowdown: float = 1.0
    preemptions: int = 0
    timed_out: bool = False
    stopping: bool = False  # being preempted: warned, GPUs held until the grace period ends
    estimate_at_submit: float | None = None  # the first cycle's estimated start after its submission
    estimates: list[tuple[float, float]] | None = None  # (cycle time, estimate) whenever the estimate changed
    service: tuple[tuple[float, float, int], ...] = ()  # (start, end, GPUs) of its preempted attempts


_END = 0
_PREEMPTED = 1


class Replay:
    """One policy's replay of one job list on one cluster. ``run`` may be called once."""

    def __init__(
        self, cluster: SimCluster, jobs: Sequence[TraceJob], policy: Policy, options: ReplayOptions | None = None
    ) -> None:
        self.cluster = cluster
        # SimCluster derives these from its nodes on every call: read once, they are asked at every event.
        self.total_gpus = cluster.total_gpus
        self.max_gpus_per_node = cluster.max_gpus_per_node
        self.nodes_per_switch = cluster.nodes_per_switch
        self.held_gpus = 0  # GPUs the attempts hold, kept as they start and end (the ledger would count them)
        self.policy = policy
        self.options = options or ReplayOptions()
        self.config = policy.config
        if self.options.priority_interval_s is not None:
            self.config = replace(policy.config, priority_interval_s=self.options.priority_interval_s)
        self.pricing: PriorityContext | None = None  # the last plan's (Plan.pricing), for the next snapshot
        # Scheduler job ids follow arrival order, as the controller's ids follow submission order.
        in_order = sorted(jobs, key=lambda t: t.submit_s)
        default_account = policy.accounting.default_account
        self.jobs = [
            _Job(job_id=i + 1, trace=t, account=t.account or default_account, remaining_s=t.duration_s)
            for i, t in enumerate(in_order)
        ]
        self.clock = ManualClock(in_order[0].submit_s if in_order else 0.0)
        self.builder = SnapshotBuilder(cluster, policy, self.clock.now())
        # The controller's own bookkeeping of attempts and GPUs: every simulated node is up, its agent
        # connected; ledger.queued is the replay's queue (job id -> the number of its next attempt).
        self.ledger = AttemptLedger()
        for node in cluster.nodes:
            self.ledger.nodes[node.name] = Node(name=node.name, inventory=node.inventory)
            self.ledger.connected.add(node.name)
        self.switch_of = {n.name: n.switch for n in cluster.nodes}
        self.pending_sizes: Counter[int] = Counter()  # GPUs asked for -> pending jobs asking for that many
        self.running: dict[int, _Job] = {}
        self.events: list[tuple[float, int, int, int, int]] = []  # (time, kind, seq, job id, attempt)
        self._seq = 0
        self.tracker = ContentionTracker(self.total_gpus)
        self.start_order: list[int] = []
        self.preemptions = 0
        self.lost_gpu_s = 0.0
        self.busy_gpu_s = 0.0
        self.idle_waiting_gpu_s = 0.0  # free GPUs while some job waited
        self.idle_fitting_gpu_s = 0.0  # ... and some waiting job asked for no more GPUs than were free
        self.cycles = 0
        self.rejected_starts = 0
        self.times: list[float] = []
        self.queue_length: list[int] = []
        self.busy_gpus: list[int] = []
        self.unestimated: list[_Job] = []  # arrived since the last cycle: their first estimate is the next one

    # ---------------------------------------------------------------------------------------------

    def run(self) -> ReplayResult:
        wall_start = time.perf_counter()
        arrivals = self.jobs
        next_arrival = 0
        last = self.clock.now()
        while next_arrival < len(arrivals) or self.events:
            upcoming = [arrivals[next_arrival].trace.submit_s] if next_arrival < len(arrivals) else []
            if self.events:
                upcoming.append(self.events[0][0])
            now = min(upcoming)
            free_count = self.free_count
            self.busy_gpu_s += (self.total_gpus - free_count) * (now - last)
            if self.ledger.queued and free_count:
                idle = free_count * (now - last)
                self.idle_waiting_gpu_s += idle
                if min(self.pending_sizes) <= free_count:
                    self.idle_fitting_gpu_s += idle
            self.tracker.advance(now)
            self.clock.advance(now - self.clock.now())
            self.builder.charge(now)  # usage of what ran until now, before anything ends or starts
            last = now
            while self.events and self.events[0][0] <= now:
                _, kind, _, job_id, attempt = heapq.heappop(self.events)
                if kind == _END:
                    self._end(self.jobs[job_id - 1], attempt, now)
                else:
                    self._preempted(self.jobs[job_id - 1], attempt, now)
            while next_arrival < len(arrivals) and arrivals[next_arrival].trace.submit_s <= now:
                self._arrive(arrivals[next_arrival], now)
                next_arrival += 1
            self._cycle(now)
            self._record(now)
        # Jobs still pending here would wait forever: the policy never started them ("unfinished").
        return ReplayResult(
            policy=self.policy.name,
            total_gpus=self.total_gpus,
            jobs=[
                JobOutcome(
                    job_id=j.job_id,
                    trace_id=j.trace.job_id,
                    account=j.account,
                    gpus=j.trace.gpus,
                    submit=j.trace.submit_s,
                    first_start=j.first_start,
                    end=j.end,
                    preemptions=j.preemptions,
                    timed_out=j.timed_out,
                    estimate_at_submit=j.estimate_at_submit,
                    estimate_hour_before=_estimate_before(j, ESTIMATE_LEAD_S),
                )
                for j in self.jobs
            ],
            start_order=self.start_order,
            times=self.times,
            queue_length=self.queue_length,
            busy_gpus=self.busy_gpus,
            busy_gpu_s=self.busy_gpu_s,
            idle_waiting_gpu_s=self.idle_waiting_gpu_s,
            idle_fitting_gpu_s=self.idle_fitting_gpu_s,
            fairness=self.tracker.fairness(),
            account_share_ratios=self.tracker.share_ratios(),
            preemptions=self.preemptions,
            gpu_hours_lost=self.lost_gpu_s / 3600.0,
            cycles=self.cycles,
            rejected_starts=self.rejected_starts,
            wall_s=time.perf_counter() - wall_start,
        )

    # ---------------------------------------------------------------------------------------------

    @property
    def free_count(self) -> int:
        """GPUs no attempt holds, cluster-wide."""
        return self.total_gpus - self.held_gpus

    def _record(self, now: float) -> None:
        busy = self.held_gpus
        if self.times and self.times[-1] == now:
            self.queue_length[-1] = len(self.ledger.queued)
            self.busy_gpus[-1] = busy
            return
        self.times.append(now)
        self.queue_length.append(len(self.ledger.queued))
        self.busy_gpus.append(busy)

    def _add_pending(self, job: _Job) -> None:
        self.ledger.queued[job.job_id] = job.attempt
        self.pending_sizes[job.trace.gpus] += 1

    def _arrive(self, job: _Job, now: float) -> None:
        self._add_pending(job)
        if job.attempt == 0:
            self.unestimated.append(job)
        self.builder.job_arrived(job.job_id, job.trace, job.trace.submit_s)
        self.tracker.change(job.account, demand=job.trace.gpus, waiting=1)

    def _cycle(self, now: float) -> None:
        preempting = self.config.preemption
        # A cycle with no GPU free (and no preemption) starts nothing whatever the policy, and is skipped,
        # unless a job just arrived: the daemon's cycle on its submission gives its first estimated start.
        if not self.ledger.queued or (self.free_count == 0 and not preempting and not self.unestimated):
            return
        if preempting:
            self._report_checkpoints(now)
        snapshot = self.builder.build()
        if self.config.priority_interval_s:
            snapshot = replace(snapshot, pricing=self.pricing)  # as the daemon's policy.snapshot() does
        plan = schedule(snapshot, now, self.config)
        self.pricing = plan.pricing
        self.cycles += 1
        self._record_estimates(plan.estimated_starts)
        # As the engine applies a plan: the ledger accepts what holds, starts first, then preemptions. The
        # simulator's snapshot is never stale, so a rejected start means the plan itself was inconsistent.
        result = self.ledger.apply(plan, now)
        self.rejected_starts += sum(1 for r in result.rejected if r.victim is None)
        for start in result.started:
            self._start(start.job_id, start.allocation, now)
        for victim in result.preempting:
            self._begin_preemption(self.jobs[victim.job_id - 1], now, float(victim.grace_s))

    def _record_estimates(self, estimated: dict[int, float]) -> None:
        """What gqueue --start would show now: each job's estimated start, kept where it changed (for the
        accuracy report), and the first one after each arrival."""
        now = self.clock.now()
        for job in self.unestimated:
            job.estimate_at_submit = estimated.get(job.job_id)
        self.unestimated.clear()
        for job_id, estimate in estimated.items():
            job = self.jobs[job_id - 1]
            if job.first_start is not None:
                continue
            if job.estimates is None:
                job.estimates = []
            if not job.estimates or job.estimates[-1][1] != estimate:
                job.estimates.append((now, estimate))

    def _slowdown(self, job: _Job, allocation: Allocation) -> float:
        factor = self.options.gang_slowdown
        if factor <= 0:
            return 1.0
        nodes_needed = math.ceil(job.trace.gpus / self.max_gpus_per_node)
        switches_needed = math.ceil(nodes_needed / self.nodes_per_switch)
        slowdown = 1.0
        if len(allocation.nodes) > nodes_needed:
            slowdown *= 1.0 + factor
        if len({self.switch_of[n.node] for n in allocation.nodes}) > switches_needed:
            slowdown *= 1.0 + factor
        return slowdown

    def _start(self, job_id: int, allocation: Allocation, now: float) -> None:
        """The ledger accepted this start (its GPUs are now the attempt's): run the job."""
        job = self.jobs[job_id - 1]
        for node_alloc in allocation.nodes:
            self.builder.set_free(node_alloc.node, self.ledger.free_gpus(self.ledger.nodes[node_alloc.node]))
        gpus = allocation.gpu_count()
        self.held_gpus += gpus
        self.pending_sizes[job.trace.gpus] -= 1
        if not self.pending_sizes[job.trace.gpus]:
            del self.pending_sizes[job.trace.gpus]  # min(pending_sizes) is the smallest waiting job
        self.running[job_id] = job
        self.builder.job_started(job_id, job.attempt, allocation, now)
        self.tracker.change(job.account, held=gpus, waiting=-1)
        if job.first_start is None:
            job.first_start = now
            self.start_order.append(job_id)
        job.allocation = allocation
        job.run_start = now
        job.slowdown = self._slowdown(job, allocation)
        run_time = job.remaining_s * job.slowdown
        limit = job.trace.time_limit_s
        if limit is not None and run_time > limit:
            run_time = float(limit)
            job.timed_out = True
        self._seq += 1
        heapq.heappush(self.events, (now + run_time, _END, self._seq, job_id, job.attempt))

    def _release(self, job: _Job) -> None:
        """Every rank of the job's attempt has ended: the ledger frees its GPUs and forgets it."""
        assert job.allocation is not None
        live = self.ledger.live[(job.job_id, job.attempt)]
        self.held_gpus -= job.allocation.gpu_count()
        for node_alloc in job.allocation.nodes:
            self.ledger.release_node(live, node_alloc.node)
            self.builder.set_free(node_alloc.node, self.ledger.free_gpus(self.ledger.nodes[node_alloc.node]))
        self.ledger.close(live)
        del self.running[job.job_id]
        job.allocation = None

    def _end(self, job: _Job, attempt: int, now: float) -> None:
        if attempt != job.attempt or job.job_id not in self.running:
            return  # the end of an attempt that was preempted
        assert job.allocation is not None
        gpus = job.allocation.gpu_count()
        self._release(job)
        job.end = now
        job.remaining_s = 0.0
        job.stopping = False
        self.builder.job_ended(job.job_id)
        self.tracker.change(job.account, demand=-job.trace.gpus, held=-gpus)

    # -- preemption ----------------------------------------------------------------------------------

    def _last_checkpoint(self, job: _Job, now: float) -> float | None:
        """When the job last saved its work: every checkpoint_interval_s of progress (None: not yet)."""
        interval = self.options.checkpoint_interval_s
        if interval <= 0:
            return None
        saved = math.floor((now - job.run_start) / job.slowdown / interval) * interval
        return job.run_start + saved * job.slowdown if saved > 0 else None

    def _report_checkpoints(self, now: float) -> None:
        """What the jobs would have told the controller (gcheckpoint), so the victim chooser sees lost work."""
        for job in self.running.values():
            when = self._last_checkpoint(job, now)
            if when is not None:
                self.builder.job_checkpointed(job.job_id, when)

    def _begin_preemption(self, job: _Job, now: float, grace_s: float) -> None:
        """The controller warns the job and stops it after the grace period; its GPUs stay busy until then."""
        job.stopping = True
        self.ledger.begin_preemption(self.ledger.live[(job.job_id, job.attempt)], now + grace_s)
        self.builder.job_stopping(job.job_id)
        self._seq += 1
        heapq.heappush(self.events, (now + grace_s, _PREEMPTED, self._seq, job.job_id, job.attempt))

    def _preempted(self, job: _Job, attempt: int, now: float) -> None:
        """The grace period is over: stop the job and requeue it. It keeps the work up to its last
        checkpoint (all of it with checkpoint_interval_s 0: it checkpointed when warned) and pays the
        restart cost when it runs again. (A job whose work ended during the grace period completed.)"""
        if attempt != job.attempt or job.job_id not in self.running:
            return
        assert job.allocation is not None
        gpus = job.allocation.gpu_count()
        progress = (now - job.run_start) / job.slowdown
        interval = self.options.checkpoint_interval_s
        kept = math.floor(progress / interval) * interval if interval > 0 else progress
        lost = progress - kept + self.options.restart_cost_s
        self.lost_gpu_s += lost * gpus
        job.remaining_s = max(job.remaining_s - kept, 0.0) + self.options.restart_cost_s
        self._release(job)  # before the attempt number moves on: the ledger knows the attempt by it
        job.service = (*job.service, (job.run_start, now, gpus))  # for attained service (sched/attained.py)
        job.preemptions += 1
        job.attempt += 1
        job.stopping = False
        job.timed_out = False
        self.preemptions += 1
        self.builder.job_ended(job.job_id)
        self.tracker.change(job.account, held=-gpus, waiting=1)
        self._add_pending(job)
        # Requeued with its original submission time, as the controller keeps it.
        self.builder.job_arrived(job.job_id, job.trace, job.trace.submit_s, job.service)


def _estimate_before(job: _Job, lead_s: float) -> float | None:
    """The last estimated start the job had been given ``lead_s`` or more before its first start."""
    if job.first_start is None or not job.estimates:
        return None
    found = None
    for at, estimate in job.estimates:
        if at > job.first_start - lead_s:
            break
        found = estimate
    return found


def check_fits(cluster: SimCluster, jobs: Sequence[TraceJob], source: str, policy: Policy) -> None:
    """Refuse, before any replay, a job that no state of the cluster could run (the daemon refuses it at
    submission, from the same answer of the core): it would wait forever and hold back every policy alike."""
    refused = never_runs(policy, cluster, list(jobs))
    if refused:
        index = min(refused)
        job = jobs[index]
        why = (f"asks for {job.gpus} GPUs; the cluster has {cluster.total_gpus}" if job.gpus > cluster.total_gpus
               else f"can never run: {refused[index]}")
        raise TraceError(f"{source}, line {job.line}: job {job.job_id} {why}")


def replay(
    cluster: SimCluster, jobs: Sequence[TraceJob], policy: Policy, options: ReplayOptions | None = None
) -> ReplayResult:
    return Replay(cluster, jobs, policy, options).run()
