"""PostFilter (preemption): with preemption on and a QoS that may preempt others, the cheapest set of
running victims that makes room (preemption.py), each with the grace the core decides; what they free is
held for the job meanwhile, and later reservations plan around it."""

from __future__ import annotations

from garrison.controller.sched.cycle_state import Candidacy, CycleState
from garrison.controller.sched.plan import Preempt, Reason
from garrison.controller.sched.preemption import memory_room_after, preemption_grace, select_victims
from garrison.controller.sched.snapshot import RunningJob


def preempt_for(state: CycleState, c: Candidacy) -> bool:
    config = state.config
    if not config.preemption:
        return False
    accounting = state.snapshot.accounting
    qos = accounting.qos_map.get(c.job.qos_name or state.default_qos)
    if not (config.preemption and qos is not None and qos.preempts
            and state.preempting_jobs < config.max_preemptions_per_cycle):
        return False
    allowed = set(qos.preempts)

    def may_preempt(run: RunningJob) -> bool:
        return (run.qos or state.default_qos) in allowed and (run.job_id, run.attempt) not in state.victims_taken

    chosen = select_victims(c.request, state.capacity, state.placer, state.snapshot.running, may_preempt, state.now)
    if chosen is None:
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
