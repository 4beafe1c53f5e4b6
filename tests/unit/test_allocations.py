"""Interactive allocations (galloc) in the controller: release with the command's exit code, no requeue, the
keep-alive lease, what a submission may ask for, and the environment galloc's command gets. A real SQLite
store, so a restarted controller is shown to keep what was decided."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from test_cluster_state import connect, new_state

from garrison.config import ControllerConfig
from garrison.controller.allocations import AllocationLeases
from garrison.controller.state import ClusterState, SignalAttempt
from garrison.controller.validate import ValidationError, validate_submission
from garrison.model.domain import (
    Allocation,
    Job,
    JobSpec,
    JobState,
    LaunchMode,
    NodeAllocation,
    NodeResult,
    Principal,
)
from garrison.model.launch import LaunchDescription
from garrison.model.slurmenv import allocation_environment

ALLOCATION = Allocation((NodeAllocation("n1", (0, 1)), NodeAllocation("n2", (2, 3))))


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'c.db'}"


def allocation_job(job_id: int = 1, **changes: object) -> Job:
    spec = JobSpec(name="bash", command=(), launch=LaunchMode.ALLOCATION, gpus=4, nodes=2)
    return Job(job_id=job_id, spec=spec, user="alice", uid=1000, gid=1000, account="default", partition="main",
               time_limit_s=600, submit_time=0.0, **changes)  # type: ignore[arg-type]


def running_allocation(db: str) -> ClusterState:
    state = new_state(db)
    connect(state, "n1", "n2")
    state.add_jobs([allocation_job()])
    state.start_attempts([(1, ALLOCATION)], now=1.0)
    state.node_started("n1", 1, 0)
    state.node_started("n2", 1, 0)
    assert state.jobs[1].state == JobState.RUNNING
    return state


def placeholders_end(state: ClusterState, now: float) -> None:
    for node in ("n1", "n2"):
        state.node_finished(node, NodeResult(1, 0, ()), now=now)  # a placeholder: no ranks


def test_a_released_allocation_completes_with_the_commands_exit_code(db: str) -> None:
    state = running_allocation(db)
    out = state.release_allocation(1, 0, now=5.0)
    assert out == [SignalAttempt("n1", 1, 0, "terminate"), SignalAttempt("n2", 1, 0, "terminate")]
    assert state.jobs[1].state == JobState.COMPLETING
    assert state.release_allocation(1, 0, now=5.5) == []  # already being stopped
    placeholders_end(state, now=6.0)
    job = state.jobs[1]
    assert (job.state, job.exit_code) == (JobState.COMPLETED, 0)
    assert state.free_gpus(state.nodes["n1"]) == frozenset(range(8))


def test_a_non_zero_exit_fails_it_and_a_restarted_controller_remembers_the_code(db: str) -> None:
    state = running_allocation(db)
    state.release_allocation(1, 3, now=5.0)
    restarted = new_state(db, now=5.5)
    connect(restarted, "n1", "n2", running=[(1, 0)], now=5.5)
    placeholders_end(restarted, now=6.0)
    job = restarted.jobs[1]
    assert (job.state, job.exit_code) == (JobState.FAILED, 3)


def test_an_allocation_still_starting_is_not_released(db: str) -> None:
    state = new_state(db)
    connect(state, "n1", "n2")
    state.add_jobs([allocation_job()])
    state.start_attempts([(1, ALLOCATION)], now=1.0)
    state.node_started("n1", 1, 0)  # n2 not yet: CONFIGURING
    assert state.release_allocation(1, 0, now=2.0) == []
    assert state.jobs[1].state == JobState.CONFIGURING


def test_a_preempted_allocation_is_cancelled_not_requeued(db: str) -> None:
    state = running_allocation(db)
    assert state.preempt(1, grace_s=0.0, signum=10, now=5.0)
    state.expire_time_limits(now=5.0)
    placeholders_end(state, now=6.0)
    job = state.jobs[1]
    assert job.state == JobState.CANCELLED and job.reason == "preempted"
    assert job.attempts[0].state == JobState.PREEMPTED
    assert 1 not in state.ledger.queued


def test_the_lease_lapses_unless_renewed() -> None:
    leases = AllocationLeases(lease_s=5.0)
    pending, running = allocation_job(1), allocation_job(2, state=JobState.RUNNING)
    batch = replace(allocation_job(3), spec=JobSpec(name="b", command=("x",)))
    assert leases.lapsed([pending, running, batch], now=100.0) == []  # first seen: a full lease from now
    leases.renew(1, now=103.0)
    assert leases.lapsed([], now=104.0) == []  # later checks look at the observed allocations only
    assert leases.lapsed([], now=106.0) == [2]  # 2 never renewed; 1 renewed at 103; batch jobs have none
    assert leases.lapsed([], now=106.5) == []  # checked at most once a second
    assert leases.lapsed([], now=109.0) == [1, 2]
    leases.job_changed(running, allocation_job(2, state=JobState.CANCELLED))  # ended: forgotten
    newcomer = allocation_job(4)
    leases.job_changed(None, newcomer)  # submitted: a full lease from the next check
    assert leases.lapsed([], now=110.5) == [1]
    assert leases.lapsed([], now=116.0) == [1, 4]
    leases.job_changed(newcomer, replace(newcomer, state=JobState.COMPLETING))
    assert leases.lapsed([], now=117.5) == [1]  # being stopped already


def test_an_allocation_runs_nothing_and_is_no_array() -> None:
    principal, config = Principal("alice", 1000, 1000), ControllerConfig()
    spec = JobSpec(name="bash", command=(), launch=LaunchMode.ALLOCATION)
    assert validate_submission(spec, principal, config, {}, []).spec.launch == LaunchMode.ALLOCATION
    with pytest.raises(ValidationError, match="runs no script or command"):
        validate_submission(JobSpec(name="b", command=("true",), launch=LaunchMode.ALLOCATION), principal, config,
                            {}, [])
    with pytest.raises(ValidationError, match="cannot be a job array"):
        validate_submission(spec, principal, config, {}, [1, 2])


def test_galloc_gets_the_jobs_variables_without_the_nodes_own() -> None:
    launch = LaunchDescription(
        job_id=7, attempt=0, user="alice", uid=1000, gid=1000, spec=allocation_job().spec, allocation=ALLOCATION,
        node_rank=0, master_addr="10.0.0.1", master_port=29500, restart_count=0, kill_wait_s=10.0,
        time_limit_s=600, account="default", partition="main", cluster_name="c",
    )
    env = allocation_environment(launch, cpus_on_node=16)
    assert env["SLURM_JOB_ID"] == env["GARRISON_JOB_ID"] == "7"
    assert env["SLURM_JOB_NODELIST"] == "n[1-2]" and env["SLURM_NNODES"] == env["GARRISON_NNODES"] == "2"
    assert env["SLURM_TASKS_PER_NODE"] == "1(x2)" and env["SLURM_JOB_GPUS"] == "0,1"
    assert env["SLURM_JOB_CPUS_PER_NODE"] == "16(x2)"
    assert not {"SLURMD_NODENAME", "CUDA_VISIBLE_DEVICES", "SLURM_PROCID", "RANK"} & set(env)
