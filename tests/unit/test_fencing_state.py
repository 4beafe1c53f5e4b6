"""Fencing and the start barrier in the controller's state, driven by events on a real SQLite store: a silent
node is DOWN after the heartbeat timeout but its attempts are released only after the fence delay (lease,
check interval, kill wait, margin); what it reports when it returns before then counts; a gang starts only
once every node has launched."""

from __future__ import annotations

from pathlib import Path

import pytest

from garrison.controller.instructions import EndSession, ReleaseGang
from garrison.controller.state import AckResult, ClusterState, SignalAttempt
from garrison.controller.store import open_store
from garrison.model.domain import (
    Allocation,
    Gpu,
    Job,
    JobSpec,
    JobState,
    NodeAllocation,
    NodeInventory,
    NodeResult,
    NodeState,
    RankOutcome,
)

TIMEOUT_S = 10.0
FENCE_S = 25.0


def inventory(name: str) -> NodeInventory:
    gpus = tuple(Gpu(i, f"GPU-{name}-{i}", "NVIDIA A100", 40960, f"0000:{i:02x}:00.0", 0, "0-1") for i in range(4))
    return NodeInventory(hostname=name, gpus=gpus, nvlink=(), topo=(), cpus=2, memory_mb=1024)


@pytest.fixture
def state(tmp_path: Path) -> ClusterState:
    cluster = ClusterState(open_store(f"sqlite:///{tmp_path / 'c.db'}"), TIMEOUT_S, fence_delay_s=FENCE_S)
    cluster.load(0.0, retention_s=1e9)
    for name in ("n1", "n2"):
        cluster.register_node(name, inventory(name), frozenset({"main"}), [], [], 0.0)
    return cluster


def submit(state: ClusterState, job_id: int, allocation: Allocation, **spec: object) -> None:
    job = Job(job_id=job_id, spec=JobSpec(name="t", command=("true",), **spec),  # type: ignore[arg-type]
              user="alice", uid=1000, gid=1000, account="default", partition="main", time_limit_s=600,
              submit_time=0.0)
    state.add_jobs([job])
    state.start_attempts([(job_id, allocation)], now=1.0)


GANG = Allocation((NodeAllocation("n1", (0, 1)), NodeAllocation("n2", (0, 1))))
ONE = Allocation((NodeAllocation("n2", (0,)),))


def ok(job_id: int, attempt: int = 0) -> NodeResult:
    return NodeResult(job_id, attempt, (RankOutcome(0, 0),))


def test_a_silent_node_is_down_at_the_timeout_but_its_jobs_move_on_only_after_the_fence_delay(
    state: ClusterState,
) -> None:
    submit(state, 1, GANG, nodes=2, gpus_per_node=2)
    state.node_started("n1", 1, 0)
    state.node_started("n2", 1, 0)
    state.heartbeat("n1", now=FENCE_S)
    out = state.expire_heartbeats(now=TIMEOUT_S + 1)  # n2 silent since 0
    assert state.nodes["n2"].state == NodeState.DOWN and out == [EndSession("n2", "missed heartbeats")]
    assert state.jobs[1].state == JobState.RUNNING  # its ranks may still run: not requeued yet
    assert state.free_gpus(state.nodes["n2"]) == frozenset({2, 3})
    assert state.expire_heartbeats(now=FENCE_S - 0.1) == []
    out = state.expire_heartbeats(now=FENCE_S)
    # Now n2's supervisors have stopped their ranks; n1's healthy ranks get SIGTERM and the kill wait.
    assert out == [SignalAttempt("n1", 1, 0, "terminate")]
    assert state.jobs[1].state == JobState.COMPLETING
    state.node_finished("n1", NodeResult(1, 0, (RankOutcome(0, 143),)), now=FENCE_S + 1)
    job = state.jobs[1]
    assert job.state == JobState.PENDING and job.attempts[0].state == JobState.NODE_FAIL
    assert job.reason == "Requeued: node n2 not responding"
    assert state.expire_heartbeats(now=FENCE_S + 2) == []  # handled once


def test_a_node_back_before_the_fence_delay_goes_on_and_its_results_count(state: ClusterState) -> None:
    submit(state, 1, ONE, gpus=1)
    submit(state, 2, Allocation((NodeAllocation("n2", (1,)),)), gpus=1)
    for job_id in (1, 2):
        state.node_started("n2", job_id, 0)
    state.expire_heartbeats(now=TIMEOUT_S + 1)
    assert state.nodes["n2"].state == NodeState.DOWN
    # Back (as after a freeze, or an agent restart): job 1 still runs there, job 2 ended while it was away.
    out = state.register_node("n2", inventory("n2"), frozenset({"main"}), [(1, 0)], [ok(2)], TIMEOUT_S + 5)
    assert state.nodes["n2"].state == NodeState.UP
    assert AckResult("n2", 2, 0) in out and not any(isinstance(i, SignalAttempt) for i in out)
    assert state.jobs[1].state == JobState.RUNNING
    assert state.jobs[2].state == JobState.COMPLETED and state.jobs[2].restart_count == 0
    state.heartbeat("n2", now=FENCE_S)
    assert state.expire_heartbeats(now=FENCE_S + 1) == []  # heard from again: nothing to fence


def test_the_fence_delay_counts_from_a_restarted_controllers_start(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'c.db'}"
    first = ClusterState(open_store(db), TIMEOUT_S, fence_delay_s=FENCE_S)
    first.load(0.0, retention_s=1e9)
    first.register_node("n2", inventory("n2"), frozenset({"main"}), [], [], 0.0)
    submit(first, 1, ONE, gpus=1)
    first.node_started("n2", 1, 0)
    # The controller restarts at 100: it cannot know when it last granted n2 a lease, so it waits in full.
    restarted = ClusterState(open_store(db), TIMEOUT_S, fence_delay_s=FENCE_S)
    restarted.load(100.0, retention_s=1e9)
    restarted.expire_heartbeats(now=100.0 + TIMEOUT_S)
    assert restarted.jobs[1].state == JobState.RUNNING
    restarted.expire_heartbeats(now=100.0 + FENCE_S)
    assert restarted.jobs[1].state == JobState.PENDING


def test_ranks_stopped_by_their_lease_are_the_nodes_failure_not_the_jobs(state: ClusterState) -> None:
    submit(state, 1, GANG, nodes=2, gpus_per_node=2, max_restarts=0)
    state.node_started("n1", 1, 0)
    state.node_started("n2", 1, 0)
    fenced = NodeResult(1, 0, (RankOutcome(0, 143),), lease_expired=True)
    out = state.node_finished("n2", fenced, now=5.0)
    assert SignalAttempt("n1", 1, 0, "terminate") in out
    state.node_finished("n1", NodeResult(1, 0, (RankOutcome(0, 143),)), now=6.0)
    job = state.jobs[1]
    assert job.state == JobState.PENDING and job.attempts[0].state == JobState.NODE_FAIL
    assert job.reason == "Requeued: node n2 lease expired"


def test_an_attempt_whose_supervisor_died_is_requeued_until_it_keeps_happening(state: ClusterState) -> None:
    """A supervisor killed or crashed (slurmstepd's part) took its ranks with it: the node's failure, requeued
    as NODE_FAIL; the fifth time in a row the job ends FAILED rather than loop; without --requeue, NODE_FAIL."""
    submit(state, 1, ONE, gpus=1)
    for attempt in range(5):
        if attempt:
            state.start_attempts([(1, ONE)], now=10.0 * attempt)
        state.node_started("n2", 1, attempt)
        lost = NodeResult(1, attempt, (), error="supervisor died: killed", supervisor_lost=True)
        state.node_finished("n2", lost, now=10.0 * attempt + 5)
        job = state.jobs[1]
        if attempt < 4:
            assert job.attempts[attempt].state == JobState.NODE_FAIL
            assert job.state == JobState.PENDING and "supervisor died" in job.reason, job.reason
    assert job.state == JobState.FAILED and job.reason.startswith("5 attempts in a row lost their supervisor")
    submit(state, 2, ONE, gpus=1, requeue=False)
    state.node_started("n2", 2, 0)
    state.node_finished("n2", NodeResult(2, 0, (), error="supervisor died", supervisor_lost=True), now=70.0)
    assert state.jobs[2].state == JobState.NODE_FAIL


def test_a_gang_is_released_once_every_node_has_launched(state: ClusterState) -> None:
    submit(state, 1, GANG, nodes=2, gpus_per_node=2)
    assert state.node_started("n2", 1, 0) == []
    assert state.node_started("n1", 1, 0) == [ReleaseGang("n1", 1, 0), ReleaseGang("n2", 1, 0)]
    assert state.jobs[1].state == JobState.RUNNING
    # A node reporting the attempt again (its agent reconnected) is released again, alone.
    out = state.register_node("n2", inventory("n2"), frozenset({"main"}), [(1, 0)], [], 2.0)
    assert out == [ReleaseGang("n2", 1, 0)]


def test_a_one_node_job_has_no_barrier_and_a_gang_being_stopped_is_not_released(state: ClusterState) -> None:
    submit(state, 1, ONE, gpus=1)
    assert state.node_started("n2", 1, 0) == []
    submit(state, 2, Allocation((NodeAllocation("n1", (2,)), NodeAllocation("n2", (2,)))), nodes=2,
           gpus_per_node=1)
    state.node_finished("n1", NodeResult(2, 0, (), error="launch failed: MASTER_PORT 1 is in use"), now=2.0)
    assert state.node_started("n2", 2, 0) == []


# -- the engine: grants on the node's current stream, a silent node's stream closed, the barrier flag ----


class KeptLink:
    """The simplest AgentLink: it keeps what the engine hands it, as the real session would send it."""

    def __init__(self, node: str) -> None:
        self.node, self.address = node, "10.0.0.1"
        self.sent: list[object] = []
        self.closed = False

    def send(self, instruction: object) -> None:
        self.sent.append(instruction)

    def close(self) -> None:
        self.closed = True


def test_the_engine_grants_leases_to_the_current_stream_and_closes_a_silent_nodes(tmp_path: Path) -> None:
    from garrison.config import ControllerConfig
    from garrison.controller.clock import ManualClock
    from garrison.controller.commands import LeaseGrant, Registration, StillAlive, Welcome
    from garrison.controller.engine import Engine

    config = ControllerConfig(database=f"sqlite:///{tmp_path / 'e.db'}", state_dir=str(tmp_path), node_lease_s=45.0)
    clock = ManualClock(1000.0)
    cluster = ClusterState(open_store(config.database), config.heartbeat_timeout_s, fence_delay_s=60.0)
    cluster.load(clock.now(), 1e9)
    engine = Engine(config, cluster, clock)
    links = {name: KeptLink(name) for name in ("n1", "n2")}
    for name, link in links.items():
        engine.agent_connected(link, Registration(name, link.address, inventory(name), lease_request=5))
    assert links["n1"].sent[:2] == [Welcome(config.heartbeat_interval_s), LeaseGrant(5, 45.0)]
    engine.agent_message(links["n1"], StillAlive(lease_request=6))
    engine.agent_message(links["n1"], StillAlive())
    assert [i for i in links["n1"].sent if isinstance(i, LeaseGrant)] == [LeaseGrant(5, 45.0), LeaseGrant(6, 45.0)]
    # A replaced stream is not answered: only the node's current stream renews its lease.
    stale = KeptLink("n1")
    engine.agent_message(stale, StillAlive(lease_request=7))
    assert stale.sent == []
    # The gang's launches carry the barrier; a one-node job's do not.
    submit(cluster, 1, GANG, nodes=2, gpus_per_node=2)
    submit(cluster, 2, Allocation((NodeAllocation("n1", (3,)),)), gpus=1)
    engine.execute([])
    from garrison.controller.instructions import Launch

    assert engine.launch_description(Launch("n2", cluster.jobs[1], 0)).start_barrier
    assert not engine.launch_description(Launch("n1", cluster.jobs[2], 0)).start_barrier
    # n2 falls silent: DOWN at the timeout, and its stream is closed so that a frozen agent re-registers.
    clock.advance(config.heartbeat_timeout_s + 1)
    cluster.heartbeat("n1", clock.now())
    engine.execute(cluster.expire_heartbeats(clock.now()))
    assert links["n2"].closed and not links["n1"].closed
    # What the closed stream still delivers (a thawed agent's heartbeat) renews nothing.
    before = len(links["n2"].sent)
    engine.agent_message(links["n2"], StillAlive(lease_request=9))
    assert len(links["n2"].sent) == before and cluster.nodes["n2"].state == NodeState.DOWN
