"""When a scheduling cycle is due: the one rule the engine's scheduler loop follows.

A cycle's plan is a function of its snapshot and its clock (controller/sched is pure), so planning again
can only change something when one of these has moved since the last cycle:

1. the state the snapshot is built from: ClusterState.generation, which every mutator of jobs, holds, live
   attempts, nodes and the accounting policy bumps (controller/lifecycle.py ``scheduling_inputs_changed``):
   a submission, a job starting or ending, a cancel, hold, release or update, a node joining, leaving or
   being drained;
2. a moment the last plan said would change it: the earliest begin time that a job waited for
   (``Plan.wake_at``; a launch's back-off is a begin time too);
3. the clock's slow effects: a pending job's age, and fair share and quotas as usage is charged and decays.
   These move a priority by a point in minutes, so they are recomputed every ``interval_s`` (the
   controller's ``schedule_interval_s``, 30 s by default) rather than every second. A plan's priorities
   stand until its ``reprice_at`` (SchedulerConfig.priority_interval_s: the cycles in between price only the
   jobs that changed), which makes a cycle due too.

Time limits and preemption grace periods need no trigger of their own here: the engine's timer ends those
attempts, which changes the state (1). With 50,000 jobs pending and nothing able to start, the controller
therefore plans twice a minute, not after every heartbeat.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class Why:
    """Why a cycle is due (logged at debug level, and the tests' vocabulary)."""

    FIRST = "first cycle"
    CHANGED = "state changed"
    WAKE = "a begin time came"
    INTERVAL = "recompute interval"


@dataclass
class CycleDue:
    interval_s: float  # the longest time between cycles (schedule_interval_s)
    generation: int | None = None  # the state's generation the last cycle planned from; None before the first
    planned_at: float = -math.inf  # the clock when the last cycle's snapshot was taken
    wake_at: float = math.inf  # the earliest moment the last plan said the clock alone would change it
    reprice_at: float = math.inf  # when the last plan's priorities are due to be recomputed (Plan.reprice_at)

    def why(self, generation: int, now: float) -> str | None:
        """Why a cycle is due now, or None when planning again could not change anything."""
        if self.generation is None:
            return Why.FIRST
        if generation != self.generation:
            return Why.CHANGED
        if now >= self.planned_at + self.interval_s or now >= self.reprice_at:
            return Why.INTERVAL
        if now >= self.wake_at:
            return Why.WAKE
        return None

    def seconds_to_wait(self, now: float) -> float:
        """How long, from ``now``, until the clock alone makes a cycle due (a state change may come sooner)."""
        return max(0.0, min(self.wake_at, self.reprice_at, self.planned_at + self.interval_s) - now)

    def planned(self, generation: int, now: float, wake_at: float | None, reprice_at: float | None = None) -> None:
        """A cycle has planned from the state at ``generation`` with the clock at ``now``."""
        self.generation = generation
        self.planned_at = now
        self.wake_at = wake_at if wake_at is not None else math.inf
        self.reprice_at = reprice_at if reprice_at is not None else math.inf

    def applied(self, before: int, after: int) -> None:
        """The last cycle's plan was applied, which moved the generation from ``before`` to ``after``. If
        nothing else had changed since its snapshot (``before`` is the generation it planned from), those
        changes are the plan's own (its starts), which it already counted on: the next cycle would plan the
        same, so they do not make one due."""
        if self.generation == before:
            self.generation = after

    def retry_at(self, when: float) -> None:
        """Plan again at ``when`` at the latest: the last plan could not be applied (the database was down)."""
        self.wake_at = min(self.wake_at, when)
