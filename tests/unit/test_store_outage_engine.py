"""The engine while its database is down: agents' reports wait in order and are acknowledged only once
durable, registration needs no write, clients' changes are refused, and the RPC layer answers UNAVAILABLE
with one fixed line. A real SQLite store made read-only (tests/helpers/broken_store.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from garrison.cli.client import DATABASE_UNAVAILABLE
from garrison.config import ControllerConfig
from garrison.controller.clock import ManualClock
from garrison.controller.commands import (
    AttemptFinished,
    AttemptStarted,
    CancelCommand,
    JobFilter,
    Registration,
    SubmitCommand,
)
from garrison.controller.engine import Engine
from garrison.controller.instructions import AckResult
from garrison.controller.rpc.services import ERROR_CODES, mapped_errors
from garrison.controller.state import ClusterState
from garrison.controller.store import StoreUnavailable
from garrison.model.domain import Allocation, JobSpec, JobState, NodeAllocation, Principal
from tests.helpers.broken_store import BreakableStore
from tests.unit.test_cluster_state import inventory, ok

ALICE = Principal("alice", 1000, 1000, (1000,))


class KeptLink:
    """The simplest AgentLink: it keeps what the engine hands it, as a session puts it on the stream."""

    def __init__(self, node: str) -> None:
        self.node, self.address, self.closed = node, "10.0.0.1", False
        self.sent: list[Any] = []

    def send(self, instruction: Any) -> None:
        self.sent.append(instruction)

    def close(self) -> None:
        self.closed = True

    def acks(self) -> list[AckResult]:
        return [i for i in self.sent if isinstance(i, AckResult)]


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        self.config = ControllerConfig(database=f"sqlite:///{tmp_path / 'c.db'}", state_dir=str(tmp_path))
        self.db = BreakableStore(self.config.database)
        self.clock = ManualClock(1000.0)
        self.state = ClusterState(self.db.store, self.config.heartbeat_timeout_s)
        self.state.load(self.clock.now(), self.config.finished_job_retention_s)
        self.engine = Engine(self.config, self.state, self.clock)
        self.link = KeptLink("n1")

    def register(self, link: KeptLink) -> None:
        self.engine.agent_connected(link, Registration(link.node, link.address, inventory(link.node, gpus=2)))

    def running_job(self) -> int:
        self.register(self.link)
        job_id = self.engine.submit(ALICE, SubmitCommand(JobSpec(name="t", command=("true",), workdir="/", gpus=1))).job_id
        self.engine.execute(self.state.start_attempts([(job_id, Allocation((NodeAllocation("n1", (0,)),)))],
                                                      self.clock.now()))
        self.engine.agent_message(self.link, AttemptStarted(job_id, 0))
        assert self.state.jobs[job_id].state == JobState.RUNNING
        return job_id


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        yield Rig(tmp_path)
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def test_a_result_waits_for_the_database_and_is_acknowledged_once_durable(rig: Rig) -> None:
    job_id = rig.running_job()
    rig.db.break_()
    rig.engine.agent_message(rig.link, AttemptFinished(ok(job_id, ranks=1)))
    assert rig.link.acks() == []  # not durable: the agent keeps it
    assert rig.state.jobs[job_id].state == JobState.RUNNING and rig.state.ledger.held_gpu_count() == 1
    assert len(rig.engine.backlog) == 1
    # A later report of the node waits behind it, in order.
    rig.engine.agent_message(rig.link, AttemptStarted(job_id, 0))
    assert len(rig.engine.backlog) == 2
    rig.clock.advance(1.0)
    rig.engine.tick(rig.clock.now())  # still down: nothing changes, the stream stays open
    assert rig.link.acks() == [] and not rig.link.closed
    rig.db.heal()
    rig.clock.advance(10.0)
    rig.engine.tick(rig.clock.now())
    assert rig.link.acks() == [AckResult("n1", job_id, 0)]
    assert rig.state.jobs[job_id].state == JobState.COMPLETED and rig.state.ledger.held_gpu_count() == 0
    assert len(rig.engine.backlog) == 0


def test_reports_that_wait_past_store_retry_s_are_dropped_and_the_agent_asked_to_reconnect(rig: Rig) -> None:
    job_id = rig.running_job()
    rig.db.break_()
    rig.engine.agent_message(rig.link, AttemptFinished(ok(job_id, ranks=1)))
    rig.clock.advance(rig.config.store_retry_s + 1.0)
    rig.engine.tick(rig.clock.now())
    assert rig.link.closed and len(rig.engine.backlog) == 0
    assert rig.state.jobs[job_id].state == JobState.RUNNING  # nothing half done: it is reported again
    rig.db.heal()
    again = KeptLink("n1")
    rig.engine.agent_connected(again, Registration("n1", "10.0.0.1", inventory("n1", gpus=2),
                                                   finished=(ok(job_id, ranks=1),)))
    assert again.acks() == [AckResult("n1", job_id, 0)]
    assert rig.state.jobs[job_id].state == JobState.COMPLETED


def test_an_agent_registers_while_the_database_is_down(rig: Rig) -> None:
    rig.db.break_()
    rig.register(rig.link)
    assert "n1" in rig.state.connected and rig.state.unsaved_nodes == {"n1"}
    rig.db.heal()
    rig.engine.tick(rig.clock.now())
    assert rig.state.unsaved_nodes == set()
    assert [n.name for n in rig.db.store.load().nodes] == ["n1"]


def test_clients_changes_are_refused_and_change_nothing(rig: Rig) -> None:
    job_id = rig.running_job()
    rig.db.break_()
    jobs_before = dict(rig.state.jobs)
    with pytest.raises(StoreUnavailable):
        rig.engine.submit(ALICE, SubmitCommand(JobSpec(name="t", command=("true",), workdir="/"), hold=True))
    with pytest.raises(StoreUnavailable):
        rig.engine.cancel(ALICE, CancelCommand(JobFilter(job_refs=(str(job_id),))))
    assert rig.state.jobs == jobs_before
    assert not any(getattr(i, "action", "") == "terminate" for i in rig.link.sent)  # no SIGTERM went out
    # Reads are served from memory.
    assert [j.job_id for j in rig.engine.list_jobs(JobFilter())] == [job_id]


def test_the_rpc_answer_is_unavailable_with_one_fixed_line(rig: Rig) -> None:
    assert ERROR_CODES[StoreUnavailable] == grpc.StatusCode.UNAVAILABLE
    assert DATABASE_UNAVAILABLE == StoreUnavailable.MESSAGE  # the CLI recognises the controller's answer

    class Aborted(Exception):
        pass

    class Context:
        code: grpc.StatusCode | None = None
        details = ""

        async def abort(self, code: grpc.StatusCode, details: str) -> None:
            self.code, self.details = code, details
            raise Aborted

        def peer(self) -> str:
            return "ipv4:127.0.0.1:1"

    class Servicer:
        @mapped_errors
        async def Submit(self, request: object, context: Any) -> None:
            rig.db.break_()
            rig.engine.submit(ALICE, SubmitCommand(JobSpec(name="t", command=("true",), workdir="/")))

    context = Context()
    with pytest.raises(Aborted):
        asyncio.get_event_loop().run_until_complete(Servicer().Submit(None, context))
    assert (context.code, context.details) == (grpc.StatusCode.UNAVAILABLE, "the database is unavailable, retry")


def test_the_backlog_retries_in_order_with_backoff_and_at_once_after_a_success() -> None:
    from garrison.controller.agent_backlog import FIRST_RETRY_S, MAX_RETRY_S, AgentBacklog

    down = [True]
    applied: list[str] = []
    tries: list[float] = []
    clock = [0.0]

    def report(name: str) -> Any:
        def apply() -> None:
            tries.append(clock[0])
            if down[0]:
                raise StoreUnavailable("connection refused")
            applied.append(name)
        return apply

    backlog = AgentBacklog(retry_for_s=60.0)
    assert not backlog.deliver("n1", report("a"), clock[0])
    assert not backlog.deliver("n1", report("b"), clock[0])  # behind "a", not even tried
    assert tries == [0.0]
    while clock[0] < 10.0:
        clock[0] = round(clock[0] + 0.05, 2)
        backlog.retry(clock[0])
    gaps = [round(b - a, 2) for a, b in zip(tries, tries[1:], strict=False)]
    assert gaps[0] >= FIRST_RETRY_S and all(later >= earlier for earlier, later in zip(gaps, gaps[1:], strict=False))
    assert max(gaps) <= MAX_RETRY_S + 0.05 and len(tries) < 12  # backing off, not polling every tick
    down[0] = False
    clock[0] += MAX_RETRY_S
    assert backlog.retry(clock[0]) == []
    assert applied == ["a", "b"] and len(backlog) == 0
    assert backlog.deliver("n1", report("c"), clock[0]) and applied == ["a", "b", "c"]  # applied at once again
