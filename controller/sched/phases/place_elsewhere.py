"""A job that names several partitions (sbatch -p a,b) and cannot start now in its first: start it now in the
next one that can run it, in order, each placement within one partition (a gang never spans two). Its gates,
its reservation, preemption for it and its priority are its first partition's; the others are only tried for
a start now, so a job that fits nowhere waits in its first partition as a one-partition job would."""

from __future__ import annotations

from dataclasses import replace

from garrison.controller.sched.cycle_state import Candidacy, CycleState
from garrison.controller.sched.framework import placement_key
from garrison.controller.sched.phases.gates import policy_reason
from garrison.controller.sched.phases.place_now import place_now


def place_elsewhere(state: CycleState, c: Candidacy) -> bool:
    job = c.job
    if not job.other_partitions:
        return False
    failed = state.failed  # place_now counted the job's failure in its first partition: it counts once
    checked = bool(state.snapshot.accounting.partitions)
    for name in job.other_partitions:
        partition = state.partitions.get(name)
        if checked and (partition is None or policy_reason(state, job, partition, c.limit) is not None):
            continue  # deleted since, or its rules no longer admit the job (account, QoS, time limit)
        if not state.config.backfill and name in state.blocked_partitions:
            continue  # strict FIFO: a blocked job ahead holds that partition
        request = replace(c.request, partition=name)
        if place_now(state, Candidacy(job, c.limit, request, placement_key(request), c.end)):
            state.failed = failed
            return True
    state.failed = failed
    return False
