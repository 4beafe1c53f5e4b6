"""Several messages as one write on an agent's stream (garrison/wire/batching.py, AgentMessage.batch and
ControllerMessage.batch): only to a peer that said it reads them, and acted on exactly in their order.

Over real gRPC both ways: a real controller process with an agent that speaks the wire as an agent older than
batches does (it never sets Register.accepts_batches) and as a newer one; and a real Agent, launching real
supervisors, against a controller's side of the stream that answers as an older controller (a RegisterAck
without accepts_batches) or as a newer one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from helpers.polling import wait_until
from security_helpers import make_ca, running_controller

from garrison.cli.client import Client
from garrison.config import AgentConfig
from garrison.machines.description import read_machine
from garrison.machines.inventory import machine_inventory
from garrison.model.domain import Allocation, JobSpec, NodeAllocation, NodeInventory
from garrison.model.launch import LaunchDescription
from garrison.nodeagent.agent import CREDENTIAL_METADATA, START_REPORT_LINGER_S, Agent
from garrison.protos.v1 import garrison_pb2 as pb
from garrison.protos.v1 import garrison_pb2_grpc as pb_grpc
from garrison.tls import TlsFiles, server_credentials
from garrison.wire import convert
from garrison.wire.batching import MAX_BATCH_BYTES, MAX_BATCH_MESSAGES, take_batch

DEADLINE_S = 60.0


def ack(job_id: int) -> pb.ControllerMessage:
    return pb.ControllerMessage(ack=pb.AckResult(job_id=job_id, attempt=0))


def launch_with_script(job_id: int, script_bytes: int) -> pb.ControllerMessage:
    return pb.ControllerMessage(launch=pb.LaunchJob(job_id=job_id, spec=pb.JobSpec(script="x" * script_bytes)))


def expanded(message: pb.ControllerMessage | pb.AgentMessage) -> list:  # type: ignore[type-arg]
    return list(message.batch.messages) if message.WhichOneof("kind") == "batch" else [message]


# ----------------------------------------------------------------------------------- what one write takes


def test_a_write_takes_what_is_queued_in_order_up_to_the_bound() -> None:
    waiting: asyncio.Queue[pb.ControllerMessage | None] = asyncio.Queue()
    for job_id in range(1, 101):
        waiting.put_nowait(ack(job_id))
    first = waiting.get_nowait()
    assert first is not None
    messages, held, closed = take_batch(first, waiting)
    assert [m.ack.job_id for m in messages] == list(range(1, MAX_BATCH_MESSAGES + 1))
    assert held is None and not closed and waiting.qsize() == 100 - MAX_BATCH_MESSAGES


def test_a_message_with_nothing_behind_it_goes_alone() -> None:
    waiting: asyncio.Queue[pb.ControllerMessage | None] = asyncio.Queue()
    assert take_batch(ack(1), waiting) == ([ack(1)], None, False)


def test_a_message_that_would_make_the_write_too_big_starts_the_next_one() -> None:
    waiting: asyncio.Queue[pb.ControllerMessage | None] = asyncio.Queue()
    big, bigger, huge = (launch_with_script(j, n) for j, n in ((2, 600 << 10), (3, 600 << 10), (5, 3 << 20)))
    for message in (big, bigger, ack(4), huge, ack(6)):
        waiting.put_nowait(message)
    first, then, alone, last = ([ack(1), big], [bigger, ack(4)], [huge], [ack(6)])
    messages, held, _ = take_batch(ack(1), waiting)
    assert (messages, held) == (first, bigger)
    messages, held, _ = take_batch(bigger, waiting)
    assert (messages, held) == (then, huge)
    # On its own over the bound: it goes alone, as every message did before batches.
    messages, held, _ = take_batch(huge, waiting)
    assert (messages, held) == (alone, ack(6))
    assert take_batch(ack(6), waiting) == (last, None, False)
    assert sum(m.ByteSize() for m in first) <= MAX_BATCH_BYTES


def test_the_queues_end_ends_the_write_after_what_came_before_it() -> None:
    waiting: asyncio.Queue[pb.ControllerMessage | None] = asyncio.Queue()
    for message in (ack(2), ack(3), None, ack(4)):
        waiting.put_nowait(message)
    assert take_batch(ack(1), waiting) == ([ack(1), ack(2), ack(3)], None, True)


# ------------------------------------------------------- a real controller, and agents older and newer


class WireAgent:
    """An agent reduced to its side of the wire: it registers (saying that it reads batches, or, as an agent
    older than them, not), answers every launch at once with its start and a successful result (in one batch
    per message received when it reads batches, as a newer agent may), and keeps what the controller sent."""

    def __init__(self, address: str, credential: str, node: str, batches: bool) -> None:
        self.batches = batches
        inventory = machine_inventory(read_machine("dgx-a100"), node, cpus=64, memory_mb=512_000)
        self.outgoing: queue.Queue[pb.AgentMessage | None] = queue.Queue()
        self.outgoing.put(pb.AgentMessage(register=pb.Register(
            node_name=node, inventory=convert.inventory_to_pb(inventory), address="127.0.0.1",
            accepts_batches=batches)))
        self.channel = grpc.insecure_channel(address)
        self.call = pb_grpc.AgentLinkStub(self.channel).Connect(
            iter(self.outgoing.get, None), metadata=((CREDENTIAL_METADATA, credential),), timeout=DEADLINE_S * 2)
        self.received: list[pb.ControllerMessage] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            for message in self.call:
                self.received.append(message)
                replies = [reply for each in expanded(message) if each.WhichOneof("kind") == "launch"
                           for reply in self._run(each.launch)]
                if self.batches and replies:
                    self.outgoing.put(pb.AgentMessage(batch=pb.AgentMessages(messages=replies)))
                else:
                    for reply in replies:
                        self.outgoing.put(reply)
        except grpc.RpcError:
            pass  # cancelled at the test's end

    @staticmethod
    def _run(launch: pb.LaunchJob) -> list[pb.AgentMessage]:
        # The start before the result: a controller that took them out of order would not complete the job.
        return [pb.AgentMessage(started=pb.JobStarted(job_id=launch.job_id, attempt=launch.attempt)),
                pb.AgentMessage(finished=pb.JobResult(job_id=launch.job_id, attempt=launch.attempt,
                                                      ranks=[pb.RankResult(rank=0, exit_code=0)],
                                                      finished_at=time.time()))]

    def of_kind(self, kind: str) -> list[pb.ControllerMessage]:
        return [each for message in list(self.received) for each in expanded(message) if each.WhichOneof("kind") == kind]

    def close(self) -> None:
        self.call.cancel()
        self.outgoing.put(None)
        self.thread.join(DEADLINE_S)
        self.channel.close()


@pytest.fixture
def controller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator:  # type: ignore[type-arg]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with running_controller(tmp_path / "controller", extra="request_rate_per_s = 0\n") as running:
        yield running


def run_an_array(controller, batches: bool) -> WireAgent:  # type: ignore[no-untyped-def]
    """An array of 24 one-GPU tasks through one agent of 8 GPUs, to its end: every task COMPLETED."""
    agent = WireAgent(controller.address, controller.credential(), "wirenode", batches)
    try:
        wait_until(lambda: agent.of_kind("registered"), DEADLINE_S, what="the RegisterAck")
        with Client(controller.address) as client:
            spec = {"name": "wire", "command": ["true"], "gpus": 1, "workdir": "/tmp"}
            client.call_plain("SubmitJob", {"spec": spec, "array_indices": list(range(24))})
            wait_until(lambda: len({m.ack.job_id for m in agent.of_kind("ack")}) == 24, DEADLINE_S,
                       what="24 results acknowledged")
            launched = sorted(m.launch.job_id for m in agent.of_kind("launch"))
            jobs = client.call("ListJobs", pb.ListJobsRequest(job_ids=[str(j) for j in launched])).jobs
        assert len(launched) == 24 and sorted(m.ack.job_id for m in agent.of_kind("ack")) == launched
        assert [job.state for job in jobs] == ["COMPLETED"] * 24, jobs
        return agent
    finally:
        agent.close()


def test_an_agent_older_than_batches_is_sent_every_message_on_its_own(controller) -> None:  # type: ignore[no-untyped-def]
    agent = run_an_array(controller, batches=False)
    assert not [m for m in agent.received if m.WhichOneof("kind") == "batch"]
    assert agent.of_kind("registered")[0].registered.accepts_batches  # what a newer agent would go by


def test_an_agent_that_reads_batches_gets_a_cycles_launches_in_one_write(controller) -> None:  # type: ignore[no-untyped-def]
    agent = run_an_array(controller, batches=True)
    # The first cycle places eight tasks on the node at once (the agent's batched answers are acknowledged
    # in their turn); every message the controller sent is still in its order in what was received.
    batches = [m for m in agent.received if m.WhichOneof("kind") == "batch"]
    assert any(sum(each.WhichOneof("kind") == "launch" for each in m.batch.messages) >= 8 for m in batches), batches
    assert all(1 < len(m.batch.messages) <= MAX_BATCH_MESSAGES for m in batches)


# ------------------------------------------------- a real agent, and controllers older and newer


def trivial_launch(job_id: int, command: tuple[str, ...] = ("true",)) -> pb.ControllerMessage:
    me = pwd.getpwuid(os.getuid())
    return pb.ControllerMessage(launch=convert.launch_to_pb(LaunchDescription(
        job_id=job_id, attempt=0, user=me.pw_name, uid=me.pw_uid, gid=me.pw_gid,
        spec=JobSpec(name="wire", command=command, gpus_per_node=0, workdir="/tmp"),
        allocation=Allocation((NodeAllocation("n", ()),)), node_rank=0, master_addr="127.0.0.1",
        master_port=29500, restart_count=0, kill_wait_s=1.0, time_limit_s=60,
    )))


class ControllerSide(pb_grpc.AgentLinkServicer):
    """The controller's side of the stream as the protocol has it: a RegisterAck (with accepts_batches as a
    newer controller sets it, or without, as an older one), the lease granted for every request, then the
    messages a test gives, then an acknowledgement for every result. Keeps everything the agent sent."""

    def __init__(self, batches: bool, script: list[pb.ControllerMessage]) -> None:
        self.batches = batches
        self.script = script
        self.received: list[pb.AgentMessage] = []

    def reports(self) -> list[pb.AgentMessage]:
        return [each for message in list(self.received) for each in expanded(message)]

    async def Connect(self, request_iterator, context):  # type: ignore[no-untyped-def]
        replies: asyncio.Queue[pb.ControllerMessage] = asyncio.Queue()
        stream = aiter(request_iterator)
        register = await anext(stream)
        self.received.append(register)
        yield pb.ControllerMessage(registered=pb.RegisterAck(heartbeat_interval_s=5.0, step_output_acks=True,
                                                             accepts_batches=self.batches))
        yield pb.ControllerMessage(lease=pb.NodeLeaseGrant(request=register.register.lease_request, duration_s=120))

        async def read() -> None:
            async for message in stream:
                self.received.append(message)
                for each in expanded(message):
                    kind = each.WhichOneof("kind")
                    if kind == "finished":
                        replies.put_nowait(ack(each.finished.job_id))
                    elif kind == "heartbeat" and each.heartbeat.lease_request:
                        replies.put_nowait(pb.ControllerMessage(lease=pb.NodeLeaseGrant(
                            request=each.heartbeat.lease_request, duration_s=120)))

        reader = asyncio.create_task(read())
        try:
            for message in self.script:
                yield message
            while True:
                yield await replies.get()
        finally:
            reader.cancel()


def run_agent_against(side: ControllerSide, tmp_path: Path, done: int,
                      inject: Callable[[Agent], None] | None = None) -> None:
    """A real agent (TLS, as a node with its certificate) against ``side`` until ``done`` results came;
    ``inject`` is called on the agent's event loop once its link is up (its outbox open, its Register sent)."""
    ca = make_ca(tmp_path / "ca", nodes=("n",))
    files = TlsFiles(str(ca / "controller.crt"), str(ca / "controller.key"), str(ca / "ca.crt"))
    inventory = NodeInventory(hostname="n", gpus=(), nvlink=(), topo=(), cpus=1, memory_mb=1024)

    loop = asyncio.new_event_loop()
    finish = asyncio.Event()
    failure: list[BaseException] = []
    agents: list[Agent] = []

    async def scenario() -> None:
        server = grpc.aio.server()
        pb_grpc.add_AgentLinkServicer_to_server(side, server)
        port = server.add_secure_port("127.0.0.1:0", server_credentials(files, require_client_cert=True))
        await server.start()
        config = AgentConfig(state_dir=str(tmp_path / "agent"), controller=f"127.0.0.1:{port}",
                             tls_cert=str(ca / "agents" / "n.crt"), tls_key=str(ca / "agents" / "n.key"),
                             tls_ca=str(ca / "ca.crt"))
        agent = Agent(config, "n", inventory, allow_root_jobs=True)
        agents.append(agent)
        running = asyncio.create_task(agent.run())
        try:
            await asyncio.wait([running, asyncio.create_task(finish.wait())], return_when=asyncio.FIRST_COMPLETED)
        finally:
            agent.stop()
            await asyncio.wait_for(running, DEADLINE_S)
            await server.stop(None)

    def in_thread() -> None:
        try:
            loop.run_until_complete(scenario())
        except BaseException as exc:  # reported by the test's thread
            failure.append(exc)
        finally:
            loop.close()

    thread = threading.Thread(target=in_thread)
    thread.start()
    try:
        if inject is not None:
            wait_until(lambda: failure or (agents and agents[0].outbox is not None and side.received), DEADLINE_S,
                       what="the agent's link")
            if agents:
                loop.call_soon_threadsafe(inject, agents[0])
        wait_until(lambda: failure or sum(m.WhichOneof("kind") == "finished" for m in side.reports()) >= done,
                   DEADLINE_S, what=f"{done} results")
    finally:
        with contextlib.suppress(RuntimeError):  # its loop has closed already (the scenario failed)
            loop.call_soon_threadsafe(finish.set)
        thread.join(DEADLINE_S)
    assert not failure, failure


def by_job(reports: list[pb.AgentMessage]) -> dict[int, list[str]]:
    kinds: dict[int, list[str]] = {}
    for each in reports:
        kind = each.WhichOneof("kind")
        if kind in ("started", "finished"):
            kinds.setdefault(getattr(each, kind).job_id, []).append(kind)
    return kinds


def test_a_controller_older_than_batches_is_sent_every_message_on_its_own(tmp_path: Path) -> None:
    side = ControllerSide(batches=False, script=[trivial_launch(job_id) for job_id in range(1, 17)])
    run_agent_against(side, tmp_path, done=16)
    assert side.received[0].register.accepts_batches
    assert not [m for m in side.received if m.WhichOneof("kind") == "batch"]
    assert by_job(side.reports()) == {job_id: ["started", "finished"] for job_id in range(1, 17)}
    assert not [m for m in side.reports() if m.WhichOneof("kind") == "finished" and m.finished.error]


def test_an_agent_acts_on_a_batch_in_its_order_and_batches_its_own_reports(tmp_path: Path) -> None:
    """A launch and a stop of the same attempt in one batch: the stop reaches the job that launch started (it
    never overtakes the launch, which would answer "not running here" and leave the job running)."""
    launches = [trivial_launch(job_id) for job_id in range(1, 33)]
    stopped = [trivial_launch(99, ("sleep", "300")),
               pb.ControllerMessage(signal=pb.SignalJob(job_id=99, attempt=0, action=pb.SignalJob.TERMINATE))]
    side = ControllerSide(batches=True, script=[
        pb.ControllerMessage(batch=pb.ControllerMessages(messages=launches + stopped))])
    run_agent_against(side, tmp_path, done=33)
    reports = side.reports()
    assert by_job(reports) == {job_id: ["started", "finished"] for job_id in [*range(1, 33), 99]}
    results = {m.finished.job_id: m.finished for m in reports if m.WhichOneof("kind") == "finished"}
    assert not any(results[job_id].error for job_id in range(1, 33))
    assert not results[99].error and results[99].ranks[0].exit_code != 0, results[99]  # stopped, not missed
    # 33 launches' starts and results from four launch threads: they cannot all have been written alone
    # (each write waits for the last), so some went together.
    assert [m for m in side.received if m.WhichOneof("kind") == "batch"]


def test_a_lone_start_report_waits_briefly_for_the_result_behind_it(tmp_path: Path) -> None:
    """A start report with nothing queued behind it lingers (START_REPORT_LINGER_S) before it is written, so a
    trivial job's result that follows within that time goes in the same write: one write (and one read by the
    controller) a job instead of two. The result is queued 1 ms after the start report, on the agent's own
    loop, whose timers fire in the order of their deadlines."""
    assert START_REPORT_LINGER_S >= 0.004

    def report_a_job_that_ended_at_once(agent: Agent) -> None:
        agent._send(pb.AgentMessage(started=pb.JobStarted(job_id=7777, attempt=0)))
        asyncio.get_running_loop().call_later(0.001, agent._send, pb.AgentMessage(
            finished=pb.JobResult(job_id=7777, attempt=0, ranks=[pb.RankResult(rank=0, exit_code=0)])))

    side = ControllerSide(batches=True, script=[])
    run_agent_against(side, tmp_path, done=1, inject=report_a_job_that_ended_at_once)
    writes = [[each.WhichOneof("kind") for each in expanded(m)] for m in side.received
              if any(getattr(each, each.WhichOneof("kind")).job_id == 7777 for each in expanded(m)
                     if each.WhichOneof("kind") in ("started", "finished"))]
    assert len(writes) == 1 and writes[0].count("started") == 1 and writes[0].count("finished") == 1, writes
