"""The controller's StepManager on a real SQLite store: who may start steps, what goes to which node, how a
step ends (exit codes, --kill-on-bad-exit, cancellation, its client going away, its job ending), and
recovery after a restart. The agents' side is what the manager sends them, recorded per node."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from garrison.controller.step_commands import (
    AckStep,
    AckStepOutput,
    LaunchStep,
    SignalStep,
    StepInstruction,
    StepNodeFinished,
    StepOutputReceived,
    StepStdin,
    StepTasksExited,
)
from garrison.controller.steps import (
    LOST_CLIENT_GRACE_S,
    StepManager,
    StepNotFound,
    StepPermissionDenied,
    new_output,
)
from garrison.controller.store import open_store
from garrison.controller.store.interface import Store
from garrison.model.domain import Allocation, Attempt, Job, JobSpec, JobState, NodeAllocation, Principal
from garrison.model.steps import RefusalKind, Step, StepRefused, StepRequest, StepState

ANN = Principal("ann", 1000, 1000)
BOB = Principal("bob", 1001, 1001)
ROOT = Principal("root", 0, 0)


def running(job_id: int = 7) -> Job:
    allocation = Allocation(nodes=(NodeAllocation("n1", (0, 1)), NodeAllocation("n2", (0, 1))))
    return Job(job_id=job_id, spec=JobSpec(name="j", command=("sleep", "9")), user="ann", uid=1000, gid=1000,
               account="a", partition="p", time_limit_s=60, submit_time=1.0, state=JobState.RUNNING,
               start_time=2.0, attempts=(Attempt(job_id, 0, allocation, 2.0, state=JobState.RUNNING),))


class Client:
    def __init__(self) -> None:
        self.chunks: list[tuple[int, int, bytes]] = []
        self.notices: list[str] = []
        self.end: tuple[Step, tuple[int, ...]] | None = None

    def output(self, task: int, stream: int, data: bytes, offset: int | None = None) -> None:
        self.chunks.append((task, stream, data))

    def notice(self, text: str) -> None:
        self.notices.append(text)

    def ended(self, step: Step, task_codes: tuple[int, ...]) -> None:
        self.end = (step, task_codes)

    closed = False

    def close(self) -> None:
        self.closed = True


class Harness:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.jobs = {7: running()}
        self.sent: list[tuple[str, StepInstruction]] = []
        self.connected = {"n1", "n2"}
        self.now = 100.0
        self.manager = self.make()
        store.save_jobs(list(self.jobs.values()))

    def make(self) -> StepManager:
        return StepManager(self.store, lambda: self.jobs, self.send, lambda node: f"addr-{node}", lambda: self.now, 5.0,
                           lambda principal: principal.uid == 0)

    def send(self, node: str, instruction: StepInstruction) -> bool:
        if node not in self.connected:
            return False
        self.sent.append((node, instruction))
        return True

    def taken(self) -> list[tuple[str, StepInstruction]]:
        sent, self.sent = self.sent, []
        return sent


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    store = open_store(f"sqlite:///{tmp_path / 'steps.db'}")
    yield Harness(store)
    store.close()


def test_a_step_starts_on_its_nodes_and_ends_with_the_highest_exit_code(harness: Harness) -> None:
    client = Client()
    step = harness.manager.start(ANN, 7, StepRequest(argv=("python",), cwd="/w", ntasks=4), client)
    assert step.display_id == "7.0" and harness.store.query_steps([7]) == [step]
    launches = harness.taken()
    assert [(node, type(i).__name__) for node, i in launches] == [("n1", "LaunchStep"), ("n2", "LaunchStep")]
    first = launches[0][1]
    assert isinstance(first, LaunchStep) and first.description.master_addr == "addr-n1"
    assert first.description.layout.tasks_per_node() == (2, 2) and first.description.umask is None
    harness.manager.agent_event("n2", StepOutputReceived(7, 0, 2, 1, b"hi\n"))
    assert client.chunks == [(2, 1, b"hi\n")]
    harness.manager.agent_event("n1", StepNodeFinished(7, 0, ((0, 0), (1, 0))))
    assert client.end is None and harness.taken() == []  # n1 keeps the step until the whole step has ended
    harness.manager.agent_event("n2", StepNodeFinished(7, 0, ((2, 3), (3, 0))))
    assert client.end is not None and client.end[1] == (0, 0, 3, 0)
    assert harness.taken() == [("n1", AckStep(7, 0)), ("n2", AckStep(7, 0))]
    harness.manager.agent_event("n2", StepNodeFinished(7, 0, ((2, 3), (3, 0))))  # again, after a reconnect
    assert harness.taken() == [("n2", AckStep(7, 0))]
    (stored,) = harness.store.query_steps([7])
    assert (stored.state, stored.exit_code, stored.end_time) == (StepState.FAILED, 3, 100.0)
    assert harness.manager.start(ANN, 7, StepRequest(argv=("x",), cwd="/"), Client()).step_id == 1


def test_who_may_start_steps_and_in_which_jobs(harness: Harness) -> None:
    with pytest.raises(StepPermissionDenied):
        harness.manager.start(BOB, 7, StepRequest(argv=("x",), cwd="/"), Client())
    harness.manager.start(ROOT, 7, StepRequest(argv=("x",), cwd="/"), Client())  # an admin may
    with pytest.raises(StepNotFound):
        harness.manager.start(ANN, 8, StepRequest(argv=("x",), cwd="/"), Client())
    harness.jobs[7] = replace(harness.jobs[7], state=JobState.PENDING)
    with pytest.raises(StepNotFound, match="not RUNNING"):
        harness.manager.start(ANN, 7, StepRequest(argv=("x",), cwd="/"), Client())


def test_busy_gpus_are_refused_until_the_holding_step_ends(harness: Harness) -> None:
    harness.manager.start(ANN, 7, StepRequest(argv=("x",), cwd="/", ntasks=2, nodes=1, gpus_per_task=1), Client())
    with pytest.raises(StepRefused) as refused:
        harness.manager.start(ANN, 7, StepRequest(argv=("x",), cwd="/", ntasks=1, nodes=1, gpus_per_task=1), Client())
    assert refused.value.kind == RefusalKind.BUSY
    harness.manager.agent_event("n1", StepNodeFinished(7, 0, ((0, 0), (1, 0))))
    harness.manager.start(ANN, 7, StepRequest(argv=("x",), cwd="/", ntasks=1, nodes=1, gpus_per_task=1), Client())


def test_kill_on_bad_exit_cancel_signals_input_and_client_loss(harness: Harness) -> None:
    client = Client()
    harness.manager.start(ANN, 7, StepRequest(argv=("x",), cwd="/", kill_on_bad_exit=True, pty=True), client)
    harness.taken()
    harness.manager.agent_event("n2", StepTasksExited(7, 0, ((1, 4),)))
    assert sorted(harness.taken(), key=lambda s: s[0]) == [("n1", SignalStep(7, 0, "terminate")),
                                                           ("n2", SignalStep(7, 0, "terminate"))]
    assert "task 1 exited with exit code 4" in client.notices[0]
    harness.manager.signal(7, 0, 10)
    harness.manager.stdin(7, 0, b"ls\r", (24, 80))
    assert ("n1", StepStdin(7, 0, b"ls\r", (24, 80))) in harness.taken()
    with pytest.raises(StepPermissionDenied):
        harness.manager.cancel(BOB, 7, 0)
    harness.manager.cancel(ANN, 7, 0)
    harness.manager.agent_event("n1", StepNodeFinished(7, 0, ((0, 143),)))
    harness.manager.agent_event("n2", StepNodeFinished(7, 0, ((1, 4),)))
    assert client.end is not None and client.end[0].state == StepState.CANCELLED and client.end[0].exit_code == 143
    with pytest.raises(StepNotFound):
        harness.manager.cancel(ANN, 7, 0)
    second = harness.manager.start(ANN, 7, StepRequest(argv=("x",), cwd="/"), Client())
    harness.taken()
    harness.manager.client_gone(7, second.step_id)
    harness.manager.check_jobs()
    assert harness.taken() == []  # gsrun may only have lost its link: it has a while to take the step up again
    harness.now += LOST_CLIENT_GRACE_S
    harness.manager.check_jobs()
    assert {i for _, i in harness.taken()} == {SignalStep(7, 1, "terminate")}  # it did not: as srun's death


def test_gsrun_back_on_a_new_stream_keeps_its_step_and_a_silent_old_stream_is_replaced(harness: Harness) -> None:
    first = Client()
    harness.manager.start(ANN, 7, StepRequest(argv=("x",), cwd="/"), first)
    harness.taken()
    harness.manager.client_gone(7, 0, first)  # its link reset
    harness.manager.agent_event("n1", StepOutputReceived(7, 0, 0, 1, b"a\n", offset=0))
    assert harness.taken() == [] and first.chunks == []  # nobody to give it to: the agent keeps it
    second = Client()
    harness.manager.attach(ANN, 7, 0, second, {})
    harness.now += LOST_CLIENT_GRACE_S
    harness.manager.check_jobs()
    assert not any(isinstance(i, SignalStep) for _, i in harness.taken())
    harness.manager.agent_event("n1", StepOutputReceived(7, 0, 0, 1, b"a\n", offset=0))  # sent again
    assert second.chunks == [(0, 1, b"a\n")]
    third = Client()  # the second stream died without this side noticing: the new one takes over
    harness.manager.attach(ANN, 7, 0, third, {(0, 1): 2})
    assert second.closed and "taken up on another stream" in second.notices[-1]
    harness.manager.client_gone(7, 0, second)  # the old stream's end, noticed late, changes nothing
    harness.now += LOST_CLIENT_GRACE_S
    harness.manager.check_jobs()
    assert not any(isinstance(i, SignalStep) for _, i in harness.taken())


def test_a_step_never_outlives_its_job_and_a_restart_recovers_running_steps(harness: Harness) -> None:
    client = Client()
    harness.manager.start(ANN, 7, StepRequest(argv=("x",), cwd="/"), client)
    harness.taken()
    recovered = harness.make()
    recovered.recover()
    assert list(recovered.running) == [(7, 0)]
    recovered.attach(ANN, 7, 0, Client(), None)  # its gsrun, back on a new stream
    recovered.agent_event("n1", StepNodeFinished(7, 0, ((0, 0),)))
    recovered.agent_event("n2", StepNodeFinished(7, 0, ((1, 0),)))
    assert harness.store.query_steps([7])[0].state == StepState.COMPLETED
    harness.taken()
    harness.jobs[7] = replace(harness.jobs[7], state=JobState.CANCELLED, end_time=50.0)
    harness.manager.check_jobs()  # the first manager still thinks 7.0 runs
    assert {i for _, i in harness.taken()} == {SignalStep(7, 0, "kill")}
    assert client.end is not None and client.end[0].state == StepState.CANCELLED
    assert "job 7 ended" in client.notices[0]


def test_a_node_that_is_not_connected_fails_its_part(harness: Harness) -> None:
    harness.connected.discard("n2")
    client = Client()
    harness.manager.start(ANN, 7, StepRequest(argv=("x",), cwd="/"), client)
    harness.manager.agent_event("n1", StepNodeFinished(7, 0, ((0, 0),)))
    assert client.end is not None and client.end[1] == (0, 1) and "n2 is not connected" in client.end[0].reason


def test_new_output_drops_what_the_receiver_has_and_keeps_the_rest() -> None:
    assert new_output(0, 0, b"ab\n") == (b"ab\n", 3)
    assert new_output(3, 0, b"ab\n") == (b"", 3)  # all of it again: dropped
    assert new_output(3, 0, b"ab\ncd\n") == (b"cd\n", 6)  # resent from an older offset: the new part only
    assert new_output(6, 3, b"cd\n") == (b"", 6)
    assert new_output(6, 6, b"") == (b"", 6)
    assert new_output(3, 5, b"x") == (b"x", 6)  # a gap cannot be filled: what follows it still goes
    assert new_output(None, 40, b"y\n") == (b"y\n", 42)  # the receiver does not know: it starts there


def test_output_sent_again_after_a_reconnect_reaches_the_client_once(harness: Harness) -> None:
    client = Client()
    harness.manager.start(ANN, 7, StepRequest(argv=("x",), cwd="/", ntasks=4), client)
    harness.taken()
    events = [
        ("n1", StepOutputReceived(7, 0, 0, 1, b"a\n", offset=0)),
        ("n1", StepOutputReceived(7, 0, 0, 1, b"b\n", offset=2)),
        ("n1", StepOutputReceived(7, 0, 0, 2, b"e\n", offset=0)),  # stderr counts on its own
        ("n2", StepOutputReceived(7, 0, 2, 1, b"c\n", offset=0)),  # and so does each task
        # n1's link broke with "b" unacknowledged: its agent sends from the last offset it had acknowledged
        ("n1", StepOutputReceived(7, 0, 0, 1, b"b\nd\n", offset=2)),
        ("n1", StepOutputReceived(7, 0, 0, 1, b"a\nb\nd\n", offset=0)),
        ("n1", StepOutputReceived(7, 0, 0, 1, b"f\n", offset=6)),
    ]
    for node, event in events:
        harness.manager.agent_event(node, event)
    assert client.chunks == [(0, 1, b"a\n"), (0, 1, b"b\n"), (0, 2, b"e\n"), (2, 1, b"c\n"), (0, 1, b"d\n"),
                             (0, 1, b"f\n")]
    # Each piece is acknowledged at how far the controller has its stream, duplicates too (an agent that
    # missed an acknowledgement learns it again).
    assert harness.taken() == [
        ("n1", AckStepOutput(7, 0, ((0, 1, 2),))), ("n1", AckStepOutput(7, 0, ((0, 1, 4),))),
        ("n1", AckStepOutput(7, 0, ((0, 2, 2),))), ("n2", AckStepOutput(7, 0, ((2, 1, 2),))),
        ("n1", AckStepOutput(7, 0, ((0, 1, 6),))), ("n1", AckStepOutput(7, 0, ((0, 1, 6),))),
        ("n1", AckStepOutput(7, 0, ((0, 1, 8),))),
    ]
    # An agent that does not say where its output starts (older than offsets): taken as it comes.
    harness.manager.agent_event("n2", StepOutputReceived(7, 0, 3, 1, b"old\n"))
    assert client.chunks[-1] == (3, 1, b"old\n") and harness.taken() == []


def test_a_recovered_step_takes_up_each_stream_where_its_agent_resends_it(harness: Harness) -> None:
    harness.manager.start(ANN, 7, StepRequest(argv=("x",), cwd="/"), Client())
    harness.taken()
    recovered = harness.make()
    recovered.recover()
    recovered.agent_event("n1", StepOutputReceived(7, 0, 0, 1, b"w\n", offset=118))
    assert harness.taken() == []  # no gsrun yet: left unacknowledged, for the agent to send again
    recovered.attach(ANN, 7, 0, Client(), None)  # a gsrun that cannot say how far it has the output
    recovered.agent_event("n1", StepOutputReceived(7, 0, 0, 1, b"x\n", offset=120))
    recovered.agent_event("n1", StepOutputReceived(7, 0, 0, 1, b"x\ny\n", offset=120))
    assert harness.taken() == [("n1", AckStepOutput(7, 0, ((0, 1, 122),))), ("n1", AckStepOutput(7, 0, ((0, 1, 124),)))]


def test_a_launch_goes_again_when_the_nodes_agent_connects_anew(harness: Harness) -> None:
    """A launch sent on a link that then broke may never have arrived: a new link brings it again, to the nodes
    the step still waits for (the agent ignores a launch it has)."""
    harness.manager.start(ANN, 7, StepRequest(argv=("x",), cwd="/"), Client())
    first = dict(harness.taken())
    harness.manager.node_connected("n2")
    assert harness.taken() == [("n2", first["n2"])]
    harness.manager.agent_event("n2", StepNodeFinished(7, 0, ((1, 0),)))
    harness.taken()
    harness.manager.node_connected("n2")
    harness.manager.node_connected("n3")
    assert harness.taken() == []


def test_a_steps_tasks_meet_at_the_steps_head_unless_the_script_chose_its_own(tmp_path: Path) -> None:
    """srun sets no MASTER_ADDR or MASTER_PORT. Garrison gives the batch script the job's; a step started from
    there gets its own head node and port (plan_step_tasks), not the job's, which may be a node where none of
    its tasks run; a value the script exported itself is kept. srun's --ntasks-per-node reaches its tasks."""
    store = open_store(f"sqlite:///{tmp_path / 'steps.db'}")
    harness = Harness(store)
    batch = ("addr-n1", 31176)
    harness.manager = StepManager(store, lambda: harness.jobs, harness.send, lambda node: f"addr-{node}",
                                  lambda: harness.now, 5.0, lambda principal: False, lambda job: batch)
    try:
        as_given = {"MASTER_ADDR": "addr-n1", "MASTER_PORT": "31176", "HOME": "/home/ann"}
        harness.manager.start(ANN, 7, StepRequest(argv=("python",), cwd="/w", nodelist=("n2",), nodes=1,
                                                  ntasks_per_node=2, env=as_given), Client())
        ((node, sent),) = harness.taken()
        assert isinstance(sent, LaunchStep) and node == "n2"
        env = sent.description.env
        assert "MASTER_ADDR" not in env and "MASTER_PORT" not in env and env["HOME"] == "/home/ann"
        assert env["SLURM_NTASKS_PER_NODE"] == "2"
        assert sent.description.master_addr == "addr-n2"  # what plan_step_tasks gives its tasks
        chosen = {"MASTER_ADDR": "addr-n1", "MASTER_PORT": "6000"}  # `export MASTER_PORT=6000` in the script
        harness.manager.start(ANN, 7, StepRequest(argv=("python",), cwd="/w", ntasks=1, env=chosen), Client())
        ((_, sent),) = harness.taken()
        assert isinstance(sent, LaunchStep)
        assert "MASTER_ADDR" not in sent.description.env and sent.description.env["MASTER_PORT"] == "6000"
    finally:
        store.close()
