"""A step's output crosses a link that breaks, again and again, and reaches gsrun exactly once.

The real agent side (nodeagent/steps.py: reading the task's files, offsets, acknowledgements, sent.json)
and the real controller side (controller/steps.py: dropping what it has by offset, acknowledging), joined
by a link that loses whatever it holds when it breaks: the messages queued in the agent's outbox and in
flight, both ways. An agent restart (its memory gone, sent.json left) is a break too.
"""

from __future__ import annotations

import fcntl
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_step_manager import ANN, BOB, Client, running  # tests/unit is on the path

from garrison.controller.commands import Welcome
from garrison.controller.rpc.convert_requests import instruction_to_pb
from garrison.controller.rpc.convert_step_messages import step_event_from_pb, step_instruction_to_pb
from garrison.controller.step_commands import AckStepOutput, StepInstruction, StepNodeFinished
from garrison.controller.steps import ATTACH_GRACE_S, StepManager, StepNotFound, StepPermissionDenied
from garrison.controller.store import open_store
from garrison.controller.store.interface import Store
from garrison.model.steps import Step, StepRequest, StepState
from garrison.nodeagent.steps import IO_DIR, LocalStep, StepRunner
from garrison.nodeagent.supervisor.core import LOCK_FILE, STATUS_FILE
from garrison.nodeagent.supervisor.spec import RankStatus, SupervisorStatus
from garrison.protos.v1 import garrison_pb2 as pb


class Link:
    """Agent "n1" and the controller: what each side sent and the other has not received yet."""

    def __init__(self, state_dir: Path, store: Store) -> None:
        self.state_dir = state_dir
        self.up: list[pb.AgentMessage] = []  # agent -> controller, in order
        self.down: list[pb.ControllerMessage] = []
        self.client = Client()
        self.manager = StepManager(store, lambda: {7: running()}, self.to_agent, lambda node: node, lambda: 1.0, 5.0,
                                   lambda principal: False)
        self.manager.start(ANN, 7, StepRequest(argv=("x",), cwd="/"), self.client)
        self.down.clear()  # the launch: the step's directory is made by hand below
        self.agent = self.new_agent()
        directory = self.agent.step_dir(7, 0)
        (directory / IO_DIR).mkdir(parents=True)
        (directory / "tasks.json").write_text('{"tasks": [0]}')
        self.agent.scan()

    def new_agent(self) -> StepRunner:
        return StepRunner(self.state_dir, True, self.up.append, lambda: len(self.up), lambda: None)

    @property
    def step(self) -> LocalStep:
        return self.agent.local[(7, 0)]

    def to_agent(self, node: str, instruction: StepInstruction) -> bool:
        if node == "n1":  # the step's other node (its launch) plays no part here
            self.down.append(step_instruction_to_pb(instruction))
        return True

    def deliver_up(self, count: int) -> None:
        for message in self.up[:count]:
            event = step_event_from_pb(message)
            assert event is not None
            self.manager.agent_event("n1", event)
        del self.up[:count]

    def deliver_down(self, count: int) -> None:
        for message in self.down[:count]:
            self.agent.handle(message)
        del self.down[:count]

    def break_(self, restart_agent: bool) -> None:
        self.up.clear()
        self.down.clear()
        if restart_agent:
            self.agent = self.new_agent()
            self.agent.scan()
        self.agent.reconnected()


@pytest.fixture
def link(tmp_path: Path) -> Iterator[Link]:
    store = open_store(f"sqlite:///{tmp_path / 'steps.db'}")
    store.save_jobs([running()])
    yield Link(tmp_path / "agent", store)
    store.close()


def write(link: Link, name: str, data: bytes) -> None:
    with open(link.step.directory / IO_DIR / name, "ab") as out:
        out.write(data)


@pytest.mark.parametrize("seed", range(20))
def test_every_line_reaches_the_client_once_and_in_order_across_broken_links(link: Link, seed: int) -> None:
    rng = random.Random(seed)
    expected = {1: b"", 2: b""}
    line = 0
    for _ in range(60):
        for stream, name in ((1, "out-0"), (2, "err-0")):
            lines = b"".join(f"{name} line {line + i}\n".encode() for i in range(rng.randrange(0, 50)))
            line += 50
            write(link, name, lines)
            expected[stream] += lines
        link.agent._send_output(link.step)
        link.deliver_up(rng.randrange(0, len(link.up) + 1))
        link.deliver_down(rng.randrange(0, len(link.down) + 1))
        link.agent.save_acked(link.step)
        if rng.random() < 0.3:
            link.break_(restart_agent=rng.random() < 0.5)
    # The link holds at last: everything left goes through.
    link.break_(restart_agent=False)
    while True:
        drained = link.agent._send_output(link.step, all_ended=True)
        link.deliver_up(len(link.up))
        link.deliver_down(len(link.down))
        if drained:
            break
    got = {stream: b"".join(data for task, s, data in link.client.chunks if s == stream) for stream in (1, 2)}
    assert got == expected


def test_the_agent_sends_again_from_the_acknowledged_offset_after_a_reconnect_and_a_restart(link: Link) -> None:
    write(link, "out-0", b"a\nb\n")
    link.agent._send_output(link.step)
    link.deliver_up(len(link.up))
    assert [m.step_output.offset for m in link.up] == [] and link.client.chunks == [(0, 1, b"a\nb\n")]
    assert [m.step_output_ack for m in link.down] == [pb.StepOutputAck(
        job_id=7, step_id=0, streams=[pb.StepStreamOffset(task=0, stream=1, offset=4)])]
    link.deliver_down(1)
    write(link, "out-0", b"c\n")
    link.agent._send_output(link.step)
    assert [(m.step_output.offset, m.step_output.data) for m in link.up] == [(4, b"c\n")]
    link.break_(restart_agent=False)  # "c" was queued, never delivered
    link.agent._send_output(link.step)
    assert [(m.step_output.offset, m.step_output.data) for m in link.up] == [(4, b"c\n")]
    link.agent.save_acked(link.step)
    link.break_(restart_agent=True)  # sent.json says 4
    link.agent._send_output(link.step)
    link.deliver_up(len(link.up))
    assert link.client.chunks == [(0, 1, b"a\nb\n"), (0, 1, b"c\n")]


def test_a_nodes_result_lost_with_its_link_goes_again_after_its_output(link: Link) -> None:
    """The step's end on the node (every task ended, all output read) queued on a link that broke: on the
    next link the output goes again from the acknowledged offset, then the result, and gsrun gets both."""
    write(link, "out-0", b"first\n")
    link.agent._send_output(link.step)
    link.deliver_up(len(link.up))
    link.deliver_down(len(link.down))
    write(link, "out-0", b"last words")
    status = SupervisorStatus(job_id=7, attempt=0, supervisor_pid=1, state="finished", started_at=1.0,
                              finished_at=2.0, ranks=[RankStatus(0, 10, 10, 3, True, None)])
    (link.step.directory / STATUS_FILE).write_text(status.to_json())
    link.agent.tick()
    assert [m.WhichOneof("kind") for m in link.up] == ["step_output", "step_result"]
    link.break_(restart_agent=False)
    link.agent.tick()
    link.deliver_up(len(link.up))
    assert link.client.chunks == [(0, 1, b"first\n"), (0, 1, b"last words")]
    assert link.client.end is None  # the step's other node has not ended: n1 keeps the step until it has
    assert [m.WhichOneof("kind") for m in link.down] == ["step_output_ack"]
    link.manager.agent_event("n2", StepNodeFinished(7, 0, ((1, 0),)))
    assert link.client.end is not None
    assert [m.WhichOneof("kind") for m in link.down] == ["step_output_ack", "step_ack"]
    directory = link.step.directory
    link.deliver_down(len(link.down))
    assert (7, 0) not in link.agent.local and not directory.exists()  # the result is recorded: forgotten
    # A controller that restarted before it stored the step's end asks again (a rewind): the result, once more.
    link.agent.handle(pb.ControllerMessage(step_output_ack=pb.StepOutputAck(job_id=7, step_id=0, rewind=True)))
    (again,) = link.up[-1:]
    assert again.step_result.exits == [pb.StepTaskExit(task=0, exit_code=3)] and not again.step_result.error


def test_with_a_controller_that_never_acknowledges_output_counts_as_had_once_queued(link: Link) -> None:
    """A controller older than offsets (RegisterAck without step_output_acks) would never move the acknowledged
    offsets, and the agent would send all of a step's output again on every new link: it does as before."""
    link.agent.controller_acks(False)
    write(link, "out-0", b"a\nb\n")
    link.agent._send_output(link.step)
    link.agent.save_acked(link.step)
    link.break_(restart_agent=True)
    link.agent.controller_acks(False)
    write(link, "out-0", b"c\n")
    link.agent._send_output(link.step)
    assert [(m.step_output.offset, m.step_output.data) for m in link.up] == [(4, b"c\n")]


def test_this_controller_says_it_acknowledges_output_when_an_agent_registers() -> None:
    assert instruction_to_pb(Welcome(heartbeat_interval_s=1.0)).registered.step_output_acks


# --- a controller restart: gsrun takes the step up again -----------------------------------------------


class Gsrun:
    """gsrun as it writes output: what it has of each stream, and how far (StepAttach.have)."""

    def __init__(self) -> None:
        self.got: dict[tuple[int, int], bytes] = {}
        self.have: dict[tuple[int, int], int] = {}
        self.end: tuple[Step, tuple[int, ...]] | None = None

    def write(self, task: int, stream: int, data: bytes, offset: int | None) -> None:
        assert offset is not None and offset == self.have.get((task, stream), 0), "a gap or a byte twice"
        self.got[(task, stream)] = self.got.get((task, stream), b"") + data
        self.have[(task, stream)] = offset + len(data)


class Stream:
    """One RunStep stream to gsrun: what the controller queued and gsrun has not read yet, lost if it breaks."""

    def __init__(self, gsrun: Gsrun) -> None:
        self.gsrun = gsrun
        self.queued: list[tuple[int, int, bytes, int | None]] = []
        self.end: tuple[Step, tuple[int, ...]] | None = None  # gsrun gets it after what was queued before it

    def output(self, task: int, stream: int, data: bytes, offset: int | None = None) -> None:
        self.queued.append((task, stream, data, offset))

    def notice(self, text: str) -> None:
        pass

    def ended(self, step: Step, task_codes: tuple[int, ...]) -> None:
        self.end = (step, task_codes)

    closed = False

    def close(self) -> None:
        self.closed = True

    def deliver(self, count: int) -> None:
        for task, stream, data, offset in self.queued[:count]:
            self.gsrun.write(task, stream, data, offset)
        del self.queued[:count]
        if not self.queued and self.end is not None:
            self.gsrun.end = self.end


def _restart_controller(link: Link, store: Store) -> None:
    """The controller dies (with what it had queued either way) and a new one recovers the step."""
    link.manager = StepManager(store, lambda: {7: running()}, link.to_agent, lambda node: node, lambda: 1.0, 5.0,
                               lambda principal: False)
    link.manager.recover()
    link.up.clear()
    link.down.clear()
    link.agent.reconnected()


def _set_task(link: Link, exit_code: int | None) -> None:
    """The step's supervisor status: its task running (None), or ended with ``exit_code``."""
    ended = exit_code is not None
    status = SupervisorStatus(job_id=7, attempt=0, supervisor_pid=1, state="finished" if ended else "running",
                              started_at=1.0, finished_at=2.0 if ended else None,
                              ranks=[RankStatus(0, 10, 10, exit_code, ended, None)])
    (link.step.directory / STATUS_FILE).write_text(status.to_json())


@pytest.mark.parametrize("seed", range(20))
def test_gsrun_gets_every_byte_once_across_controller_restarts(tmp_path: Path, seed: int) -> None:
    """The controller restarts (one to three times) while the task prints, and sometimes after the task has
    ended; each time, whatever the old controller had acknowledged to the agent but not yet got to gsrun is
    lost with it. gsrun takes the step up again, saying how far it has each stream: it ends with every
    byte once, in order, and the step's exit code."""
    rng = random.Random(seed)
    store = open_store(f"sqlite:///{tmp_path / 'steps.db'}")
    store.save_jobs([running()])
    gsrun = Gsrun()
    stream = Stream(gsrun)
    link = Link(tmp_path / "agent", store)
    link.manager.running[(7, 0)].client = stream
    _set_task(link, None)
    # A supervisor that holds its lock (the agent checks that a step without an end still runs)
    lock = os.open(link.step.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    expected = {(0, 1): b"", (0, 2): b""}
    restarts = rng.randrange(1, 4)
    restart_at = sorted(rng.sample(range(5, 45), restarts))
    attached = True
    line = 0
    for turn in range(50):
        if turn < 40:
            for key, name in (((0, 1), "out-0"), ((0, 2), "err-0")):
                lines = b"".join(f"{name} line {line + i}\n".encode() for i in range(rng.randrange(0, 20)))
                line += 20
                write(link, name, lines)
                expected[key] += lines
        elif turn == 40:
            _set_task(link, 3)
        link.agent.tick()
        link.deliver_up(rng.randrange(0, len(link.up) + 1))
        link.deliver_down(rng.randrange(0, len(link.down) + 1))
        stream.deliver(rng.randrange(0, len(stream.queued) + 1))
        if turn in restart_at:
            _restart_controller(link, store)
            stream.queued.clear()
            attached = False
        elif not attached and rng.random() < 0.4:
            stream = Stream(gsrun)
            link.manager.attach(ANN, 7, 0, stream, dict(gsrun.have))
            attached = True
    if not attached:
        stream = Stream(gsrun)
        link.manager.attach(ANN, 7, 0, stream, dict(gsrun.have))
    link.manager.agent_event("n2", StepNodeFinished(7, 0, ((1, 0),)))  # the step's other node
    for _ in range(200):  # the link holds at last
        link.agent.tick()
        link.deliver_up(len(link.up))
        link.deliver_down(len(link.down))
        stream.deliver(len(stream.queued))
        if gsrun.end is not None:
            break

    assert {key: gsrun.got.get(key, b"") for key in expected} == expected
    assert gsrun.end is not None and gsrun.end[0].exit_code == 3 and gsrun.end[0].state == StepState.FAILED
    os.close(lock)
    store.close()


def _recovered(tmp_path: Path, now: list[float]) -> tuple[StepManager, Store, list[tuple[str, StepInstruction]]]:
    store = open_store(f"sqlite:///{tmp_path / 'steps.db'}")
    store.save_jobs([running()])
    sent: list[tuple[str, StepInstruction]] = []
    first = StepManager(store, lambda: {7: running()}, lambda n, i: sent.append((n, i)) is None, lambda n: n,
                        lambda: now[0], 5.0, lambda principal: False)
    first.start(ANN, 7, StepRequest(argv=("x",), cwd="/"), Stream(Gsrun()))
    manager = StepManager(store, lambda: {7: running()}, lambda n, i: sent.append((n, i)) is None, lambda n: n,
                          lambda: now[0], 5.0, lambda principal: False)
    manager.recover()
    sent.clear()
    return manager, store, sent


def test_a_recovered_step_that_no_gsrun_takes_up_is_stopped_after_the_grace(tmp_path: Path) -> None:
    now = [100.0]
    manager, store, sent = _recovered(tmp_path, now)
    manager.check_jobs()
    assert sent == []  # within the grace: the step runs on
    now[0] += ATTACH_GRACE_S
    manager.check_jobs()
    assert sorted((node, type(i).__name__, getattr(i, "action", "")) for node, i in sent) == [
        ("n1", "SignalStep", "terminate"), ("n2", "SignalStep", "terminate")]
    for node in ("n1", "n2"):
        manager.agent_event(node, StepNodeFinished(7, 0, ((0 if node == "n1" else 1, 143),)))
    (step,) = store.query_steps([7])
    assert step.state == StepState.CANCELLED and "did not come back" in step.reason
    store.close()


def test_a_step_is_taken_up_only_by_its_owner_and_the_newest_stream_takes_over(tmp_path: Path) -> None:
    now = [100.0]
    manager, store, sent = _recovered(tmp_path, now)
    with pytest.raises(StepPermissionDenied):
        manager.attach(BOB, 7, 0, Stream(Gsrun()), {})
    with pytest.raises(StepNotFound):
        manager.attach(ANN, 7, 5, Stream(Gsrun()), {})
    first = Stream(Gsrun())
    step = manager.attach(ANN, 7, 0, first, {(0, 1): 12})
    assert step.state == StepState.RUNNING
    rewinds = {node: i for node, i in sent if isinstance(i, AckStepOutput)}
    assert rewinds["n1"].rewind and rewinds["n1"].streams == ((0, 1, 12), (0, 2, 0))
    manager.attach(ANN, 7, 0, Stream(Gsrun()), {})
    assert first.closed  # gsrun attaches only once its stream is lost: the old one is dead, whatever this side saw
    store.close()


def test_a_step_that_ended_while_gsrun_was_away_is_taken_up_as_ended(tmp_path: Path) -> None:
    now = [100.0]
    manager, store, sent = _recovered(tmp_path, now)
    now[0] += ATTACH_GRACE_S
    manager.check_jobs()
    for node in ("n1", "n2"):
        manager.agent_event(node, StepNodeFinished(7, 0, ((0 if node == "n1" else 1, 143),)))
    step = manager.attach(ANN, 7, 0, Stream(Gsrun()), {})
    assert step.state == StepState.CANCELLED and step.end_time is not None
    store.close()


def test_a_rewind_sent_before_the_nodes_agent_is_back_goes_again_when_it_connects(tmp_path: Path) -> None:
    """gsrun takes its step up again before the node's agent has reconnected to the restarted controller: the
    rewind sent then reaches nobody. When the agent connects it is sent again, the output the agent resends
    from the old controller's acknowledgement (past what gsrun has) is dropped as sent before the rewind, the
    output from gsrun's offset reaches gsrun, and the wait for an agent too old to rewind counts from then.
    (Seen in CI under load: gsrun ended its step with 80% of the output missing.)"""
    from garrison.controller.step_commands import StepOutputReceived
    from garrison.controller.steps import REWIND_WAIT_S

    now = [100.0]
    store = open_store(f"sqlite:///{tmp_path / 'steps.db'}")
    store.save_jobs([running()])
    connected: set[str] = {"n2"}
    sent: list[tuple[str, StepInstruction]] = []

    def send(node: str, instruction: StepInstruction) -> bool:
        if node not in connected:
            return False
        sent.append((node, instruction))
        return True

    first = StepManager(store, lambda: {7: running()}, lambda n, i: True, lambda n: n, lambda: now[0], 5.0,
                        lambda principal: False)
    first.start(ANN, 7, StepRequest(argv=("x",), cwd="/"), Stream(Gsrun()))
    manager = StepManager(store, lambda: {7: running()}, send, lambda n: n, lambda: now[0], 5.0,
                          lambda principal: False)
    manager.recover()
    gsrun = Gsrun()
    gsrun.got[(0, 1)], gsrun.have[(0, 1)] = b"0123456789ab", 12
    stream = Stream(gsrun)
    manager.attach(ANN, 7, 0, stream, dict(gsrun.have))
    assert not [i for node, i in sent if node == "n1"]  # the rewind for n1 went nowhere
    now[0] += REWIND_WAIT_S - 1
    connected.add("n1")
    manager.node_connected("n1")
    rewinds = [i for node, i in sent if node == "n1" and isinstance(i, AckStepOutput)]
    assert len(rewinds) == 1 and rewinds[0].rewind and rewinds[0].streams == ((0, 1, 12), (0, 2, 0))
    # What the agent sends on its new link before it reads the rewind, from the old controller's
    # acknowledgement: the output past gsrun's offset, dropped (it comes again from gsrun's offset)
    manager.agent_event("n1", StepOutputReceived(7, 0, 0, 1, b"OLD", offset=20))
    now[0] += 2  # past REWIND_WAIT_S from the attach, within it from the rewind the agent could read
    manager.check_jobs()
    manager.agent_event("n1", StepOutputReceived(7, 0, 0, 1, b"cdefghijXYZ", offset=12))
    manager.agent_event("n1", StepNodeFinished(7, 0, ((0, 0),)))
    manager.agent_event("n2", StepNodeFinished(7, 0, ((1, 0),)))
    stream.deliver(len(stream.queued))
    assert gsrun.got[(0, 1)] == b"0123456789abcdefghijXYZ"
    assert gsrun.end is not None and gsrun.end[0].state == StepState.COMPLETED
    store.close()
