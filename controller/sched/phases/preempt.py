"""PostFilter (preemption): with preemption on and a QoS that may preempt others, the cheapest set of
running victims that makes room (preemption.py), each with the grace the core decides; what they free is
held for the job meanwhile, and later reservations plan around it.

With attained service's rule on (SchedulerConfig.preempt_attained, attained.py), a job in the high queue may
also preempt running jobs in the low queue (those that have had the threshold of GPU time since their latest
promotion), by the same victim search, grace and requeue."""

from __future__ import annotations

from garrison.controller.sched.attained import attained_gpu_s
from garrison.controller.sched.cycle_state import Candidacy, CycleState
from garrison.controller.sched.plan import Preempt, Reason
from garrison.controller.sched.preemption import memory_room_after, preemption_grace, select_victims
from garrison.controller.sched.snapshot import PendingJob, RunningJob


def _preemption_rule(state: CycleState, job: PendingJob) -> tuple[frozenset[str], bool]:
    """The QoS the job may preempt, and whether attained service's rule lets it preempt low-queue jobs (the
    job's queue as of the moment its priority was priced, like its rank)."""
    config = state.config
    qos = state.snapshot.accounting.qos_map.get(job.qos_name or state.default_qos)
    allowed = frozenset(qos.preempts) if qos is not None and qos.preempts else frozenset()
    by_attained = config.preempt_attained and config.weights.high_queue(job, state.priced_at)
    return allowed, by_attained


def preemption_ruled_out(state: CycleState, job: PendingJob, key: tuple[object, ...], end: float) -> bool:
    """Whether preempt_for would surely do nothing for this job (checked before trying any victim): then its
    phases answer as they would with preemption off, and the cycle may treat it like a look-alike."""
    config = state.config
    if not config.preemption or state.preempting_jobs >= config.max_preemptions_per_cycle:
        return True
    allowed, by_attained = _preemption_rule(state, job)
    if not (allowed or by_attained):
        return True
    failed_end = state.no_victims.get((key, allowed, by_attained))
    return failed_end is not None and end >= failed_end


def preempt_for(state: CycleState, c: Candidacy) -> bool:
    config = state.config
    if not config.preemption:
        return False
    accounting = state.snapshot.accounting
    allowed, by_attained = _preemption_rule(state, c.job)
    if not ((allowed or by_attained) and state.preempting_jobs < config.max_preemptions_per_cycle):
        return False
    # Within a cycle what may be freed only shrinks (starts, holds and victims taken add up), so a job whose
    # look-alike (same placement key, same victims allowed) found no victims for a run ending no earlier finds
    # none either: with attained service nearly every new job may preempt, and a deep queue must not search
    # victims for each of them.
    tried = (c.key, allowed, by_attained)
    failed_end = state.no_victims.get(tried)
    if failed_end is not None and c.end >= failed_end:
        return False
    weights = config.weights
    threshold, starvation, now = weights.attained_threshold_gpu_s, weights.attained_starvation, state.now

    def may_preempt(run: RunningJob) -> bool:
        if (run.job_id, run.attempt) in state.victims_taken:
            return False
        if (run.qos or state.default_qos) in allowed:
            return True
        if not by_attained:
            return False
        # In the low queue, and it has had the threshold of GPU time in this very attempt: a requeued job
        # resumes with a quantum of its own before it may be preempted again, so a job is preempted at most
        # once per threshold of service. (Without it, on gsim's traces, a job resumed in the low queue was
        # preempted by the next arrival, lost its work since the last checkpoint again, and the preemptions
        # outnumbered the jobs.)
        gpus = run.gpu_count()
        return (gpus * (now - run.start_time) >= threshold
                and attained_gpu_s(run.service, starvation, run.start_time, gpus, now) >= threshold)

    chosen = select_victims(c.request, state.capacity, state.placer, state.snapshot.running, may_preempt, state.now)
    if chosen is None:
        state.no_victims[tried] = min(c.end, failed_end) if failed_end is not None else c.end
        return False
    victims, allocation = chosen
    state.preempting_jobs += 1 if victims else 0
    grace = 0
    for victim in victims:
        state.victims_taken.add((victim.job_id, victim.attempt))
        victim_qos = accounting.qos_map.get(victim.qos or state.default_qos)
        grace_s = preemption_grace(victim_qos.grace_s if victim_qos else 0, victim.warning_lead_s, config.max_grace_s)
        state.preempts.append(Preempt(victim.job_id, victim.attempt, grace_s))
        grace = max(grace, grace_s)
    # Nobody else may take what is freed for it, and later reservations plan around it.
    stopping = [r for r in state.snapshot.running if r.stopping]
    state.capacity.reserve(allocation, state.now, c.job.job_id,
                           memory_room_after([*victims, *stopping], state.capacity, allocation))
    state.hold_on_timeline(allocation, state.now + grace + c.limit, started=False)
    state.waiting[c.job.job_id] = Reason.PREEMPTING
    return True
