"""Why a job waits, in terms a user can act on (gjob, gqueue --explain): the explainer recomputes one job's
filter tally on the cycle's own snapshot and plan (sched/explain.py)."""

from __future__ import annotations

from dataclasses import replace

from sched_helpers import NOW, busy, node, pending, running

from garrison.controller.sched.cycle import SchedulerConfig, schedule
from garrison.controller.sched.explain import Explanation, WaitKind, explain_wait
from garrison.controller.sched.plan import Plan
from garrison.controller.sched.presets import preset
from garrison.controller.sched.snapshot import Snapshot
from garrison.model.accounts import Account, Accounting, Limits

GARRISON = preset("garrison")


def explained(snapshot: Snapshot, job_id: int):  # type: ignore[no-untyped-def]
    plan = schedule(snapshot, NOW, GARRISON)
    found = explain_both(snapshot, plan, job_id)
    assert found is not None
    return found


def explain_both(snapshot: Snapshot, plan: Plan, job_id: int, config: SchedulerConfig = GARRISON) -> Explanation | None:
    """explain_wait as gsim calls it (passes over the queue) and as the controller does (the cycle's positions
    and pending jobs by id, looked up): the same explanation both ways."""
    passes = explain_wait(snapshot, plan, config, NOW, job_id)
    looked_up = explain_wait(snapshot, plan, config, NOW, job_id,
                             positions={j: i + 1 for i, j in enumerate(plan.order)},
                             pending={j.job_id: j for j in snapshot.pending})
    assert looked_up == passes
    return looked_up


def test_a_job_no_node_could_ever_hold_says_never_with_the_largest() -> None:
    snapshot = Snapshot(nodes=(node("a", gpus=8), node("b", gpus=8)), pending=(pending(1, gpus=16, nodes=1),))
    why = explained(snapshot, 1)
    assert why.kind == WaitKind.NEVER
    assert why.lines == ("never (on the nodes that are up): no node of partition 'main' can ever run 16 GPUs on one "
                         "node: of 2 node(s), 2 with too few GPUs of the type and memory asked for (largest: 8 GPUs)",)


def test_a_reserved_job_says_how_many_nodes_could_hold_it_and_when_it_starts() -> None:
    runs = [running(10 + i, {n: tuple(range(8))}, start=NOW - 100, limit=1000 + 600 * i) for i, n in enumerate("abc")]
    nodes = tuple(busy(node(n, gpu_name="NVIDIA A100"), r) for n, r in zip("abc", runs, strict=True))
    snapshot = Snapshot(nodes=nodes + (node("d", gpus=8, gpu_name="Tesla V100", free=set()),),
                        pending=(pending(1, gpus=8, gpu_type="a100"), pending(2, gpus=8, gpu_type="a100")),
                        running=tuple(runs))
    why = explained(snapshot, 1)
    assert why.kind == WaitKind.RESERVED
    assert why.lines[0].startswith("8 GPUs of type a100: 3 node(s) could hold it, all busy until ~")
    assert why.lines[1].startswith("reserved: estimated start ~")
    assert why.tally.evaluated == 4 and why.tally.count("GpuCapacity") == 1 and why.tally.count("GpuFree") == 3


def test_a_job_at_its_account_quota_names_the_account_and_the_numbers() -> None:
    accounting = Accounting(accounts=(Account("physics"),), account_limits=(("physics", Limits(max_gpus=16)),))
    run = running(10, {"a": tuple(range(8)), "b": tuple(range(8))}, account="physics")
    snapshot = Snapshot(nodes=(busy(node("a"), run), busy(node("b"), run), node("c")),
                        pending=(pending(1, gpus=8, account="physics"),), running=(run,), accounting=accounting)
    why = explained(snapshot, 1)
    assert why.kind == WaitKind.QUOTA
    assert why.lines == ("account physics is at its GPUs quota (16 of 16)",)


def test_a_job_behind_higher_priority_jobs_says_how_many() -> None:
    run = running(10, {"a": tuple(range(8))}, start=NOW - 100, limit=3600)
    jobs = tuple(pending(i, gpus=8, submit=NOW - 100 + i) for i in range(1, 12))
    snapshot = Snapshot(nodes=(busy(node("a"), run),), pending=jobs, running=(run,))
    plan = schedule(snapshot, NOW, replace(GARRISON, reservations=1))
    why = explain_both(snapshot, plan, 11)
    assert why is not None and why.kind == WaitKind.BEHIND
    assert why.lines[-1].startswith("behind 10 job(s) of higher priority")


def test_the_nodes_taken_by_the_starts_ahead_count_and_those_behind_do_not() -> None:
    """Two free nodes, three 8-GPU jobs: the first two start; the third waits with both nodes busy, as the
    cycle left them (the starts of the jobs ahead of it taken), and nothing not yet started is unknown."""
    jobs = tuple(pending(i, gpus=8, submit=NOW - 100 + i) for i in range(1, 4))
    snapshot = Snapshot(nodes=(node("a", gpus=8), node("b", gpus=8)), pending=jobs)
    plan = schedule(snapshot, NOW, GARRISON)
    assert {s.job_id for s in plan.starts} == {1, 2}
    why = explain_both(snapshot, plan, 3)
    assert why is not None and why.tally.count("GpuFree") == 2
    first = explain_both(snapshot, plan, 1)
    assert first is not None and first.kind == WaitKind.STARTING
    assert explain_both(snapshot, plan, 99) is None  # not pending in that cycle


def test_a_held_job_says_how_to_release_it() -> None:
    snapshot = Snapshot(nodes=(node("a"),), pending=(pending(1, gpus=1, held=True),))
    assert explained(snapshot, 1).lines == ("held: release it with gcontrol release",)


def test_gqueue_explain_renders_position_start_and_each_sentence() -> None:
    from garrison.cli.queue_views import explain_text
    from garrison.controller.admin import PendingLine
    from garrison.controller.rpc import convert_admin
    from garrison.model.domain import Job, JobSpec
    from garrison.protos.v1 import admin_pb2 as adminpb

    job = Job(job_id=7, spec=JobSpec(name="train", command=("x",), gpus=8), user="ann", uid=1, gid=1,
              account="team", partition="main", time_limit_s=60, submit_time=0.0, reason="Resources")
    line = PendingLine(job, 3, None, None, None, ("8 GPUs: 3 node(s) could hold it, all busy", "behind 2 job(s)"))
    response = adminpb.QueueDetailsResponse(jobs=[convert_admin.pending_detail_to_pb(line, now=10.0)], now=10.0)
    assert explain_text(response) == ("7 (train, ann): pending (Resources), position 3, estimated start unknown\n"
                                      "  8 GPUs: 3 node(s) could hold it, all busy\n  behind 2 job(s)")
