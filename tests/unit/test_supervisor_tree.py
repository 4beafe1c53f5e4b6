"""The supervisor's reach beyond the ranks' process groups: torchrun's workers, which run in sessions of their
own, get the job's warning signals while the torchrun agent (which would die of them) is spared, and nothing a
rank started outlives the attempt. Real processes and signals; a stand-in launcher named ``torchrun`` that
starts its workers as torch's does (start_new_session=True) and, like torchrun, dies of SIGUSR1.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.polling import wait_until
from test_supervisor import DEADLINE_S, Jobs, process_is_gone

from garrison.nodeagent.supervisor import client, core

# Starts two workers in sessions of their own, as torch.distributed.elastic does, and waits for them; no
# handler for SIGUSR1, so it dies of one, as torchrun does.
LAUNCHER = """\
import subprocess, sys
worker = sys.argv[1]
workers = [subprocess.Popen([sys.executable, worker, str(rank)], start_new_session=True) for rank in range(2)]
sys.exit(max(w.wait() for w in workers))
"""
# Records its pid, and on SIGUSR1 writes a checkpoint and exits 0.
WORKER = """\
import os, signal, sys, time
rank = sys.argv[1]
root = os.path.dirname(os.path.abspath(__file__))
def checkpoint(signum, frame):
    open(os.path.join(root, f"ckpt-{rank}"), "w").write("saved\\n")
    sys.exit(0)
signal.signal(signal.SIGUSR1, checkpoint)
signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a launcher that ignores TERM passes that on
open(os.path.join(root, f"pid-{rank}.tmp"), "w").write(str(os.getpid()))
os.rename(os.path.join(root, f"pid-{rank}.tmp"), os.path.join(root, f"pid-{rank}"))  # seen whole or not at all
while True:
    time.sleep(0.05)
"""


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    job_set = Jobs(tmp_path)
    yield job_set
    job_set.close()


def _launcher(root: Path) -> tuple[Path, Path]:
    bin_dir = root / "bin"
    bin_dir.mkdir()
    launcher = bin_dir / "torchrun"
    launcher.write_text(f"#!{sys.executable}\n{LAUNCHER}")
    launcher.chmod(0o755)
    worker = root / "worker.py"
    worker.write_text(WORKER)
    return launcher, worker


def _worker_pids(root: Path) -> list[int]:
    return [int((root / f"pid-{rank}").read_text()) for rank in range(2)]


def test_the_process_tree_is_read_from_proc() -> None:
    table = core.process_table()
    assert table[os.getpid()][0] == os.getppid()
    assert table[os.getpid()][1] == os.getpgrp()
    assert os.getpid() in core.descendants(os.getppid(), table)
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert child.pid in core.descendants(os.getpid(), core.process_table())
    finally:
        child.kill()
        child.wait()


def test_a_warning_reaches_torchruns_workers_and_spares_the_agent(jobs: Jobs) -> None:
    launcher, worker = _launcher(jobs.root)
    rank = jobs.rank(0, f"exec {launcher} {worker}")
    job_dir = jobs.launch(rank)
    wait_until(lambda: all((jobs.root / f"pid-{r}").exists() for r in range(2)), DEADLINE_S,
               what="both workers to start")
    leader = jobs.wait_running(job_dir).ranks[0].pid
    assert leader is not None and core.is_torchrun_agent(leader)
    assert client.send(job_dir, signal.SIGUSR1)
    status = jobs.wait_finished(job_dir)
    # The workers checkpointed and exited 0, so the launcher (which the signal never reached) did too.
    assert [(jobs.root / f"ckpt-{r}").read_text() for r in range(2)] == ["saved\n", "saved\n"]
    assert status.ranks[0].exit_code == 0 and status.terminated_by is None


def test_workers_left_behind_by_a_dead_launcher_are_killed_before_the_attempt_ends(jobs: Jobs) -> None:
    launcher, worker = _launcher(jobs.root)
    # The rank's leader is a shell, so the launcher is an ordinary member of its group; SIGKILLed, it leaves its
    # workers running in their own sessions, re-parented to the supervisor.
    rank = jobs.rank(0, f"{launcher} {worker} & launcher=$!; while [ ! -e pid-0 ] || [ ! -e pid-1 ]; do sleep 0.01; done; "
                        "kill -KILL $launcher; exit 3")
    job_dir = jobs.launch(rank)
    status = jobs.wait_finished(job_dir)
    assert status.ranks[0].exit_code == 3
    workers = _worker_pids(jobs.root)
    # The supervisor reported the end only once nothing of the attempt was left.
    assert all(process_is_gone(pid) for pid in workers), workers
    assert not any((jobs.root / f"ckpt-{r}").exists() for r in range(2))


def test_terminate_reaches_workers_in_their_own_sessions(jobs: Jobs) -> None:
    launcher, worker = _launcher(jobs.root)
    # A launcher that ignores SIGTERM and never passes it on: only the supervisor's reach can stop the workers.
    rank = jobs.rank(0, f"trap '' TERM; exec {launcher} {worker}")
    job_dir = jobs.launch(rank, kill_wait_s=30.0)
    wait_until(lambda: all((jobs.root / f"pid-{r}").exists() for r in range(2)), DEADLINE_S,
               what="both workers to start")
    workers = _worker_pids(jobs.root)
    assert client.terminate(job_dir)
    # The workers die of SIGTERM at once (no handler); the launcher, whose wait then returns, exits with them.
    status = jobs.wait_finished(job_dir)
    assert all(process_is_gone(pid) for pid in workers)
    assert status.ranks[0].exit_code != 0 and status.terminated_by == "SIGTERM"


# A batch script as Lightning's users write it: a shell with no trap, whose program handles the warning. The
# shell must not die of it (bash: exit 138, the job FAILED) while the program checkpoints.
PROGRAM = """\
import os, signal, sys, time
root = os.path.dirname(os.path.abspath(__file__))
def checkpoint(signum, frame):
    with open(os.path.join(root, "got"), "a") as got:
        got.write(f"{signum}\\n")
    sys.exit(0)
signal.signal(signal.SIGUSR1, checkpoint)
open(os.path.join(root, "ready"), "w").close()
while True:
    time.sleep(0.05)
"""


def test_a_warning_spares_a_shell_without_a_trap_and_reaches_its_program(jobs: Jobs) -> None:
    program = jobs.root / "program.py"
    program.write_text(PROGRAM)
    # Not the shell's last command, so the shell waits for it rather than exec'ing it.
    job_dir = jobs.launch(jobs.rank(0, f"{sys.executable} {program}; echo shell went on; exit 7"))
    wait_until((jobs.root / "ready").exists, DEADLINE_S, what="the program to install its handler")
    leader = jobs.wait_running(job_dir).ranks[0].pid
    assert leader is not None and core.is_unready_shell(leader, signal.SIGUSR1)
    assert not core.is_unready_shell(leader, signal.SIGTERM)  # only warnings are held back
    assert client.send(job_dir, signal.SIGUSR1)
    status = jobs.wait_finished(job_dir)
    assert (jobs.root / "got").read_text() == "10\n"
    assert status.ranks[0].exit_code == 7 and "shell went on" in (jobs.root / "rank0.out").read_text()


# A stand-in gsrun: it records the signals it gets, and ends on SIGTERM.
GSRUN = """\
import signal, sys
def record(signum, frame):
    with open("gsrun-got", "a") as got:
        got.write(f"{signum}\\n")
    if signum == signal.SIGTERM:
        sys.exit(0)
signal.signal(signal.SIGUSR1, record)
signal.signal(signal.SIGTERM, record)
open("gsrun-ready", "w").close()
while True:
    signal.pause()
"""


def test_a_warning_spares_gsrun_whose_tasks_get_it_from_their_step(jobs: Jobs) -> None:
    bin_dir = jobs.root / "bin"
    bin_dir.mkdir()
    gsrun = bin_dir / "gsrun"
    gsrun.write_text(f"#!{sys.executable}\n{GSRUN}")
    gsrun.chmod(0o755)
    program = jobs.root / "program.py"
    program.write_text(PROGRAM)
    job_dir = jobs.launch(jobs.rank(0, f"{gsrun} & {sys.executable} {program}; wait"))
    wait_until(lambda: (jobs.root / "ready").exists() and (jobs.root / "gsrun-ready").exists(), DEADLINE_S,
               what="the program and the stand-in gsrun to start")
    assert client.send(job_dir, signal.SIGUSR1)
    wait_until((jobs.root / "got").exists, DEADLINE_S, what="the program to get the warning")
    # The supervisor handles its signals in order: had the warning reached gsrun, it would come before TERM.
    assert client.terminate(job_dir)
    jobs.wait_finished(job_dir)
    assert (jobs.root / "gsrun-got").read_text() == "15\n"
