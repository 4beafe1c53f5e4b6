"""Named policies: the configurations the simulator compares and the daemon ships.

- ``fifo``: arrival order, no backfill; the first job that does not fit holds back its whole partition.
- ``fifo-easy``: arrival order with EASY backfill (Slurm's default behaviour): the first blocked job gets a
  reservation, and later jobs start early only if they end before it or use GPUs it does not need.
- ``garrison``: what the daemon runs unless configured otherwise: multifactor priority (fair share, age,
  QoS, job size, partition), backfill with reservations for the top blocked jobs, topology-aware placement.
"""

from __future__ import annotations

from garrison.controller.sched.cycle import SchedulerConfig
from garrison.controller.sched.priority import NO_WEIGHTS, PriorityWeights


def policy_presets() -> dict[str, SchedulerConfig]:
    return {
        "fifo": SchedulerConfig(weights=NO_WEIGHTS, backfill=False),
        "fifo-easy": SchedulerConfig(weights=NO_WEIGHTS, backfill=True, reservations=1),
        "garrison": SchedulerConfig(weights=PriorityWeights(), backfill=True, reservations=8),
    }


def preset(name: str) -> SchedulerConfig:
    presets = policy_presets()
    if name not in presets:
        raise ValueError(f"unknown scheduling policy {name!r} (known: {', '.join(presets)})")
    return presets[name]
