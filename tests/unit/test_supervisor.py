"""The detached per-attempt supervisor, with real processes and real signals.

Nothing here sleeps to synchronise: tests wait for the supervisor's notify datagram,
or poll a condition (a file appearing, a process going away) under a deadline.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.polling import wait_until

from garrison.nodeagent.supervisor import client, core
from garrison.nodeagent.supervisor.forkserver import start_forkserver
from garrison.nodeagent.supervisor.spec import LaunchSpec, RankSpec, SupervisorStatus

DEADLINE_S = 30.0  # a bound, never a wait: generous for a machine loaded with other tests
SHELL_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
# A rank that runs until the test creates its release file (the loop is the job's, not the test's).
WAIT_FOR_RELEASE = 'while [ ! -e "$RELEASE" ]; do sleep 0.01; done'


def process_is_gone(pid: int) -> bool:
    """True once pid has exited (a zombie waiting for some other parent counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            return stat_file.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):  # reaped before the open, or between it and the read
        return True


def group_is_gone(pgid: int) -> bool:
    try:
        members = [
            int(entry) for entry in os.listdir("/proc") if entry.isdigit() and os.getpgid(int(entry)) == pgid
        ]
    except ProcessLookupError:
        return False  # a process vanished while we looked; look again
    return all(process_is_gone(member) for member in members)


def read_text_if_exists(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat_file:
        return int(stat_file.read().rsplit(")", 1)[1].split()[1])


class Jobs:
    """Builds launches for one test, spawns them and waits for their notify datagrams."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.notify_path = root / "notify.sock"
        self.notifications = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notifications.bind(str(self.notify_path))
        self.notifications.settimeout(DEADLINE_S)
        self.notified: set[int] = set()
        self.job_dirs: list[Path] = []

    def rank(
        self, number: int, script: str, *, env: dict[str, str] | None = None, **overrides: str
    ) -> RankSpec:
        output = str(self.root / f"rank{number}.out")
        fields: dict[str, str] = {"cwd": str(self.root), "stdout": output, "stderr": output, **overrides}
        environment = {**SHELL_ENV, "RELEASE": str(self.root / "release"), **(env or {})}
        return RankSpec(rank=number, argv=["/bin/sh", "-c", script], env=environment, **fields)

    def spec(
        self,
        *ranks: RankSpec,
        job_id: int | None = None,
        kill_wait_s: float = 5.0,
        uid: int | None = None,
        gid: int | None = None,
        notify: bool = True,
    ) -> LaunchSpec:
        return LaunchSpec(
            job_id=len(self.job_dirs) + 1 if job_id is None else job_id,
            attempt=2,
            uid=os.getuid() if uid is None else uid,
            gid=os.getgid() if gid is None else gid,
            groups=[] if gid is None else [gid],
            user="someone",
            ranks=list(ranks),
            kill_wait_s=kill_wait_s,
            notify_socket=str(self.notify_path) if notify else None,
        )

    def job_dir(self) -> Path:
        job_dir = self.root / f"job{len(self.job_dirs) + 1}"
        self.job_dirs.append(job_dir)
        return job_dir

    def launch(
        self,
        *ranks: RankSpec,
        job_id: int | None = None,
        kill_wait_s: float = 5.0,
        uid: int | None = None,
        gid: int | None = None,
    ) -> Path:
        spec = self.spec(*ranks, job_id=job_id, kill_wait_s=kill_wait_s, uid=uid, gid=gid)
        job_dir = self.job_dir()
        client.spawn(job_dir, spec)
        return job_dir

    def wait_finished(self, job_dir: Path) -> SupervisorStatus:
        launch = LaunchSpec.from_json((job_dir / core.LAUNCH_FILE).read_text())
        while launch.job_id not in self.notified:
            message = json.loads(self.notifications.recv(4096))
            assert message["attempt"] == launch.attempt
            self.notified.add(message["job_id"])
        status = client.read_status(job_dir)
        assert status is not None and status.finished, status
        return status

    def wait_running(self, job_dir: Path) -> SupervisorStatus:
        def running() -> SupervisorStatus | None:
            status = client.read_status(job_dir)
            return status if status is not None and status.state == "running" else None

        return wait_until(running, DEADLINE_S, what=f"{job_dir.name} to run")

    def release(self) -> None:
        (self.root / "release").touch()

    def close(self) -> None:
        for job_dir in self.job_dirs:
            client.kill_now(job_dir)
            client.kill_orphans(job_dir)
        self.notifications.close()


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    job_set = Jobs(tmp_path)
    yield job_set
    job_set.close()


def test_launch_json_holds_every_field_of_the_spec(jobs: Jobs) -> None:
    # to_json writes the fields by hand (spec.py): a field added to the spec must still reach launch.json.
    rank = dataclasses.replace(jobs.rank(0, "true", env={"A": "1"}), truncate=["/tmp/o"], cpus=[1])
    spec = dataclasses.replace(jobs.spec(rank, jobs.rank(1, "false")), umask=0o22, cpus=[0, 1], batch_signal=10,
                   lease_file="/tmp/lease", start_barrier=True, cgroup={"memory": "/sys/fs/cgroup/x"}, gpus=[3])
    assert json.loads(spec.to_json()) == dataclasses.asdict(spec)
    assert LaunchSpec.from_json(spec.to_json()) == spec


def test_launch_spec_round_trips_and_the_supervisor_reads_the_same_schema(jobs: Jobs) -> None:
    spec = jobs.spec(
        jobs.rank(0, "true", env={"A": "1"}), jobs.rank(1, "false", stderr="/tmp/e"), kill_wait_s=2.5
    )
    assert LaunchSpec.from_json(spec.to_json()) == spec
    launch = core.Launch(json.loads(spec.to_json()))
    assert (launch.job_id, launch.attempt, launch.uid, launch.gid, launch.groups, launch.user) == (
        spec.job_id,
        spec.attempt,
        spec.uid,
        spec.gid,
        spec.groups,
        spec.user,
    )
    assert (launch.kill_wait_s, launch.notify_socket) == (spec.kill_wait_s, spec.notify_socket)
    for parsed, given in zip(launch.ranks, spec.ranks, strict=True):
        assert (parsed.rank, parsed.argv, parsed.env, parsed.cwd, parsed.stdout, parsed.stderr) == (
            given.rank,
            given.argv,
            given.env,
            given.cwd,
            given.stdout,
            given.stderr,
        )
    document = json.loads(spec.to_json())
    invalid_fields: list[dict[str, object]] = [
        {"job_id": True},
        {"ranks": []},
        {"kill_wait_s": "5"},
        {"groups": ["wheel"]},
        {"notify_socket": 3},
    ]
    for broken in invalid_fields:
        with pytest.raises(ValueError):
            LaunchSpec.from_json(json.dumps({**document, **broken}))
    with pytest.raises(ValueError):
        LaunchSpec.from_json(json.dumps({**document, "ranks": [{**document["ranks"][0], "argv": []}]}))


def test_exit_codes_per_rank(jobs: Jobs) -> None:
    job_dir = jobs.launch(jobs.rank(0, "exit 0"), jobs.rank(1, "exit 3"), jobs.rank(2, "kill -KILL $$"))
    status = jobs.wait_finished(job_dir)
    assert [(rank.rank, rank.exit_code, rank.ended, rank.error) for rank in status.ranks] == [
        (0, 0, True, None),
        (1, 3, True, None),
        (2, 128 + signal.SIGKILL, True, None),
    ]
    assert status.terminated_by is None and status.error is None
    assert all(rank.pid is not None and rank.pgid == rank.pid for rank in status.ranks)
    assert status.started_at is not None and status.finished_at is not None
    assert status.started_at <= status.finished_at
    assert status.supervisor_pid == client.supervisor_pid(job_dir)
    wait_until(lambda: not client.is_alive(job_dir), DEADLINE_S, what="the supervisor to exit")
    assert not client.terminate(job_dir) and not client.send(job_dir, signal.SIGUSR1)


def test_environment_is_exactly_the_given_one_and_stdin_is_empty(jobs: Jobs) -> None:
    env_output, cwd_output = jobs.root / "env.out", jobs.root / "cwd.out"
    work_dir = jobs.root / "work"
    work_dir.mkdir()
    given_env = {"ONLY": "this", "WITH_SPACE": "a b", "EMPTY": ""}
    job_dir = jobs.launch(
        RankSpec(0, ["/usr/bin/env"], given_env, str(work_dir), str(env_output), str(env_output)),
        RankSpec(1, ["/bin/sh", "-c", "cat; /bin/pwd"], {}, str(work_dir), str(cwd_output), str(cwd_output)),
    )
    status = jobs.wait_finished(job_dir)
    assert [rank.exit_code for rank in status.ranks] == [0, 0]
    assert sorted(env_output.read_text().splitlines()) == sorted(
        f"{key}={value}" for key, value in given_env.items()
    )
    assert cwd_output.read_text() == f"{work_dir}\n"


def test_two_ranks_append_to_one_output_file(jobs: Jobs) -> None:
    shared = jobs.root / "shared.out"
    shared.write_text("from an earlier attempt\n")
    script = 'for i in $(seq 1 200); do echo "rank $R out $i"; echo "rank $R err $i" >&2; done'
    job_dir = jobs.launch(
        *(
            jobs.rank(number, script, env={"R": str(number)}, stdout=str(shared), stderr=str(shared))
            for number in (0, 1)
        )
    )
    assert [rank.exit_code for rank in jobs.wait_finished(job_dir).ranks] == [0, 0]
    lines = shared.read_text().splitlines()
    assert lines[0] == "from an earlier attempt"
    expected = {
        f"rank {rank} {stream} {i}" for rank in (0, 1) for stream in ("out", "err") for i in range(1, 201)
    }
    assert len(lines) == 1 + len(expected) and set(lines[1:]) == expected


def test_sigusr1_reaches_the_rank(jobs: Jobs) -> None:
    marker, ready = jobs.root / "got-usr1", jobs.root / "ready"
    script = f"trap 'echo usr1 > {marker}; exit 0' USR1; touch {ready}; while :; do sleep 1; done"
    job_dir = jobs.launch(jobs.rank(0, script))
    wait_until(ready.exists, DEADLINE_S, what="the rank to install its trap")
    assert client.send(job_dir, signal.SIGUSR1)
    status = jobs.wait_finished(job_dir)
    assert marker.read_text() == "usr1\n" and status.ranks[0].exit_code == 0
    assert status.terminated_by is None


# The shell's child: a sleep, which USR1 (no handler) kills. The shell's trap ends the child with TERM and
# records how it died: by USR1 (138) if the signal reached the whole group, by TERM (143) if only the shell.
# Ready only once the child is sleep: until its exec it is a shell, which a warning spares when it has no trap.
CHILD_SEES = (
    "trap 'kill -TERM $child; wait $child; echo $? > {marker}; exit 0' USR1; "
    "sleep 300 & child=$!; while [ \"$(cat /proc/$child/comm)\" != sleep ]; do :; done; touch {ready}; "
    "while :; do wait $child; done"
)


@pytest.mark.parametrize(("batch_signal", "child_exit"), [(int(signal.SIGUSR1), "143"), (0, "138")])
def test_a_batch_signal_reaches_only_the_ranks_own_process(jobs: Jobs, batch_signal: int, child_exit: str) -> None:
    from dataclasses import replace

    marker, ready = jobs.root / "child-exit", jobs.root / "ready"
    spec = replace(jobs.spec(jobs.rank(0, CHILD_SEES.format(marker=marker, ready=ready))), batch_signal=batch_signal)
    job_dir = jobs.job_dir()
    client.spawn(job_dir, spec)
    wait_until(ready.exists, DEADLINE_S, what="the rank to start its child")
    assert client.send(job_dir, signal.SIGUSR1)
    assert jobs.wait_finished(job_dir).ranks[0].exit_code == 0
    assert marker.read_text().strip() == child_exit


def test_other_signals_go_through_control_requests(jobs: Jobs) -> None:
    ready = jobs.root / "ready"
    job_dir = jobs.launch(jobs.rank(0, f"trap 'exit 42' ALRM; touch {ready}; while :; do sleep 1; done"))
    wait_until(ready.exists, DEADLINE_S, what="the rank to install its trap")
    assert client.send(job_dir, signal.SIGALRM)
    ended = jobs.wait_finished(job_dir).ranks[0]
    assert ended.exit_code == 42 and ended.signal is None
    assert os.listdir(job_dir / core.CONTROL_DIR) == []


def test_terminate_escalates_to_sigkill_after_kill_wait(jobs: Jobs) -> None:
    stubborn_ready, polite_ready = jobs.root / "stubborn-ready", jobs.root / "polite-ready"
    job_dir = jobs.launch(
        # An ignored signal stays ignored across exec, so the sleep ignores SIGTERM too.
        jobs.rank(0, f"trap '' TERM; touch {stubborn_ready}; exec sleep 100"),
        jobs.rank(1, f"touch {polite_ready}; exec sleep 100"),
        kill_wait_s=0.3,
    )
    wait_until(
        lambda: stubborn_ready.exists() and polite_ready.exists(),
        DEADLINE_S, what="both ranks to be ready",
    )
    asked_at = time.monotonic()
    assert client.terminate(job_dir)
    status = jobs.wait_finished(job_dir)
    assert time.monotonic() - asked_at >= 0.3
    assert [rank.exit_code for rank in status.ranks] == [128 + signal.SIGKILL, 128 + signal.SIGTERM]
    assert [rank.signal for rank in status.ranks] == [signal.SIGKILL, signal.SIGTERM]  # deaths, not exits
    assert status.terminated_by == "SIGTERM"


def test_kill_now_does_not_wait(jobs: Jobs) -> None:
    ready = jobs.root / "ready"
    job_dir = jobs.launch(jobs.rank(0, f"trap '' TERM; touch {ready}; exec sleep 100"), kill_wait_s=60)
    wait_until(ready.exists, DEADLINE_S, what="the rank")
    assert client.kill_now(job_dir)
    status = jobs.wait_finished(job_dir)
    assert status.ranks[0].exit_code == 128 + signal.SIGKILL and status.terminated_by == "SIGKILL"


def test_terminate_right_after_spawn_is_not_lost(jobs: Jobs) -> None:
    # Sent while the supervisor's interpreter is still starting: it must stay pending
    # (spawn() starts the supervisor with its control signals blocked), not kill it.
    job_dir = jobs.launch(jobs.rank(0, "exec sleep 100"))
    assert client.terminate(job_dir)
    status = jobs.wait_finished(job_dir)
    assert status.terminated_by == "SIGTERM"
    assert status.ranks[0].ended and status.ranks[0].exit_code in (None, 128 + signal.SIGTERM)


def test_rank_ends_when_its_command_exits_and_what_it_left_in_the_background_is_killed(jobs: Jobs) -> None:
    """As a Slurm task: the script exits (5) without waiting for its background `sleep`, which is in its
    process group; the attempt ends with 5 and the sleep is killed, rather than holding the job (and its
    GPUs) until the sleep ends or the time limit."""
    background_pid_file = jobs.root / "background.pid"
    job_dir = jobs.launch(
        jobs.rank(
            0,
            f"sleep 100 & echo $! > {background_pid_file}.tmp; "
            f"mv {background_pid_file}.tmp {background_pid_file}; exit 5",
        )
    )
    background_pid = int(wait_until(
        lambda: read_text_if_exists(background_pid_file),
        DEADLINE_S, what="the background sleep",
    ))
    status = jobs.wait_finished(job_dir)
    assert status.ranks[0].ended and status.ranks[0].exit_code == 5
    wait_until(lambda: not os.path.exists(f"/proc/{background_pid}"), DEADLINE_S, what="the background sleep killed")


def test_supervisor_survives_the_death_of_its_spawner(jobs: Jobs) -> None:
    spec = jobs.spec(jobs.rank(0, f"{WAIT_FOR_RELEASE}; echo released"))
    job_dir = jobs.job_dir()
    spawner_code = (
        "import sys; from pathlib import Path\n"
        "from garrison.nodeagent.supervisor import client\n"
        "from garrison.nodeagent.supervisor.spec import LaunchSpec\n"
        "print(client.spawn(Path(sys.argv[1]), LaunchSpec.from_json(sys.argv[2])), flush=True)\n"
        "sys.stdin.read()\n"
    )
    spawner = subprocess.Popen(
        [sys.executable, "-c", spawner_code, str(job_dir), spec.to_json()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert spawner.stdout is not None
    supervisor_pid = int(spawner.stdout.readline())
    assert parent_pid(supervisor_pid) != spawner.pid  # detached: not the spawner's child
    spawner.kill()
    assert spawner.wait() == -signal.SIGKILL
    assert client.is_alive(job_dir)
    jobs.release()
    status = jobs.wait_finished(job_dir)
    assert status.supervisor_pid == supervisor_pid and status.ranks[0].exit_code == 0
    assert (jobs.root / "rank0.out").read_text() == "released\n"


def test_spawn_is_idempotent(jobs: Jobs) -> None:
    count_file = jobs.root / "count"
    spec = jobs.spec(jobs.rank(0, f"echo run >> {count_file}; {WAIT_FOR_RELEASE}"))
    job_dir = jobs.job_dir()
    pids: list[int] = []
    spawners = [threading.Thread(target=lambda: pids.append(client.spawn(job_dir, spec))) for _ in range(4)]
    for spawner in spawners:
        spawner.start()
    for spawner in spawners:
        spawner.join()
    assert len(pids) == 4 and len(set(pids)) == 1
    wait_until(count_file.exists, DEADLINE_S, what="the rank to start")
    assert client.spawn(job_dir, spec) == pids[0]
    jobs.release()
    jobs.wait_finished(job_dir)
    assert client.spawn(job_dir, spec) == pids[0]  # finished: still not run again
    assert count_file.read_text() == "run\n"
    other_attempt = dataclasses.replace(spec, attempt=spec.attempt + 1)
    with pytest.raises(ValueError, match="belongs to job"):
        client.spawn(job_dir, other_attempt)


def test_start_failures_exit_127_or_126_with_a_reason(jobs: Jobs) -> None:
    not_executable = jobs.root / "not-executable"
    not_executable.write_text("#!/bin/sh\n")

    def failing_rank(number: int, argv: list[str], **overrides: str) -> RankSpec:
        error_file = str(jobs.root / f"rank{number}.err")
        fields = {"cwd": str(jobs.root), "stdout": error_file, "stderr": error_file, **overrides}
        return RankSpec(rank=number, argv=argv, env=dict(SHELL_ENV), **fields)

    job_dir = jobs.launch(
        failing_rank(0, ["no-such-command-for-garrison"]),
        failing_rank(1, [str(not_executable)]),
        failing_rank(2, ["/bin/true"], cwd=str(jobs.root / "missing-dir")),
        failing_rank(3, ["/bin/true"], stdout=str(jobs.root / "missing-dir" / "out")),
    )
    status = jobs.wait_finished(job_dir)
    assert [rank.exit_code for rank in status.ranks] == [127, 126, 127, 127]
    errors = [rank.error or "" for rank in status.ranks]
    assert errors[0] == "exec 'no-such-command-for-garrison': command not found"
    assert "Permission denied" in errors[1]
    assert errors[2].startswith("chdir") and "No such file or directory" in errors[2]
    assert errors[3].startswith("open stdout") and "No such file or directory" in errors[3]
    # The reason is in the rank's own stderr as well, wherever that could be opened.
    assert (jobs.root / "rank0.err").read_text() == f"garrison: rank 0: {errors[0]}\n"
    assert (jobs.root / "rank1.err").read_text() == f"garrison: rank 1: {errors[1]}\n"
    assert (jobs.root / "rank2.err").read_text() == f"garrison: rank 2: {errors[2]}\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a rank as another user needs root")
def test_rank_runs_as_its_user_and_opens_files_with_its_rights(jobs: Jobs) -> None:
    nobody = pwd.getpwnam("nobody")
    # Outside tmp_path, whose parents only root may enter.
    shared = Path(tempfile.mkdtemp(prefix="garrison-nobody-"))
    try:
        shared.chmod(0o777)
        root_only = shared / "root-only"
        root_only.mkdir(mode=0o755)
        output, denied_output = shared / "ids.out", root_only / "denied.out"
        job_dir = jobs.launch(
            RankSpec(
                0,
                ["/bin/sh", "-c", "id -u; id -g; id -G"],
                dict(SHELL_ENV),
                str(shared),
                str(output),
                str(output),
            ),
            RankSpec(1, ["/bin/true"], dict(SHELL_ENV), str(shared), str(denied_output), str(denied_output)),
            uid=nobody.pw_uid,
            gid=nobody.pw_gid,
        )
        status = jobs.wait_finished(job_dir)
        assert output.read_text().split() == [str(nobody.pw_uid), str(nobody.pw_gid), str(nobody.pw_gid)]
        assert (output.stat().st_uid, output.stat().st_mode & 0o777) == (nobody.pw_uid, 0o644)
        assert status.ranks[0].exit_code == 0
        assert status.ranks[1].exit_code == 126 and "Permission denied" in (status.ranks[1].error or "")
        assert not denied_output.exists()
    finally:
        shutil.rmtree(shared)


def test_notify_datagram_and_a_missing_notify_socket(jobs: Jobs) -> None:
    job_dir = jobs.launch(jobs.rank(0, "true"), job_id=41)
    assert json.loads(jobs.notifications.recv(4096)) == {"job_id": 41, "attempt": 2}
    jobs.notified.add(41)
    assert jobs.wait_finished(job_dir).ranks[0].exit_code == 0
    # The agent may be down: the supervisor finishes all the same.
    spec = jobs.spec(jobs.rank(0, "true"), job_id=42)
    spec = dataclasses.replace(spec, notify_socket=str(jobs.root / "nobody-listens.sock"))
    job_dir = jobs.job_dir()
    client.spawn(job_dir, spec)
    wait_until(lambda: not client.is_alive(job_dir), DEADLINE_S, what="the supervisor to exit")
    status = client.read_status(job_dir)
    assert status is not None and status.finished and status.ranks[0].exit_code == 0


def test_kill_orphans_after_the_supervisor_was_killed(jobs: Jobs) -> None:
    ready = jobs.root / "ready"
    job_dir = jobs.launch(jobs.rank(0, f"touch {ready}; exec sleep 100"))
    wait_until(ready.exists, DEADLINE_S, what="the rank")
    status = jobs.wait_running(job_dir)
    rank_pgid = status.ranks[0].pgid
    assert rank_pgid is not None
    os.kill(status.supervisor_pid, signal.SIGKILL)
    wait_until(lambda: not client.is_alive(job_dir), DEADLINE_S, what="the supervisor's death to show")
    assert not group_is_gone(rank_pgid)  # the rank outlives its supervisor, as it must
    assert client.kill_orphans(job_dir) == [rank_pgid]
    wait_until(lambda: group_is_gone(rank_pgid), DEADLINE_S, what="the orphaned group to die")


def test_kill_orphans_leaves_a_reused_process_group_alone(jobs: Jobs) -> None:
    # A process group whose number matches a dead supervisor's rank but that started
    # later is someone else's.
    stranger = subprocess.Popen(["sleep", "100"], start_new_session=True)
    try:
        job_dir = jobs.job_dir()
        job_dir.mkdir()
        real_start_ticks = core.read_start_ticks(stranger.pid)
        assert real_start_ticks is not None
        for recorded_ticks, expected in ((real_start_ticks - 1, []), (real_start_ticks, [stranger.pid])):
            core.write_status_file(
                str(job_dir),
                {
                    "job_id": 1,
                    "attempt": 0,
                    "supervisor_pid": 1,
                    "state": "running",
                    "started_at": 1.0,
                    "finished_at": None,
                    "terminated_by": None,
                    "error": None,
                    "ranks": [
                        {
                            "rank": 0,
                            "pid": stranger.pid,
                            "pgid": stranger.pid,
                            "exit_code": None,
                            "ended": False,
                            "error": None,
                            "leader_start_ticks": recorded_ticks,
                        }
                    ],
                },
            )
            assert client.kill_orphans(job_dir) == expected
        assert stranger.wait(timeout=DEADLINE_S) == -signal.SIGKILL
    finally:
        stranger.kill()
        stranger.wait()


def _open_for_writing(fifo: Path) -> int | None:
    """A descriptor writing to ``fifo`` once a reader has it open; None before (ENXIO)."""
    try:
        return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as err:
        if err.errno == errno.ENXIO:
            return None
        raise


def test_fork_server_supervisors_outlive_it_and_are_reaped(jobs: Jobs) -> None:
    socket_path = jobs.root / "forkserver.sock"
    server = start_forkserver(socket_path)
    try:
        assert socket_path.stat().st_mode & 0o777 == 0o600
        ready = jobs.root / "ready"
        # The first attempt ends only once the second has been spawned (a line through a FIFO), so its
        # supervisor is busy then and the second gets a supervisor of its own, however slow the machine.
        release = jobs.root / "release"
        os.mkfifo(release)
        first = jobs.job_dir()
        client.spawn(first, jobs.spec(jobs.rank(0, f"read line < {release}; exit 7"), job_id=1),
                     forkserver=socket_path)
        second = jobs.job_dir()
        second_pid = client.spawn(
            second,
            jobs.spec(jobs.rank(0, f"touch {ready}; exec sleep 100"), job_id=2),
            forkserver=socket_path,
        )
        writer = wait_until(lambda: _open_for_writing(release), DEADLINE_S, what="the first rank to read")
        os.write(writer, b"go\n")
        os.close(writer)
        assert jobs.wait_finished(first).ranks[0].exit_code == 7
        first_pid = int((first / core.PID_FILE).read_text())
        assert first_pid != second_pid  # the first was busy when the second was asked for
        wait_until(ready.exists, DEADLINE_S, what="the rank")
        # The agent restarting takes its fork server with it; the supervisors it forked run on, except an idle
        # one (the first, waiting for another attempt), which exits and is reaped by whoever inherits it.
        server.kill()
        server.wait()
        wait_until(lambda: process_is_gone(first_pid), DEADLINE_S, what="the idle supervisor to exit")
        wait_until(
            lambda: parent_pid(second_pid) != server.pid,
            DEADLINE_S, what="the orphaned supervisor to be re-parented",
        )
        assert client.is_alive(second) and client.terminate(second)
        status = jobs.wait_finished(second)
        assert status.ranks[0].exit_code == 128 + signal.SIGTERM and status.terminated_by == "SIGTERM"
    finally:
        server.terminate()
        server.wait()


def test_a_dead_fork_server_is_started_again_or_the_supervisor_starts_without_it(jobs: Jobs) -> None:
    """A fork server killed (the OOM killer, a stray kill -9) would fail every launch on the node: spawn asks
    ``revive`` for a new one and starts the supervisor through it, or, without one, as a new interpreter."""
    socket_path = jobs.root / "forkserver.sock"
    servers = [start_forkserver(socket_path)]
    servers[0].kill()
    servers[0].wait()
    revived: list[int] = []

    def revive() -> bool:
        servers.append(start_forkserver(socket_path))
        revived.append(servers[-1].pid)
        return True

    try:
        through_new = jobs.job_dir()
        pid = client.spawn(through_new, jobs.spec(jobs.rank(0, "exit 3"), job_id=1), forkserver=socket_path,
                           revive=revive)
        assert len(revived) == 1 and parent_pid(pid) == revived[0]
        assert jobs.wait_finished(through_new).ranks[0].exit_code == 3
        servers[-1].kill()
        servers[-1].wait()
        without = jobs.job_dir()
        pid = client.spawn(without, jobs.spec(jobs.rank(0, "exit 4"), job_id=2), forkserver=socket_path,
                           revive=lambda: False)
        assert (without / core.PID_FILE).read_text() == f"{pid}\n"
        assert jobs.wait_finished(without).ranks[0].exit_code == 4
        plain = jobs.job_dir()  # no revive at all: a new interpreter too
        client.spawn(plain, jobs.spec(jobs.rank(0, "exit 5"), job_id=3), forkserver=socket_path)
        assert jobs.wait_finished(plain).ranks[0].exit_code == 5
    finally:
        for server in servers:
            if server.poll() is None:
                server.terminate()
                server.wait()


def test_fork_server_writes_the_pid_before_answering_and_a_log_only_when_there_is_a_line(jobs: Jobs) -> None:
    socket_path = jobs.root / "forkserver.sock"
    server = start_forkserver(socket_path)
    try:
        quiet = jobs.job_dir()
        quiet_pid = client.spawn(quiet, jobs.spec(jobs.rank(0, "exit 0"), job_id=1), forkserver=socket_path)
        # Written by the server before it answered: there as spawn() returns, whatever the supervisor has done.
        assert (quiet / core.PID_FILE).read_text() == f"{quiet_pid}\n"
        assert stat.S_IMODE((quiet / core.PID_FILE).stat().st_mode) == core.PRIVATE_FILE_MODE
        failing = jobs.job_dir()
        rank = RankSpec(rank=0, argv=["no-such-command-for-garrison"], env=dict(SHELL_ENV), cwd=str(jobs.root),
                        stdout=os.devnull, stderr=os.devnull)
        client.spawn(failing, jobs.spec(rank, job_id=2), forkserver=socket_path)
        assert jobs.wait_finished(quiet).ranks[0].exit_code == 0
        assert jobs.wait_finished(failing).ranks[0].exit_code == 127
        # A supervisor with nothing to say leaves no log; one that logs creates it, private, with the line.
        assert not (quiet / core.LOG_FILE).exists()
        log = failing / core.LOG_FILE
        assert "rank 0: exec 'no-such-command-for-garrison': command not found" in log.read_text()
        assert stat.S_IMODE(log.stat().st_mode) == core.PRIVATE_FILE_MODE
    finally:
        server.terminate()
        server.wait()


def test_module_entry_point_runs_a_job_in_the_foreground(jobs: Jobs) -> None:
    job_dir = jobs.job_dir()
    job_dir.mkdir()
    (job_dir / core.LAUNCH_FILE).write_text(
        jobs.spec(jobs.rank(0, "echo hello; exit 4"), notify=False).to_json()
    )
    command = [sys.executable, "-m", "garrison.nodeagent.supervisor", str(job_dir)]
    assert subprocess.run(command, timeout=DEADLINE_S).returncode == 0
    status = client.read_status(job_dir)
    assert status is not None and status.finished and status.ranks[0].exit_code == 4
    # A second run finds the status and does not start the job again.
    assert subprocess.run(command, timeout=DEADLINE_S).returncode == 0
    assert (jobs.root / "rank0.out").read_text() == "hello\n"


def test_unreadable_launch_file_is_reported_in_the_status(jobs: Jobs) -> None:
    job_dir = jobs.job_dir()
    job_dir.mkdir()
    (job_dir / core.LAUNCH_FILE).write_text('{"job_id": 1}')
    command = [sys.executable, "-m", "garrison.nodeagent.supervisor", str(job_dir)]
    assert subprocess.run(command, timeout=DEADLINE_S, stderr=subprocess.DEVNULL).returncode == 2
    status = client.read_status(job_dir)
    assert status is not None and status.finished and status.ranks == []
    assert status.error is not None and "launch.json" in status.error


def test_ranks_are_bound_to_the_chosen_cpus(jobs: Jobs) -> None:
    chosen = sorted(os.sched_getaffinity(0))[-1]
    out = jobs.root / "affinity.out"
    spec = dataclasses.replace(
        jobs.spec(jobs.rank(0, "grep Cpus_allowed_list /proc/self/status", stdout=str(out), stderr=str(out))),
        cpus=[chosen],
    )
    job_dir = jobs.job_dir()
    client.spawn(job_dir, spec)
    assert jobs.wait_finished(job_dir).ranks[0].exit_code == 0
    assert out.read_text().split()[-1] == str(chosen)
