"""Fewer store transactions per job (issue 23): the agents' reports of one turn of the event loop are
written in one transaction (group commit), and a submission takes its job ids in its own transaction.
A real SQLite store, counted by its commits; made read-only for the outages (tests/helpers/broken_store.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from garrison.config import ControllerConfig
from garrison.controller.clock import ManualClock
from garrison.controller.commands import AttemptFinished, AttemptStarted, Registration, SubmitCommand
from garrison.controller.engine import Engine
from garrison.controller.instructions import AckResult
from garrison.controller.state import ClusterState
from garrison.controller.store import StoreUnavailable, open_store
from garrison.model.domain import Allocation, JobSpec, JobState, NodeAllocation, Principal
from tests.helpers.broken_store import BreakableStore
from tests.unit.test_cluster_state import inventory, ok
from tests.unit.test_store_outage_engine import KeptLink

ALICE = Principal("alice", 1000, 1000, (1000,))
SPEC = JobSpec(name="t", command=("true",), workdir="/", gpus=1)


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        self.config = ControllerConfig(database=f"sqlite:///{tmp_path / 'c.db'}", state_dir=str(tmp_path))
        self.db = BreakableStore(self.config.database)
        self.clock = ManualClock(1000.0)
        self.state = ClusterState(self.db.store, self.config.heartbeat_timeout_s)
        self.state.load(self.clock.now(), self.config.finished_job_retention_s)
        self.engine = Engine(self.config, self.state, self.clock)
        self.links = {name: KeptLink(name) for name in ("n1", "n2")}
        for link in self.links.values():
            self.engine.agent_connected(link, Registration(link.node, link.address, inventory(link.node, gpus=2)))
        self.commits = 0
        event.listen(self.db.store.engine, "commit", self._committed)

    def _committed(self, _connection: Any) -> None:
        self.commits += 1

    def commits_of(self, action: Callable[[], object]) -> int:
        before = self.commits
        action()
        return self.commits - before

    def running_job(self, node: str) -> int:
        job_id = self.engine.submit(ALICE, SubmitCommand(SPEC)).job_id
        self.engine.execute(self.state.start_attempts([(job_id, Allocation((NodeAllocation(node, (0,)),)))],
                                                      self.clock.now()))
        self.engine.agent_message(self.links[node], AttemptStarted(job_id, 0))
        assert self.state.jobs[job_id].state == JobState.RUNNING
        return job_id


async def next_turn() -> None:
    """Let the event loop run the callbacks scheduled so far (the group commit): sleep(0) puts this task
    behind them in the loop's ready queue."""
    await asyncio.sleep(0)


def test_the_reports_of_one_turn_are_written_in_one_transaction_and_acknowledged_after_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        rig = Rig(tmp_path)
        first, second = rig.running_job("n1"), rig.running_job("n2")
        third = rig.engine.submit(ALICE, SubmitCommand(SPEC)).job_id
        rig.engine.execute(rig.state.start_attempts([(third, Allocation((NodeAllocation("n1", (1,)),)))],
                                                    rig.clock.now()))
        before = rig.commits
        rig.engine.agent_message(rig.links["n1"], AttemptFinished(ok(first, ranks=1)), grouped=True)
        rig.engine.agent_message(rig.links["n2"], AttemptFinished(ok(second, ranks=1)), grouped=True)
        rig.engine.agent_message(rig.links["n1"], AttemptStarted(third, 0), grouped=True)
        # Nothing is applied, written or acknowledged before the turn ends.
        assert rig.commits == before and rig.links["n1"].acks() == [] and rig.links["n2"].acks() == []
        assert rig.state.jobs[first].state == JobState.RUNNING
        await next_turn()
        assert rig.commits == before + 1
        assert rig.links["n1"].acks() == [AckResult("n1", first, 0)]
        assert rig.links["n2"].acks() == [AckResult("n2", second, 0)]
        assert [rig.state.jobs[j].state for j in (first, second, third)] == [JobState.COMPLETED] * 2 + [JobState.RUNNING]
        # Durable: a store opened afresh reads what the one transaction wrote.
        stored = {job.job_id: job.state for job in open_store(rig.config.database).load().jobs}
        assert [stored[j] for j in (first, second, third)] == [JobState.COMPLETED] * 2 + [JobState.RUNNING]

    asyncio.run(scenario())


def test_a_group_the_store_refuses_waits_in_order_and_is_acknowledged_once_durable(tmp_path: Path) -> None:
    async def scenario() -> None:
        rig = Rig(tmp_path)
        first, second = rig.running_job("n1"), rig.running_job("n2")
        rig.db.break_()
        rig.engine.agent_message(rig.links["n1"], AttemptFinished(ok(first, ranks=1)), grouped=True)
        rig.engine.agent_message(rig.links["n2"], AttemptFinished(ok(second, ranks=1)), grouped=True)
        await next_turn()
        assert rig.links["n1"].acks() == [] and rig.links["n2"].acks() == []
        assert rig.state.jobs[first].state == JobState.RUNNING and rig.state.ledger.held_gpu_count() == 2
        assert len(rig.engine.backlog) == 2
        # A later report of a waiting node queues behind the waiting one, not in a group of its own.
        rig.engine.agent_message(rig.links["n1"], AttemptStarted(first, 0), grouped=True)
        assert len(rig.engine.backlog) == 3
        rig.db.heal()
        rig.clock.advance(10.0)
        rig.engine.tick(rig.clock.now())
        assert rig.links["n1"].acks() == [AckResult("n1", first, 0)]
        assert rig.links["n2"].acks() == [AckResult("n2", second, 0)]
        assert rig.state.jobs[first].state == rig.state.jobs[second].state == JobState.COMPLETED
        assert len(rig.engine.backlog) == 0 and rig.state.ledger.held_gpu_count() == 0

    asyncio.run(scenario())


def test_reports_of_a_stream_are_applied_before_the_next_registration_of_its_node(tmp_path: Path) -> None:
    async def scenario() -> None:
        rig = Rig(tmp_path)
        job_id = rig.running_job("n1")
        rig.engine.agent_message(rig.links["n1"], AttemptFinished(ok(job_id, ranks=1)), grouped=True)
        again = KeptLink("n1")
        # Registering again (reporting the job still running, as an agent that lost the acknowledgement would
        # not): the group is applied first, so the registration sees the job ended.
        rig.engine.agent_connected(again, Registration("n1", again.address, inventory("n1", gpus=2)))
        assert rig.links["n1"].acks() == [AckResult("n1", job_id, 0)]
        assert rig.state.jobs[job_id].state == JobState.COMPLETED
        await next_turn()
        assert rig.state.jobs[job_id].state == JobState.COMPLETED

    asyncio.run(scenario())


def test_a_submission_takes_its_job_ids_in_its_own_transaction(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    submit = lambda: rig.engine.submit(ALICE, SubmitCommand(SPEC)).job_id  # noqa: E731
    # The first submission since the start reserves ids in a transaction of its own; later ones do not.
    assert rig.commits_of(submit) == 2
    assert rig.commits_of(submit) == 1
    array = rig.engine.submit(ALICE, SubmitCommand(SPEC, array_indices=(1, 2, 3)))
    assert (array.job_id, array.task_count) == (3, 3)
    assert open_store(rig.config.database).load().next_job_id == 6
    assert rig.engine.submit(ALICE, SubmitCommand(SPEC)).job_id == 6


def test_ids_taken_by_another_writer_or_lost_to_a_failed_write_are_never_handed_out_twice(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    assert rig.engine.submit(ALICE, SubmitCommand(SPEC)).job_id == 1
    # Another writer of the store (a second controller during an upgrade) takes the next ids.
    taken = open_store(rig.config.database).allocate_job_ids(2)
    assert taken == 2
    assert rig.engine.submit(ALICE, SubmitCommand(SPEC)).job_id == 4
    # A submission the store refuses changes nothing; the next one reads the counter again.
    rig.db.break_()
    with pytest.raises(StoreUnavailable):
        rig.engine.submit(ALICE, SubmitCommand(SPEC))
    rig.db.heal()
    assert rig.engine.submit(ALICE, SubmitCommand(SPEC)).job_id == 5
    assert sorted(rig.state.jobs) == [1, 4, 5]
    assert open_store(rig.config.database).load().next_job_id == 6
