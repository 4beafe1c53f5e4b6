"""Preemption grace is decided in the core (issue 21): the victim QoS's grace, which the victim's own
--signal lead time may shorten, or lengthen only up to the admin's maximum; the daemon's snapshot carries
the lead time, the engine signals with exactly the plan's grace, and gsim replays the same."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sched_helpers import NOW, busy, node, pending, running

from garrison.controller.sched.cycle import SchedulerConfig, schedule
from garrison.controller.sched.preemption import DEFAULT_MAX_GRACE_S, preemption_grace
from garrison.controller.sched.presets import preset
from garrison.controller.sched.snapshot import Snapshot
from garrison.model.accounts import Accounting, Qos

ACCOUNTING = Accounting(qos=(Qos("low", 0, grace_s=60), Qos("high", 20, preempts=("low",))), default_qos="low")


@pytest.mark.parametrize(("qos_grace", "lead", "maximum", "grace"), [
    (60, None, 300, 60),  # no --signal: the QoS's grace
    (60, 10, 300, 10),  # a shorter lead time shortens it
    (60, 90, 300, 90),  # a longer one lengthens it...
    (60, 65535, 300, 300),  # ...only up to the admin's maximum
    (600, 65535, 300, 600),  # and never below the QoS's grace
    (0, 5, 0, 0),  # QoS grace 0, no lengthening allowed
])
def test_the_grace_rule(qos_grace: int, lead: int | None, maximum: int, grace: int) -> None:
    assert preemption_grace(qos_grace, lead, maximum) == grace


def plan_grace(lead: int | None, config: SchedulerConfig) -> tuple[int, float]:
    victim = replace(running(11, {"a": tuple(range(8))}, qos="low", start=NOW - 100, limit=86400),
                     warning_lead_s=lead)
    snapshot = Snapshot(nodes=(busy(node("a"), victim),), pending=(pending(1, qos="high", gpus=8),),
                        running=(victim,), accounting=ACCOUNTING)
    plan = schedule(snapshot, NOW, config)
    (preempt,) = plan.preempts
    return preempt.grace_s, plan.estimated_starts.get(1, -1.0)


def test_an_18_hour_signal_does_not_make_a_job_unpreemptable() -> None:
    config = replace(preset("garrison"), preemption=True)
    assert plan_grace(65535, config)[0] == DEFAULT_MAX_GRACE_S
    assert plan_grace(65535, replace(config, max_grace_s=1200))[0] == 1200
    assert plan_grace(30, config)[0] == 30
    assert plan_grace(None, config)[0] == 60


def test_the_admin_maximum_is_validated() -> None:
    with pytest.raises(ValueError, match="max_grace_s"):
        SchedulerConfig(max_grace_s=-1)


def test_the_daemon_snapshot_carries_the_victims_lead_time(tmp_path: object) -> None:
    from test_plan_recheck import job, new_state

    from garrison.model.domain import Allocation, NodeAllocation

    state = new_state({"n1": 2})
    state.add_jobs([replace(job(1, gpus=1), spec=replace(job(1, gpus=1).spec, signal="USR1@65535")), job(2, gpus=1)])
    state.start_attempts([(1, Allocation((NodeAllocation("n1", (0,)),))),
                          (2, Allocation((NodeAllocation("n1", (1,)),)))], 1.0)
    leads = {r.job_id: r.warning_lead_s for r in state.snapshot().running}
    assert leads == {1: 65535, 2: None}
    state.store.close()


def test_the_config_key_reaches_the_core() -> None:
    from garrison.config import parse_config
    from garrison.controller.sched_settings import scheduler_config

    config = parse_config({"controller": {"scheduler": {"preempt_max_grace": "10:00"}}}, "t.toml")
    assert scheduler_config(config.controller.scheduler).max_grace_s == 600
