"""A step's output leaves the agent in whole lines (nodeagent/steps.py), as srun's does.

gsrun writes every task's stdout and stderr into one file or terminal; a line sent in two pieces could have
another task's bytes land in its middle (a multi-rank job's log then has lines no grep finds). So while a
task runs the agent sends what it wrote up to its last newline; the rest goes once the task has ended (or
the step has), or when a line is longer than a chunk. A --pty task's bytes, and a -u step's, go as they come.
"""

from __future__ import annotations

import fcntl
from pathlib import Path

import pytest

from garrison.nodeagent.steps import CHUNK_BYTES, IO_DIR, LocalStep, StepRunner
from garrison.nodeagent.supervisor.core import LOCK_FILE, STATUS_FILE
from garrison.nodeagent.supervisor.spec import RankStatus, SupervisorStatus
from garrison.protos.v1 import garrison_pb2 as pb


@pytest.fixture
def runner(tmp_path: Path) -> tuple[StepRunner, list[pb.AgentMessage]]:
    sent: list[pb.AgentMessage] = []
    return StepRunner(tmp_path, True, sent.append, lambda: 0, lambda: None), sent


def a_step(runner: StepRunner, tasks: tuple[int, ...] = (0, 1), pty: bool = False,
           unbuffered: bool = False) -> LocalStep:
    directory = runner.step_dir(7, 0)
    (directory / IO_DIR).mkdir(parents=True)
    return LocalStep(job_id=7, step_id=0, directory=directory, tasks=tasks, pty=pty, unbuffered=unbuffered)


def write(step: LocalStep, name: str, data: bytes) -> None:
    with open(step.directory / IO_DIR / name, "ab") as out:
        out.write(data)


def received(sent: list[pb.AgentMessage]) -> list[tuple[int, int, bytes]]:
    chunks = [(m.step_output.task, m.step_output.stream, m.step_output.data) for m in sent]
    sent.clear()
    return chunks


def test_a_running_tasks_line_goes_only_once_it_is_whole(runner: tuple[StepRunner, list[pb.AgentMessage]]) -> None:
    agent, sent = runner
    step = a_step(agent)
    write(step, "out-0", b"rank 0 loss 0.5\nrank 0 lo")
    write(step, "err-0", b"warning: slow")
    assert not agent._send_output(step)
    assert received(sent) == [(0, 1, b"rank 0 loss 0.5\n")]
    write(step, "out-0", b"ss 0.4\n")
    write(step, "err-0", b" link\n")
    agent._send_output(step)
    assert received(sent) == [(0, 1, b"rank 0 loss 0.4\n"), (0, 2, b"warning: slow link\n")]
    assert agent._send_output(step) and received(sent) == []


def test_an_ended_tasks_last_partial_line_is_sent(runner: tuple[StepRunner, list[pb.AgentMessage]]) -> None:
    agent, sent = runner
    step = a_step(agent)
    write(step, "out-0", b"done, no newline")
    write(step, "out-1", b"still running")
    assert not agent._send_output(step, ended={0})
    assert received(sent) == [(0, 1, b"done, no newline")]
    assert agent._send_output(step, all_ended=True)
    assert received(sent) == [(1, 1, b"still running")]


def test_a_line_longer_than_a_chunk_is_not_held_back(runner: tuple[StepRunner, list[pb.AgentMessage]]) -> None:
    agent, sent = runner
    step = a_step(agent, tasks=(0,))
    write(step, "out-0", b"x" * (CHUNK_BYTES + 10))
    agent._send_output(step)
    assert received(sent) == [(0, 1, b"x" * CHUNK_BYTES)]  # the rest waits for its newline, as a line would


def test_a_pty_tasks_bytes_go_as_they_come(runner: tuple[StepRunner, list[pb.AgentMessage]]) -> None:
    agent, sent = runner
    step = a_step(agent, tasks=(0,), pty=True)
    write(step, "out-0", b"password: ")
    agent._send_output(step)
    assert received(sent) == [(0, 1, b"password: ")]


def test_an_unbuffered_steps_bytes_go_as_they_come(runner: tuple[StepRunner, list[pb.AgentMessage]]) -> None:
    """gsrun -u (srun's --unbuffered): a progress line without its newline yet is shown at once."""
    agent, sent = runner
    step = a_step(agent, tasks=(0,), unbuffered=True)
    write(step, "err-0", b"epoch 1: 10%\r")
    agent._send_output(step)
    assert received(sent) == [(0, 2, b"epoch 1: 10%\r")]


def test_a_tasks_exit_lost_with_its_link_is_sent_again(runner: tuple[StepRunner, list[pb.AgentMessage]]) -> None:
    """--kill-on-bad-exit acts on each task's exit as it comes: one queued on a link that broke goes again."""
    agent, sent = runner
    step = a_step(agent)
    agent.local[step.key] = step
    status = SupervisorStatus(job_id=7, attempt=0, supervisor_pid=1, state="running", started_at=1.0,
                              finished_at=None, ranks=[RankStatus(0, 10, 10, 3, True, None),
                                                       RankStatus(1, 11, 11, None, False, None)])
    (step.directory / STATUS_FILE).write_text(status.to_json())
    (step.directory / LOCK_FILE).touch()
    with open(step.directory / LOCK_FILE) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the step's supervisor is alive
        agent.tick()
        agent.tick()
        exits = [[(e.task, e.exit_code) for e in m.step_exits.exits] for m in sent if m.HasField("step_exits")]
        assert exits == [[(0, 3)]]
        sent.clear()
        agent.reconnected()
        agent.tick()
        assert [[(e.task, e.exit_code) for e in m.step_exits.exits] for m in sent] == [[(0, 3)]]
