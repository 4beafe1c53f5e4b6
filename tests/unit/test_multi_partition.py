"""sbatch -p a,b: a job that names several partitions waits in each and starts in the first that can run it.

The scheduling core (phases/place_elsewhere.py), the submission's validation (controller/validate.py) and the
job's partition field through start and requeue (garrison/model/partitions.py, domain.Job.with_state)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sched_helpers import NOW, busy, machine, node, pending, running

from garrison.config import ControllerConfig, PartitionConfig
from garrison.controller.sched.cycle import Reason, schedule
from garrison.controller.sched.presets import preset
from garrison.controller.sched.snapshot import PendingJob, Snapshot
from garrison.controller.snapshots import pending_view
from garrison.controller.validate import ValidationError, validate_submission
from garrison.model.accounts import Account, Accounting, PartitionDef
from garrison.model.domain import Job, JobSpec, JobState, Node, Principal
from garrison.model.partitions import first_partition, in_partition, partition_names

GARRISON, FIFO_EASY = preset("garrison"), preset("fifo-easy")

ACCOUNTING = Accounting(
    accounts=(Account("default"),),
    partitions=(PartitionDef("a", default=True, max_time_s=86400), PartitionDef("b", max_time_s=86400)),
)


def snap(nodes: list, jobs: list, running_jobs: list = ()) -> Snapshot:  # type: ignore[type-arg,assignment]
    return Snapshot(nodes=tuple(nodes), pending=tuple(jobs), running=tuple(running_jobs), accounting=ACCOUNTING,
                    usage={})


def both(job_id: int, **spec: object) -> PendingJob:
    """A job submitted with -p a,b, as the controller hands it to the core."""
    return replace(pending(job_id, partition="a", **spec), other_partitions=("b",))


def in_a(name: str, gpus: int = 8, free: set[int] | None = None) -> object:
    return node(name, gpus=gpus, free=free, partitions=frozenset({"a"}))


def in_b(name: str, gpus: int = 8, free: set[int] | None = None) -> object:
    return node(name, gpus=gpus, free=free, partitions=frozenset({"b"}))


# -- the core -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("config", [GARRISON, FIFO_EASY], ids=["garrison", "fifo-easy"])
def test_a_job_starts_in_its_second_partition_when_the_first_is_full(config: object) -> None:
    plan = schedule(snap([in_a("a1", free=set()), in_b("b1")], [both(1, gpus=2)]), NOW, config)  # type: ignore[arg-type]
    assert [(s.job_id, s.partition, s.allocation.node_names) for s in plan.starts] == [(1, "b", ("b1",))]


def test_the_first_partition_is_tried_first_and_named_in_the_start() -> None:
    plan = schedule(snap([in_a("a1"), in_b("b1")], [both(1, gpus=2)]), NOW, GARRISON)
    assert [(s.partition, s.allocation.node_names) for s in plan.starts] == [("a", ("a1",))]


def test_a_one_partition_job_is_not_started_in_another_partition() -> None:
    plan = schedule(snap([in_a("a1", free=set()), in_b("b1")], [pending(1, partition="a", gpus=2)]), NOW, GARRISON)
    assert not plan.starts and plan.waiting[1] == Reason.RESOURCES


def test_a_gang_never_spans_two_partitions() -> None:
    # 16 GPUs on two nodes: one node free in a and one in b would make 16, but never across partitions.
    nodes = [in_a("a1"), in_a("a2", free=set()), in_b("b1"), in_b("b2", free=set())]
    plan = schedule(snap(nodes, [both(1, gpus=16, nodes=2)]), NOW, GARRISON)
    assert not plan.starts
    # With b's second node free too, the gang starts wholly in b.
    nodes[3] = in_b("b2")
    plan = schedule(snap(nodes, [both(1, gpus=16, nodes=2)]), NOW, GARRISON)
    assert [(s.partition, set(s.allocation.node_names)) for s in plan.starts] == [("b", {"b1", "b2"})]


def test_a_blocked_look_alike_in_one_partition_does_not_hold_back_a_job_that_names_two() -> None:
    # Past the reservations, a job whose look-alike failed is skipped; a job naming a and b is no look-alike
    # of one naming only a, so it is still tried in b.
    jobs = [pending(job_id, partition="a", gpus=8) for job_id in range(1, 20)] + [both(20, gpus=8)]
    plan = schedule(snap([in_a("a1", free=set()), in_b("b1")], jobs), NOW, GARRISON)
    assert [(s.job_id, s.partition) for s in plan.starts] == [(20, "b")]


def test_jobs_naming_two_partitions_fill_both() -> None:
    jobs = [both(job_id, gpus=8) for job_id in range(1, 5)]
    plan = schedule(snap([in_a("a1"), in_b("b1")], jobs), NOW, GARRISON)
    assert sorted((s.partition, s.allocation.node_names) for s in plan.starts) == [("a", ("a1",)), ("b", ("b1",))]
    assert plan.waiting[3] == plan.waiting[4] == Reason.RESOURCES


def test_its_reservation_is_in_its_first_partition() -> None:
    # Both partitions busy: the job waits with a reservation on a's node, where the running job ends first.
    a1 = busy(in_a("a1", free=set()), running(90, {"a1": tuple(range(8))}, limit=3600, start=NOW - 3000))  # type: ignore[arg-type]
    b1 = busy(in_b("b1", free=set()), running(91, {"b1": tuple(range(8))}, limit=7200, start=NOW - 100))  # type: ignore[arg-type]
    runs = [running(90, {"a1": tuple(range(8))}, limit=3600, start=NOW - 3000),
            running(91, {"b1": tuple(range(8))}, limit=7200, start=NOW - 100)]
    plan = schedule(snap([a1, b1], [both(1, gpus=8)], runs), NOW, GARRISON)
    assert not plan.starts and plan.waiting[1] == Reason.RESOURCES
    assert [r.job_id for r in plan.reservations] == [1]
    assert plan.reservations[0].allocation.node_names == ("a1",)


def test_a_partition_whose_rules_no_longer_admit_the_job_is_skipped() -> None:
    # b's maximum time fell below the job's limit after it was submitted: it is not started there.
    accounting = replace(ACCOUNTING, partitions=(PartitionDef("a", default=True), PartitionDef("b", max_time_s=60)))
    snapshot = replace(snap([in_a("a1", free=set()), in_b("b1")], [both(1, gpus=1)]), accounting=accounting)
    assert not schedule(snapshot, NOW, GARRISON).starts


# -- the job's partition field --------------------------------------------------------------------------------


def test_partition_names_reads_a_comma_list() -> None:
    assert partition_names("a") == ("a",)
    assert partition_names("a,b") == ("a", "b")
    assert partition_names(" a , b,,a,") == ("a", "b")
    assert first_partition("b,a") == "b" and first_partition("a") == "a"
    assert in_partition("a,b", "b") and in_partition("a", "a") and not in_partition("a,b", "c")
    assert not in_partition("ab", "a")


def _job(partition: str, spec_partition: str | None) -> Job:
    spec = JobSpec(name="j", command=("true",), partition=spec_partition)
    return Job(job_id=7, spec=spec, user="u", uid=1000, gid=1000, account="default", partition=partition,
               time_limit_s=3600, submit_time=NOW)


def test_the_core_sees_the_first_partition_and_the_others() -> None:
    view = pending_view(_job("b,a", "b,a"))
    assert (view.partition, view.other_partitions) == ("b", ("a",))
    plain = pending_view(_job("a", "a"))
    assert (plain.partition, plain.other_partitions) == ("a", ())


def test_a_requeued_job_waits_in_every_partition_it_named_again() -> None:
    ran = replace(_job("b", "a,b"), state=JobState.RUNNING)
    assert ran.with_state(JobState.PENDING).partition == "a,b"
    assert ran.with_state(JobState.COMPLETED).partition == "b"
    one = replace(_job("a", "a"), state=JobState.RUNNING)
    assert one.with_state(JobState.PENDING).partition == "a"


# -- validation -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> dict[str, Node]:
    return {"n1": Node("n1", machine("dgx-a100", "n1")), "n2": Node("n2", machine("dgx-a100", "n2"))}


CONFIG = ControllerConfig(partitions=(
    PartitionConfig("short", nodes=("n1",), default=True, default_time_s=3600, max_time_s=4 * 3600),
    PartitionConfig("long", nodes=("n2",), default_time_s=86400, max_time_s=7 * 86400),
    PartitionConfig("urgent", nodes=("n1", "n2"), max_time_s=86400, priority=10),
    PartitionConfig("teamonly", nodes=("n2",), allowed_accounts=("team",)),
))


def submit(cluster: dict[str, Node], partition: str, **spec: object) -> tuple[str, int]:
    job = JobSpec(name="j", command=("true",), partition=partition, gpus=1, **spec)  # type: ignore[arg-type]
    resolved = validate_submission(job, Principal("ann", 1000, 1000), CONFIG, cluster, [])
    assert resolved.spec.partition == resolved.partition
    return resolved.partition, resolved.time_limit_s


def test_the_list_is_kept_and_its_time_limit_is_the_first_partitions(cluster: dict[str, Node]) -> None:
    assert submit(cluster, "short,long") == ("short,long", 3600)
    assert submit(cluster, "long,short") == ("long", 86400)  # short refuses long's default day
    assert submit(cluster, "long,short", time_limit_s=7200) == ("long,short", 7200)


def test_a_higher_priority_partition_is_tried_first(cluster: dict[str, Node]) -> None:
    assert submit(cluster, "short,urgent") == ("urgent,short", 3600)


def test_partitions_that_refuse_the_job_are_dropped(cluster: dict[str, Node]) -> None:
    assert submit(cluster, "teamonly,short") == ("short", 3600)  # ann's account may not use teamonly
    assert submit(cluster, "short,long", time_limit_s=2 * 86400) == ("long", 2 * 86400)
    assert submit(cluster, "short,short,long,") == ("short,long", 3600)


def test_a_job_every_named_partition_refuses_is_refused_with_each_reason(cluster: dict[str, Node]) -> None:
    with pytest.raises(ValidationError) as caught:
        submit(cluster, "teamonly,nosuch")
    text = str(caught.value)
    assert "\n" not in text and text.startswith("no partition of --partition teamonly,nosuch accepts the job")
    assert "teamonly: account" in text and "nosuch: unknown partition 'nosuch'" in text
    for bad in (",", "a b,c", "x" * 70 + ",short"):
        with pytest.raises(ValidationError):
            submit(cluster, bad)
