"""Supervisors reused from one attempt to the next (forkserver.py), with real processes and real signals.

What reuse must never change: an attempt is supervised by exactly one process, liveness is its supervisor.lock
(not the pid, which outlives the attempt), a signal meant for an attempt that has ended never reaches the next
one, and a supervisor whose fork server has gone does not wait for more work.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.polling import wait_until
from test_supervisor import DEADLINE_S, Jobs, parent_pid, process_is_gone

from garrison.nodeagent.supervisor import client, core
from garrison.nodeagent.supervisor.forkserver import MAX_IDLE_SUPERVISORS, start_forkserver

# recvmsg(2), where an idle supervisor waits for its next attempt (after it has said it is idle), and
# rt_sigtimedwait(2), where a busy one waits for its signals.
RECVMSG_SYSCALL = {"x86_64": 47, "aarch64": 212}
SIGTIMEDWAIT_SYSCALL = {"x86_64": 128, "aarch64": 137}


def _blocked_in(pid: int, syscalls: dict[str, int]) -> bool:
    try:
        number = Path(f"/proc/{pid}/syscall").read_text().split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return number.isdigit() and int(number) == syscalls[platform.machine()]


def waiting_for_an_attempt(pid: int) -> bool:
    """pid is blocked in recvmsg: it has told the server it is idle (it says so just before)."""
    return _blocked_in(pid, RECVMSG_SYSCALL)


def done_with_its_signals(pid: int) -> bool:
    """pid has taken every signal sent to it and waits for more: whatever they made it do is done."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except FileNotFoundError:
        return False
    pending = [int(line.split()[1], 16) for line in lines if line.startswith(("SigPnd:", "ShdPnd:"))]
    return not any(pending) and _blocked_in(pid, SIGTIMEDWAIT_SYSCALL)


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    job_set = Jobs(tmp_path)
    yield job_set
    job_set.close()


@pytest.fixture
def forkserver(jobs: Jobs) -> Iterator[Path]:
    if platform.machine() not in RECVMSG_SYSCALL:
        pytest.skip(f"no recvmsg number known for {platform.machine()}")
    socket_path = jobs.root / "forkserver.sock"
    server = start_forkserver(socket_path)
    try:
        yield socket_path
    finally:
        server.terminate()
        server.wait()


def released_rank(jobs: Jobs, name: str, script: str = "") -> tuple[str, Path, Path]:
    """A rank script that says it is ready, runs ``script``, and waits for its release file."""
    ready, release = jobs.root / f"{name}.ready", jobs.root / f"{name}.release"
    return f"{script} touch {ready}; while [ ! -e {release} ]; do sleep 0.01; done", ready, release


def test_a_finished_supervisor_takes_the_next_attempt_and_lets_go_of_the_last(jobs: Jobs, forkserver: Path) -> None:
    first = jobs.job_dir()
    fresh_fds, reused_fds = jobs.root / "fresh-fds", jobs.root / "reused-fds"
    pid = client.spawn(first, jobs.spec(jobs.rank(0, f"ls /proc/$$/fd > {fresh_fds}; exit 3"), job_id=1),
                       forkserver=forkserver)
    assert jobs.wait_finished(first).ranks[0].exit_code == 3
    wait_until(lambda: waiting_for_an_attempt(pid), DEADLINE_S, what="the supervisor to be idle")
    # The pid lives on, the attempt is over: liveness is the attempt's lock.
    assert not client.is_alive(first) and not process_is_gone(pid)

    second = jobs.job_dir()
    script, ready, release = released_rank(jobs, "second", f"ls /proc/$$/fd > {reused_fds};")
    assert client.spawn(second, jobs.spec(jobs.rank(0, script), job_id=2), forkserver=forkserver) == pid
    assert (second / core.PID_FILE).read_text() == f"{pid}\n"
    wait_until(ready.exists, DEADLINE_S, what="the second attempt's rank")
    assert client.is_alive(second) and not client.is_alive(first)
    # The first attempt's leftovers are looked for in its own directory: the second's ranks are not touched.
    assert client.kill_orphans(first) == []
    # Nothing of the first attempt (its lock, its log) is open in the second attempt's rank: it has the
    # descriptors the first had, from a new supervisor (the shell's own and stdin, stdout, stderr).
    assert reused_fds.read_text() == fresh_fds.read_text() and "3" not in fresh_fds.read_text().split()
    release.touch()
    status = jobs.wait_finished(second)
    assert status.supervisor_pid == pid and status.ranks[0].exit_code == 0 and status.terminated_by is None
    assert json.loads((first / core.STATUS_FILE).read_bytes())["ranks"][0]["exit_code"] == 3  # not rewritten


def second_attempt_on_a_reused_supervisor(
    jobs: Jobs, forkserver: Path, traps: str
) -> tuple[Path, Path, int, Path, Path]:
    """A first attempt that has ended, and a second on the same (now reused) supervisor whose rank traps
    ``traps`` by touching ``warned`` and waits for ``release``: (first, second, pid, warned, release)."""
    first = jobs.job_dir()
    pid = client.spawn(first, jobs.spec(jobs.rank(0, "exit 0"), job_id=1), forkserver=forkserver)
    jobs.wait_finished(first)
    wait_until(lambda: waiting_for_an_attempt(pid), DEADLINE_S, what="the supervisor to be idle")
    warned = jobs.root / "warned"
    script, ready, release = released_rank(jobs, "second", f"trap 'touch {warned}' {traps};")
    second = jobs.job_dir()
    assert client.spawn(second, jobs.spec(jobs.rank(0, script), job_id=2), forkserver=forkserver) == pid
    wait_until(ready.exists, DEADLINE_S, what="the second attempt's rank")
    return first, second, pid, warned, release


def test_a_signal_meant_for_an_ended_attempt_does_not_reach_the_next(jobs: Jobs, forkserver: Path) -> None:
    first, second, pid, warned, release = second_attempt_on_a_reused_supervisor(jobs, forkserver, "USR1 USR2")

    # Asked for the first attempt once it has ended: refused, nothing sent.
    assert not client.terminate(first) and not client.kill_now(first) and not client.send(first, signal.SIGUSR1)
    # Asked for the first attempt with its pid read just before it ended: every one of them reaches the
    # supervisor, now the second attempt's, as a wake-up that finds no request in the second's directory.
    for stale in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
        os.kill(pid, stale)
    release.touch()  # the rank's exit comes after every stale signal is pending
    status = jobs.wait_finished(second)
    assert status.ranks[0].exit_code == 0 and status.terminated_by is None
    assert not warned.exists()


def test_the_next_attempts_own_requests_are_served(jobs: Jobs, forkserver: Path) -> None:
    _first, second, _pid, warned, _release = second_attempt_on_a_reused_supervisor(jobs, forkserver, "USR1")
    assert client.send(second, signal.SIGUSR1)
    wait_until(warned.exists, DEADLINE_S, what="the warning to reach the rank")
    assert client.terminate(second)
    status = jobs.wait_finished(second)
    assert status.terminated_by == "SIGTERM" and status.ranks[0].exit_code == 128 + signal.SIGTERM


def test_idle_supervisors_exit_with_their_server_and_busy_ones_finish_first(jobs: Jobs) -> None:
    socket_path = jobs.root / "forkserver.sock"
    server = start_forkserver(socket_path)
    try:
        idle_script, idle_ready, idle_release = released_rank(jobs, "idle")
        busy_script, busy_ready, busy_release = released_rank(jobs, "busy")
        idle_dir, busy_dir = jobs.job_dir(), jobs.job_dir()
        idle_pid = client.spawn(idle_dir, jobs.spec(jobs.rank(0, idle_script), job_id=1), forkserver=socket_path)
        busy_pid = client.spawn(busy_dir, jobs.spec(jobs.rank(0, busy_script), job_id=2), forkserver=socket_path)
        wait_until(lambda: idle_ready.exists() and busy_ready.exists(), DEADLINE_S, what="both ranks")
        idle_release.touch()
        jobs.wait_finished(idle_dir)
        wait_until(lambda: waiting_for_an_attempt(idle_pid), DEADLINE_S, what="the first supervisor to be idle")
        # The agent restarts: its fork server goes with it.
        server.kill()
        server.wait()
        wait_until(lambda: process_is_gone(idle_pid), DEADLINE_S, what="the idle supervisor to exit")
        assert client.is_alive(busy_dir) and parent_pid(busy_pid) != server.pid
        busy_release.touch()
        assert jobs.wait_finished(busy_dir).ranks[0].exit_code == 0
        wait_until(lambda: process_is_gone(busy_pid), DEADLINE_S, what="the busy supervisor to exit after its attempt")
    finally:
        if server.poll() is None:
            server.terminate()
            server.wait()


def test_at_most_max_idle_wait_and_a_dead_idle_one_is_replaced(jobs: Jobs) -> None:
    """The bound is the server's argument (the agent passes its GPU count): with 3, the first two of five
    supervisors to be idle are told to exit."""
    max_idle = 3
    assert max_idle < MAX_IDLE_SUPERVISORS  # below the default, so that the argument is what holds it
    forkserver = jobs.root / "forkserver-small.sock"
    server = start_forkserver(forkserver, max_idle=max_idle)
    try:
        _at_most_max_idle_wait(jobs, forkserver, max_idle)
    finally:
        server.terminate()
        server.wait()


def _at_most_max_idle_wait(jobs: Jobs, forkserver: Path, max_idle: int) -> None:
    count = max_idle + 2
    releases, dirs, pids = [], [], []
    for job_id in range(1, count + 1):
        script, ready, release = released_rank(jobs, f"job{job_id}")
        job_dir = jobs.job_dir()
        pids.append(client.spawn(job_dir, jobs.spec(jobs.rank(0, script), job_id=job_id), forkserver=forkserver))
        wait_until(ready.exists, DEADLINE_S, what=f"job {job_id}'s rank")  # each busy: the next is a new process
        releases.append(release)
        dirs.append(job_dir)
    assert len(set(pids)) == count
    for release, job_dir in zip(releases, dirs, strict=True):
        release.touch()
        jobs.wait_finished(job_dir)
    # The first ones to be idle are the ones told to exit once more than max_idle wait.
    wait_until(lambda: all(process_is_gone(pid) for pid in pids[:2]), DEADLINE_S, what="two supervisors to exit")
    kept = pids[2:]
    wait_until(lambda: all(waiting_for_an_attempt(pid) for pid in kept), DEADLINE_S, what="the rest to be idle")
    # One dies while idle: its attempt goes to another, or to a new process, and runs once.
    os.kill(kept[-1], signal.SIGKILL)
    wait_until(lambda: process_is_gone(kept[-1]), DEADLINE_S, what="the killed supervisor to be gone")
    job_dir = jobs.job_dir()
    pid = client.spawn(job_dir, jobs.spec(jobs.rank(0, "exit 5"), job_id=count + 1), forkserver=forkserver)
    assert pid != kept[-1]
    assert jobs.wait_finished(job_dir).ranks[0].exit_code == 5


def test_a_supervisor_whose_attempt_failed_is_not_reused(jobs: Jobs, forkserver: Path) -> None:
    broken = jobs.job_dir()
    broken.mkdir()
    (broken / core.LAUNCH_FILE).write_text("{not json")
    lock_fd = os.open(broken / core.LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        pid = client._start_through_forkserver(broken, lock_fd, forkserver)
    finally:
        os.close(lock_fd)
    wait_until(lambda: process_is_gone(pid), DEADLINE_S, what="the supervisor of a broken launch to exit")
    status = client.read_status(broken)
    assert status is not None and status.finished and "launch.json" in (status.error or "")


def test_a_reused_supervisor_keeps_a_gangs_start_barrier_until_its_own_release(
    jobs: Jobs, forkserver: Path
) -> None:
    import dataclasses

    first = jobs.job_dir()
    pid = client.spawn(first, jobs.spec(jobs.rank(0, "exit 0"), job_id=1), forkserver=forkserver)
    jobs.wait_finished(first)
    wait_until(lambda: waiting_for_an_attempt(pid), DEADLINE_S, what="the supervisor to be idle")
    client.release(first)  # late, for the ended attempt: refused by its lock, its file left in its own directory
    started = jobs.root / "started"
    gang, stopped_gang = jobs.job_dir(), jobs.job_dir()
    spec = dataclasses.replace(jobs.spec(jobs.rank(0, f"touch {started}"), job_id=2), start_barrier=True)
    assert client.spawn(gang, spec, forkserver=forkserver) == pid
    # Wake-ups with no release in the gang's directory leave it at the barrier; its own release starts it.
    for stale in (signal.SIGHUP, signal.SIGUSR1):
        os.kill(pid, stale)
    wait_until(lambda: done_with_its_signals(pid), DEADLINE_S, what="the supervisor to take the wake-ups")
    assert client.is_alive(gang) and not started.exists()
    assert client.release(gang)
    status = jobs.wait_finished(gang)
    assert started.exists() and status.ranks[0].exit_code == 0

    wait_until(lambda: waiting_for_an_attempt(pid), DEADLINE_S, what="the supervisor to be idle again")
    spec = dataclasses.replace(jobs.spec(jobs.rank(0, f"touch {started}.again"), job_id=3), start_barrier=True)
    assert client.spawn(stopped_gang, spec, forkserver=forkserver) == pid
    assert client.terminate(stopped_gang)
    status = jobs.wait_finished(stopped_gang)
    assert status.terminated_by == "SIGTERM" and "not started" in (status.ranks[0].error or "")
    assert not Path(f"{started}.again").exists()


def test_the_reuse_check_sees_what_an_attempt_could_leave_behind() -> None:
    """forkserver._process_state(), compared before and after each attempt, changes with each kind of state
    a supervisor could carry from one attempt into the next (each changed here and put back)."""
    import resource

    from garrison.nodeagent.supervisor import forkserver as server_module

    before = server_module._process_state()
    changes = []
    umask = os.umask(0o027)
    changes.append(server_module._process_state())
    os.umask(umask)
    os.environ["GARRISON_REUSE_TEST"] = "1"
    changes.append(server_module._process_state())
    del os.environ["GARRISON_REUSE_TEST"]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft - 1, hard))
    changes.append(server_module._process_state())
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    leaked = os.open(os.devnull, os.O_RDONLY)
    changes.append(server_module._process_state())
    os.close(leaked)
    previous = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    changes.append(server_module._process_state())
    signal.signal(signal.SIGUSR2, previous)
    cwd = os.getcwd()
    os.chdir("/")
    changes.append(server_module._process_state() if cwd != "/" else ("cwd already /",))
    os.chdir(cwd)
    assert server_module._process_state() == before
    assert all(change != before for change in changes)


def test_a_bad_idle_bound_is_a_one_line_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-I", "-m", "garrison.nodeagent.supervisor.forkserver", str(tmp_path / "s.sock"), "many"],
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 2
    assert result.stderr == "forkserver: error: MAX_IDLE must be a whole number, not 'many'\n"
