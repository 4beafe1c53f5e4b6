"""Named policies: the configurations the simulator compares and the daemon ships.

- ``fifo``: arrival order, no backfill; the first job that does not fit holds back its whole partition.
- ``fifo-easy``: arrival order with EASY backfill (Slurm's default behaviour): the first blocked job gets a
  reservation, and later jobs start early only if they end before it or use GPUs it does not need.
- ``garrison``: what the daemon runs unless configured otherwise: multifactor priority, backfill with
  reservations for the top blocked jobs, topology-aware placement. The weights put partition and QoS tiers
  first (each worth 100 days of waiting), then shorter time limits (a 1 h job is worth 30 days of waiting
  more than a 7-day one) and fair share (5 days between an idle account and a saturated one), and age keeps
  growing for 30 days. A job pending over 4 days is overdue: it gains 100,000 points (a QoS tier) per
  further 4 days, so it goes ahead of every job that is not, overdue jobs by how long they waited, and it is
  reserved for however far away its start is. Without that bound a week-long job was overtaken by every
  shorter one for a month (the longest waits were 1.3-4.4x FIFO+EASY's). Measured with gsim on every shared
  trace and 3 seeds (tests/benchmarks/sim_quality.py; docs/gsim.md has the figures and the trade-off).
"""

from __future__ import annotations

from garrison.controller.sched.cycle import SchedulerConfig
from garrison.controller.sched.priority import NO_WEIGHTS, PriorityWeights

# Age grows 1,000 points a day for 30 days: the unit the other weights are measured in.
GARRISON_WEIGHTS = PriorityWeights(
    age=30_000,
    max_age_s=30 * 86400,
    fair_share=5_000,
    qos=100_000,
    partition=100_000,
    job_size=0,
    time_limit=30_000,
    short_limit_s=3600,
    long_limit_s=7 * 86400,
    overdue=100_000,
    overdue_after_s=4 * 86400,
)
RESERVATIONS = 8


def policy_presets() -> dict[str, SchedulerConfig]:
    return {
        "fifo": SchedulerConfig(weights=NO_WEIGHTS, backfill=False),
        "fifo-easy": SchedulerConfig(weights=NO_WEIGHTS, backfill=True, reservations=1),
        "garrison": SchedulerConfig(weights=GARRISON_WEIGHTS, backfill=True, reservations=RESERVATIONS),
    }


def preset(name: str) -> SchedulerConfig:
    presets = policy_presets()
    if name not in presets:
        raise ValueError(f"unknown scheduling policy {name!r} (known: {', '.join(presets)})")
    return presets[name]
