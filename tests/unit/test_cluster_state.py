"""The controller's state machine, driven by events with no network: instructions out, store written through.

Uses a real SQLite store, so each test also proves that a controller restarted on the same database
(ClusterState.load) continues from where the old one stopped.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from garrison.controller.state import AckResult, ClusterState, Launch, SignalAttempt
from garrison.controller.store import open_store
from garrison.model.domain import (
    Allocation,
    AttemptUsage,
    Gpu,
    Job,
    JobSpec,
    JobState,
    LaunchMode,
    NodeAllocation,
    NodeInventory,
    NodeResult,
    NodeState,
    RankOutcome,
)


def inventory(name: str, gpus: int = 8) -> NodeInventory:
    return NodeInventory(
        hostname=name,
        gpus=tuple(Gpu(i, f"GPU-{name}-{i}", "NVIDIA A100", 40960, f"0000:{i:02x}:00.0", 0, "0-1") for i in range(gpus)),
        nvlink=tuple(tuple(0 if i == j else 12 for j in range(gpus)) for i in range(gpus)),
        topo=(),
        cpus=2,
        memory_mb=1024,
    )


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'c.db'}"


def new_state(db: str, now: float = 0.0) -> ClusterState:
    state = ClusterState(open_store(db), heartbeat_timeout_s=10.0)
    state.load(now, retention_s=1e9)
    return state


def connect(state: ClusterState, *names: str, now: float = 0.0, running=(), finished=()) -> list:
    out = []
    for name in names:
        out += state.register_node(name, inventory(name), frozenset({"main"}), list(running), list(finished), now)
    return out


def submit(state: ClusterState, job_id: int, **spec: object) -> Job:
    job = Job(
        job_id=job_id,
        spec=JobSpec(name="t", command=("true",), **spec),  # type: ignore[arg-type]
        user="alice",
        uid=1000,
        gid=1000,
        account="default",
        partition="main",
        time_limit_s=60,
        submit_time=0.0,
    )
    state.add_jobs([job])
    return job


def two_node_alloc() -> Allocation:
    return Allocation((NodeAllocation("n1", (0, 1)), NodeAllocation("n2", (0, 1))))


def ok(job_id: int, attempt: int = 0, ranks: int = 2) -> NodeResult:
    return NodeResult(job_id, attempt, tuple(RankOutcome(r, 0) for r in range(ranks)))


def test_gang_runs_then_completes_and_frees_gpus(db: str) -> None:
    state = new_state(db)
    connect(state, "n1", "n2")
    submit(state, 1, nodes=2, gpus_per_node=2)
    out = state.start_attempts([(1, two_node_alloc())], now=1.0)
    assert [(type(i), i.node) for i in out] == [(Launch, "n1"), (Launch, "n2")]
    assert state.jobs[1].state == JobState.CONFIGURING
    state.node_started("n1", 1, 0)
    assert state.jobs[1].state == JobState.CONFIGURING  # not until every node has started
    state.node_started("n2", 1, 0)
    assert state.jobs[1].state == JobState.RUNNING
    assert state.free_gpus(state.nodes["n1"]) == frozenset(range(2, 8))
    # n1's end changes nothing in the store while n2 runs: its result is not acknowledged yet (the agent keeps
    # it for a restarted controller), though its GPUs are free.
    assert state.node_finished("n1", ok(1), now=2.0) == []
    assert state.free_gpus(state.nodes["n1"]) == frozenset(range(8))
    assert state.jobs[1].state == JobState.RUNNING
    assert state.node_finished("n1", ok(1), now=2.5) == []  # reported again (a reconnect): still held
    assert state.node_finished("n2", ok(1), now=3.0) == [AckResult("n1", 1, 0), AckResult("n2", 1, 0)]
    assert state.jobs[1].state == JobState.COMPLETED and state.jobs[1].exit_code == 0
    # A restarted controller sees the same.
    again = new_state(db)
    assert again.jobs[1].state == JobState.COMPLETED
    assert again.jobs[1].attempts[0].end_time == 3.0


def test_a_gang_node_that_ended_first_is_reported_again_to_a_restarted_controller(db: str) -> None:
    """The controller restarts after one node of a gang has ended (its result held, not acknowledged): the
    agent reports the result again when it registers, and the gang goes on; it is not requeued as if that
    node's ranks had been lost (which is what a node running nothing and holding no result means)."""
    state = new_state(db)
    connect(state, "n1", "n2")
    submit(state, 1, nodes=2, gpus_per_node=2)
    state.start_attempts([(1, two_node_alloc())], now=1.0)
    state.node_started("n1", 1, 0)
    state.node_started("n2", 1, 0)
    assert state.node_finished("n1", ok(1), now=2.0) == []
    again = new_state(db)
    assert connect(again, "n1", finished=[ok(1)], now=4.0) == []
    assert not [i for i in connect(again, "n2", running=[(1, 0)], now=4.0) if isinstance(i, SignalAttempt)]
    assert again.jobs[1].state == JobState.RUNNING and again.jobs[1].restart_count == 0
    assert again.node_finished("n2", ok(1), now=5.0) == [AckResult("n1", 1, 0), AckResult("n2", 1, 0)]
    assert again.jobs[1].state == JobState.COMPLETED and again.jobs[1].restart_count == 0


def test_one_failing_rank_stops_the_gang(db: str) -> None:
    state = new_state(db)
    connect(state, "n1", "n2")
    submit(state, 1, nodes=2, gpus_per_node=2, requeue=False)
    state.start_attempts([(1, two_node_alloc())], now=1.0)
    failed = NodeResult(1, 0, (RankOutcome(0, 0), RankOutcome(1, 3)))
    out = state.node_finished("n1", failed, now=2.0)
    assert SignalAttempt("n2", 1, 0, "terminate") in out
    assert state.jobs[1].state == JobState.COMPLETING
    state.node_finished("n2", NodeResult(1, 0, (RankOutcome(2, 143), RankOutcome(3, 143))), now=3.0)
    job = state.jobs[1]
    assert job.state == JobState.FAILED and job.exit_code == 3 and "rank 1 exited with 3" in job.reason


def test_a_launch_refused_by_a_node_fails_the_job_with_the_nodes_reason(db: str) -> None:
    state = new_state(db)
    connect(state, "n1", "n2")
    submit(state, 1, nodes=2, gpus_per_node=2)  # requeue on (the default): a refusal is not worth a retry
    state.start_attempts([(1, two_node_alloc())], now=1.0)
    why = "user alice is uid 1001 on this node but submitted as uid 1000: user ids must be the same on every node"
    out = state.node_finished("n2", NodeResult(1, 0, (), error=why), now=2.0)
    assert SignalAttempt("n1", 1, 0, "terminate") in out
    state.node_finished("n1", NodeResult(1, 0, (RankOutcome(0, 143), RankOutcome(1, 143))), now=3.0)
    job = state.jobs[1]
    assert job.state == JobState.FAILED and why in job.reason
    assert len(job.attempts) == 1


def test_cancel_pending_and_running(db: str) -> None:
    state = new_state(db)
    connect(state, "n1", "n2")
    submit(state, 1, gpus=1)
    submit(state, 2, nodes=2, gpus_per_node=2)
    state.start_attempts([(2, two_node_alloc())], now=1.0)
    cancelled, out = state.cancel([1, 2], now=2.0)
    assert cancelled == [1, 2]
    assert state.jobs[1].state == JobState.CANCELLED
    assert {i.node for i in out if isinstance(i, SignalAttempt)} == {"n1", "n2"}
    # The controller crashes here and restarts: it still knows job 2 is being cancelled.
    state = new_state(db, now=3.0)
    out = connect(state, "n1", "n2", running=[(2, 0)], now=3.0)
    assert SignalAttempt("n1", 2, 0, "terminate") in out
    state.node_finished("n1", ok(2), now=4.0)
    state.node_finished("n2", ok(2), now=4.0)
    assert state.jobs[2].state == JobState.CANCELLED


def test_time_limit(db: str) -> None:
    state = new_state(db)
    connect(state, "n1")
    submit(state, 1, gpus=1)
    state.start_attempts([(1, Allocation((NodeAllocation("n1", (0,)),)))], now=0.0)
    assert state.expire_time_limits(now=59.0) == []
    assert state.expire_time_limits(now=60.0) == [SignalAttempt("n1", 1, 0, "terminate")]
    state.node_finished("n1", NodeResult(1, 0, (RankOutcome(0, 143),)), now=61.0)
    assert state.jobs[1].state == JobState.TIMEOUT


def test_node_down_requeues_and_stale_ranks_are_killed_on_return(db: str) -> None:
    state = new_state(db)
    connect(state, "n1", "n2")
    submit(state, 1, nodes=2, gpus_per_node=2)
    state.start_attempts([(1, two_node_alloc())], now=1.0)
    state.node_started("n1", 1, 0)
    state.node_started("n2", 1, 0)
    state.heartbeat("n1", now=20.0)
    out = state.expire_heartbeats(now=20.0)  # n2 silent since 0
    assert state.nodes["n2"].state == NodeState.DOWN
    # The healthy node's ranks get SIGTERM and the kill wait, not an outright SIGKILL.
    assert SignalAttempt("n1", 1, 0, "terminate") in out
    assert SignalAttempt("n1", 1, 0, "kill") not in out
    job = state.jobs[1]
    assert job.state == JobState.COMPLETING  # n1's ranks are still being stopped
    state.node_finished("n1", NodeResult(1, 0, (RankOutcome(0, 137), RankOutcome(1, 137))), now=21.0)
    job = state.jobs[1]
    assert job.state == JobState.PENDING and job.attempts[0].state == JobState.NODE_FAIL
    # The job restarts (attempt 1) on n1 while n2 is away.
    state.start_attempts([(1, Allocation((NodeAllocation("n1", (0, 1, 2, 3)),)))], now=22.0)
    assert state.jobs[1].restart_count == 1
    # n2 comes back still running attempt 0: it is told to kill it, and its GPUs stay busy until then.
    out = connect(state, "n2", running=[(1, 0)], now=23.0)
    assert SignalAttempt("n2", 1, 0, "kill") in out
    assert state.free_gpus(state.nodes["n2"]) == frozenset(range(2, 8))
    state.node_finished("n2", NodeResult(1, 0, (RankOutcome(2, 137),)), now=24.0)
    assert state.free_gpus(state.nodes["n2"]) == frozenset(range(8))
    assert state.jobs[1].state == JobState.CONFIGURING  # the new attempt is unaffected


def test_launch_is_resent_when_controller_crashed_before_sending(db: str) -> None:
    state = new_state(db)
    connect(state, "n1")
    submit(state, 1, gpus=1)
    state.start_attempts([(1, Allocation((NodeAllocation("n1", (0,)),)))], now=1.0)
    # Crash: the launch never left. The restarted controller re-sends it when the agent registers.
    state = new_state(db, now=2.0)
    out = connect(state, "n1", now=2.0)
    assert any(isinstance(i, Launch) and i.job.job_id == 1 for i in out)


def test_results_reported_on_reconnect_finish_the_job_exactly_once(db: str) -> None:
    state = new_state(db)
    connect(state, "n1")
    submit(state, 1, gpus=1)
    state.start_attempts([(1, Allocation((NodeAllocation("n1", (0,)),)))], now=1.0)
    state.node_started("n1", 1, 0)
    state = new_state(db, now=5.0)
    out = connect(state, "n1", finished=[NodeResult(1, 0, (RankOutcome(0, 0),))], now=5.0)
    assert AckResult("n1", 1, 0) in out and state.jobs[1].state == JobState.COMPLETED
    # The same result again (the ack was lost): acknowledged, nothing changes.
    out = connect(state, "n1", finished=[NodeResult(1, 0, (RankOutcome(0, 0),))], now=6.0)
    assert out == [AckResult("n1", 1, 0)]
    assert len(state.jobs[1].attempts) == 1


def test_single_launch_ends_when_the_script_ends(db: str) -> None:
    state = new_state(db)
    connect(state, "n1", "n2")
    submit(state, 1, nodes=2, gpus_per_node=2, launch=LaunchMode.SINGLE)
    state.start_attempts([(1, two_node_alloc())], now=1.0)
    out = state.node_finished("n1", ok(1, ranks=1), now=2.0)
    assert SignalAttempt("n2", 1, 0, "terminate") in out
    state.node_finished("n2", NodeResult(1, 0, ()), now=2.5)
    assert state.jobs[1].state == JobState.COMPLETED


def test_stale_plan_is_rechecked(db: str) -> None:
    state = new_state(db)
    connect(state, "n1")
    submit(state, 1, gpus=1)
    submit(state, 2, gpus=1)
    alloc = Allocation((NodeAllocation("n1", (0,)),))
    state.start_attempts([(1, alloc)], now=1.0)
    assert state.start_attempts([(2, alloc)], now=1.0) == []  # GPU 0 is taken: that part of the plan is dropped
    assert state.jobs[2].state == JobState.PENDING


def test_preempted_job_is_warned_then_terminated_then_requeued_even_on_exit_0(db: str) -> None:
    state = new_state(db)
    connect(state, "n1")
    submit(state, 1, gpus=2)
    state.start_attempts([(1, Allocation((NodeAllocation("n1", (0, 1)),)))], now=1.0)
    state.node_started("n1", 1, 0)
    out = state.preempt(1, grace_s=30.0, signum=10, now=5.0)
    assert out == [SignalAttempt("n1", 1, 0, "signal", 10)]
    assert state.jobs[1].state == JobState.COMPLETING
    assert state.expire_time_limits(now=34.0) == []
    assert state.expire_time_limits(now=35.0) == [SignalAttempt("n1", 1, 0, "terminate")]
    state.node_finished("n1", ok(1), now=36.0)  # it checkpointed and exited 0
    job = state.jobs[1]
    assert job.state == JobState.PENDING and job.attempts[0].state == JobState.PREEMPTED
    assert state.free_gpus(state.nodes["n1"]) == frozenset(range(8))
    state.start_attempts([(1, Allocation((NodeAllocation("n1", (0, 1)),)))], now=37.0)
    assert state.jobs[1].restart_count == 1 and len(state.jobs[1].attempts) == 2


def test_signal_warning_before_time_limit(db: str) -> None:
    state = new_state(db)
    connect(state, "n1")
    submit(state, 1, gpus=1, signal="USR1@20")
    state.start_attempts([(1, Allocation((NodeAllocation("n1", (0,)),)))], now=0.0)
    assert state.expire_time_limits(now=39.0) == []
    assert state.expire_time_limits(now=40.0) == [SignalAttempt("n1", 1, 0, "signal", 10)]
    assert state.expire_time_limits(now=41.0) == []  # once
    assert state.expire_time_limits(now=60.0) == [SignalAttempt("n1", 1, 0, "terminate")]


def test_launch_failure_requeues_and_rank_failure_restarts_up_to_max(db: str) -> None:
    state = new_state(db)
    connect(state, "n1", "n2")
    submit(state, 1, nodes=2, gpus_per_node=2, max_restarts=1)
    state.start_attempts([(1, two_node_alloc())], now=1.0)
    out = state.node_finished("n1", NodeResult(1, 0, (), "launch failed: MASTER_PORT 2 is in use", launch_failed=True),
                              now=2.0)
    assert SignalAttempt("n2", 1, 0, "terminate") in out
    state.node_finished("n2", ok(1), now=3.0)
    assert state.jobs[1].state == JobState.PENDING
    # Attempt 1: a rank fails; --max-restarts 1 allows one restart.
    state.start_attempts([(1, two_node_alloc())], now=4.0)
    state.node_finished("n1", NodeResult(1, 1, (RankOutcome(0, 1, "boom"), RankOutcome(1, 0))), now=5.0)
    state.node_finished("n2", ok(1, attempt=1), now=5.5)
    assert state.jobs[1].state == JobState.PENDING
    state.start_attempts([(1, two_node_alloc())], now=6.0)
    state.node_finished("n1", NodeResult(1, 2, (RankOutcome(0, 1, "boom again"), RankOutcome(1, 0))), now=7.0)
    state.node_finished("n2", ok(1, attempt=2), now=7.5)
    job = state.jobs[1]
    assert job.state == JobState.FAILED and job.exit_code == 1 and "rank 0 exited with 1: boom again" in job.reason
    assert [a.state for a in job.attempts] == [JobState.FAILED, JobState.FAILED, JobState.FAILED]
    assert [a.launch_failed for a in job.attempts] == [True, False, False]  # typed, and stored
    assert [a.launch_failed for a in new_state(db).jobs[1].attempts] == [True, False, False]


def test_a_node_reporting_out_of_memory_stops_the_gang_and_the_usage_is_stored(db: str) -> None:
    state = new_state(db)
    connect(state, "n1", "n2")
    submit(state, 1, nodes=2, gpus_per_node=2, requeue=True, max_restarts=3)
    state.start_attempts([(1, two_node_alloc())], now=1.0)
    state.node_started("n1", 1, 0)
    state.node_started("n2", 1, 0)
    state.running_usage("n1", 1, 0, AttemptUsage(max_rss_bytes=100, cpu_time_s=1.0))
    assert state.running_usage_of(1, 0) == AttemptUsage(max_rss_bytes=100, cpu_time_s=1.0)
    # The kernel killed a rank at its memory limit on n1 (exit 137), whatever the other rank there did.
    oom = NodeResult(1, 0, (RankOutcome(0, 137), RankOutcome(1, 0)),
                     usage=AttemptUsage(max_rss_bytes=2 << 30, cpu_time_s=10.0, oom_kills=1), out_of_memory=True)
    out = state.node_finished("n1", oom, now=2.0)
    assert SignalAttempt("n2", 1, 0, "terminate") in out
    assert state.jobs[1].state == JobState.COMPLETING
    state.node_finished("n2", NodeResult(1, 0, (RankOutcome(2, 143), RankOutcome(3, 143)),
                                         usage=AttemptUsage(max_rss_bytes=1 << 30, cpu_time_s=5.0)), now=3.0)
    job = state.jobs[1]
    # As in Slurm: OUT_OF_MEMORY, not requeued nor restarted, with the reason where gjob shows it.
    assert job.state == JobState.OUT_OF_MEMORY and job.state.is_terminal
    assert job.reason == "out of memory: the memory limit (--mem) killed 1 process on n1"
    expected = AttemptUsage(max_rss_bytes=2 << 30, cpu_time_s=15.0, oom_kills=1)
    assert job.attempts[0].usage == expected and job.attempts[0].state == JobState.OUT_OF_MEMORY
    again = new_state(db)  # stored, not only in memory
    assert again.jobs[1].state == JobState.OUT_OF_MEMORY and again.jobs[1].attempts[0].usage == expected
def test_a_node_declared_down_whose_stream_stays_open_is_asked_to_register_again(db: str) -> None:
    """Issue 20: an agent stalled past the heartbeat timeout (a job's FIFO once blocked its event loop) kept
    its stream open, and its heartbeats never brought the node back. They say it must register again (the
    engine then ends the stream and the registration reconciles)."""
    state = new_state(db)
    connect(state, "n1")
    assert state.heartbeat("n1", now=5.0) is False
    state.expire_heartbeats(now=40.0)
    assert state.nodes["n1"].state == NodeState.DOWN
    assert state.heartbeat("n1", now=41.0) is True
    connect(state, "n1", now=42.0)
    assert state.nodes["n1"].state == NodeState.UP
    assert state.heartbeat("n1", now=43.0) is False


def test_failed_launches_back_off_and_end_failed_after_the_cap(db: str) -> None:
    """Issue 20: a launch failing on a taken MASTER_PORT was retried at once, for ever. Each failure now
    puts the next attempt off (1, 2, 4... s as a begin time), and the fifth in a row ends the job FAILED
    with the reason; it survives a restart of the controller (the attempts' launch_failed is stored)."""
    state = new_state(db)
    connect(state, "n1")
    submit(state, 1, gpus=2)
    now = 0.0
    for attempt in range(5):
        state.start_attempts([(1, Allocation((NodeAllocation("n1", (0, 1)),)))], now=now)
        error = f"launch failed: MASTER_PORT 2000{attempt} is in use on this node"
        state.node_finished("n1", NodeResult(1, attempt, (), error, launch_failed=True), now=now)
        job = state.jobs[1]
        if attempt < 4:
            assert job.state == JobState.PENDING
            assert job.spec.begin_time == now + 2.0 ** attempt, (attempt, job.spec.begin_time)
            now = job.spec.begin_time
            state = new_state(db, now=now)  # durable: a restarted controller backs off the same
            connect(state, "n1", now=now)
    assert job.state == JobState.FAILED
    assert job.reason == "5 launches failed in a row, the last: launch failed: MASTER_PORT 20004 is in use on this node"
    assert len(job.attempts) == 5
