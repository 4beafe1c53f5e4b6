"""cgroup v1 containment against the real kernel: no fake cgroup filesystem.

Every test gets its own cgroup subtree (``garrison-test-<random>``, below this process's own cgroup in each
hierarchy), so parallel runs never meet, and removes it afterwards. These tests need root and the v1
controllers (memory, cpuset, devices, pids, freezer, cpuacct), as on the CI hosts; elsewhere they skip.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.polling import wait_until

from garrison.nodeagent.containment import probe
from garrison.nodeagent.containment.cgroup_v1 import CgroupV1, remove_subtree, v1_hierarchies
from garrison.nodeagent.containment.interface import ENFORCING, AttemptLimits, ContainmentError
from garrison.nodeagent.jobs import JOBS_DIR, JobManager
from garrison.nodeagent.supervisor import cgroup_runtime, client
from garrison.nodeagent.supervisor.spec import LaunchSpec, RankSpec, SupervisorStatus

DEADLINE_S = 30.0
SHELL_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
PYTHON = "/usr/bin/python3"
NO_LIMITS = AttemptLimits()


def process_is_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            return stat_file.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


class Attempts:
    """Makes attempt cgroups in a subtree of the test's own, runs supervisors in them, cleans up."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cgroup_root = f"garrison-test-{uuid.uuid4().hex[:12]}"
        self.containment = CgroupV1.probe(self.cgroup_root)
        self.made: list[dict[str, str]] = []
        self.job_dirs: list[Path] = []

    def cgroup(self, limits: AttemptLimits) -> dict[str, str]:
        dirs = self.containment.create(f"job_{len(self.made) + 1}_0", limits)
        assert dirs is not None
        self.made.append(dict(dirs))
        return dict(dirs)

    def run(self, script: str, limits: AttemptLimits = NO_LIMITS, *, job_dir: Path | None = None,
            kill_wait_s: float = 5.0, name: str = "") -> tuple[Path, LaunchSpec]:
        dirs = self.cgroup(limits)
        number = len(self.made)
        output = str(self.root / f"{name or number}.out")
        spec = LaunchSpec(
            job_id=number, attempt=0, uid=os.getuid(), gid=os.getgid(), groups=[], user="someone",
            ranks=[RankSpec(rank=0, argv=["/bin/sh", "-c", script], cwd=str(self.root), stdout=output,
                            stderr=output, env={**SHELL_ENV, "WORK": str(self.root)})],
            kill_wait_s=kill_wait_s, cgroup=dirs,
        )
        job_dir = job_dir or self.root / f"job{number}"
        self.job_dirs.append(job_dir)
        client.spawn(job_dir, spec)
        return job_dir, spec

    @staticmethod
    def wait_finished(job_dir: Path, timeout: float = DEADLINE_S) -> SupervisorStatus:
        def finished() -> SupervisorStatus | None:
            status = client.read_status(job_dir)
            return status if status is not None and status.finished else None

        return wait_until(finished, timeout, what=f"{job_dir.name} to finish")

    def close(self) -> None:
        for job_dir in self.job_dirs:
            client.kill_now(job_dir)
            client.kill_orphans(job_dir)
        for dirs in self.made:
            self.containment.destroy(dirs)
        remove_subtree(self.cgroup_root)


@pytest.fixture
def attempts(tmp_path: Path) -> Iterator[Attempts]:
    os.chmod(tmp_path, 0o755)
    made = Attempts(tmp_path)
    if set(made.containment.capabilities.enforced) != set(ENFORCING):
        made.close()
        pytest.skip(f"needs root and writable cgroup v1 controllers: {made.containment.capabilities.checks}")
    try:
        yield made
    finally:
        made.close()


def wait_for_file(path: Path) -> str:
    return wait_until(lambda: path.read_text().strip() if path.exists() and path.read_text().strip() else None,
                      DEADLINE_S, what=f"{path.name} to be written")


def test_a_level_another_agent_made_and_has_not_filled_in_yet_is_filled(tmp_path: Path) -> None:
    """The agents of one local cluster start at once and share their cgroup_root's first levels: one may
    find a cpuset level another has just made, still without CPUs or memory nodes. Its own node's level
    must not copy that emptiness (joining a cpuset without memory nodes fails with ENOSPC)."""
    cpuset = v1_hierarchies().get("cpuset")
    if os.geteuid() != 0 or cpuset is None:
        pytest.skip("needs root and the cpuset controller mounted as cgroup v1")
    shared = f"garrison-test-{uuid.uuid4().hex[:12]}"
    os.mkdir(cpuset.subtree(shared))  # as another agent's mkdir leaves it, before it copies its parent's
    node = f"{shared}/node3"
    containment = CgroupV1.probe(node)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        for level in (shared, node):
            for name in ("cpuset.cpus", "cpuset.mems"):
                assert Path(cpuset.subtree(level), name).read_text().strip(), (level, name)
        Path(cpuset.subtree(node), "cgroup.procs").write_text(str(sleeper.pid))  # ENOSPC if it had no mems
        assert str(sleeper.pid) in Path(cpuset.subtree(node), "cgroup.procs").read_text().split()
    finally:
        sleeper.kill()
        sleeper.wait()
        assert containment.subtrees
        remove_subtree(node)


def test_the_probe_finds_every_controller_and_check_prints_them(attempts: Attempts, tmp_path: Path) -> None:
    capabilities = attempts.containment.capabilities
    assert capabilities.confined and capabilities.summary() == "cgroup-v1: memory,cpuset,devices,pids,freezer"
    lines = probe.report(capabilities)
    assert lines[0] == "containment: cgroup-v1: memory,cpuset,devices,pids,freezer"
    assert any(line.split()[:2] == ["cpuacct", "yes"] for line in lines)
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nstate_dir = "{tmp_path / "state"}"\ncgroup_root = "{attempts.cgroup_root}"\n')
    check = subprocess.run([sys.executable, "-m", "garrison.nodeagent.main", "--check", "--config", str(config)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    assert check.stdout.splitlines()[0] == "containment: cgroup-v1: memory,cpuset,devices,pids,freezer"


def test_a_host_with_nothing_to_enforce_refuses_unless_unconfined_is_allowed(tmp_path: Path) -> None:
    # A host where no v1 hierarchy is mounted (e.g. cgroup v2 only): nothing can be enforced.
    cgroup_root = f"garrison-test-{uuid.uuid4().hex[:12]}"
    with pytest.raises(probe.NothingEnforceable, match="allow_unconfined"):
        probe.choose(cgroup_root, allow_unconfined=False, hierarchies={})
    unconfined = probe.choose(cgroup_root, allow_unconfined=True, hierarchies={})
    assert unconfined.capabilities.summary() == "unconfined"
    assert unconfined.create("job_1_0", AttemptLimits()) is None
    assert all(not check.usable and check.detail == "not mounted as cgroup v1" for check in
               unconfined.capabilities.checks if check.name != "cgroup2")
    config = tmp_path / "agent.toml"
    config.write_text('[agent]\ncgroup_root = "no/../escape"\n')
    bad = subprocess.run([sys.executable, "-m", "garrison.nodeagent.main", "--check", "--config", str(config)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "cgroup_root" in bad.stderr


def test_daemons_left_by_the_script_die_with_the_attempt(attempts: Attempts, tmp_path: Path) -> None:
    # setsid + double fork + nohup: out of the rank's process group and session, reparented away.
    job_dir, spec = attempts.run(
        '(setsid sh -c \'echo $$ > "$WORK/daemon.pid"; exec nohup sleep 300 >/dev/null 2>&1\' &) ; '
        'while [ ! -s "$WORK/daemon.pid" ]; do sleep 0.01; done; exit 0'
    )
    status = attempts.wait_finished(job_dir)
    daemon = int((tmp_path / "daemon.pid").read_text())
    assert process_is_gone(daemon)
    assert status.ranks[0].exit_code == 0 and not status.out_of_memory
    assert status.usage is not None and status.usage["cpu_time_ns"] > 0
    assert spec.cgroup is not None and not any(os.path.exists(d) for d in spec.cgroup.values())


def test_terminate_kills_what_escaped_the_process_group(attempts: Attempts, tmp_path: Path) -> None:
    # gcancel, a time limit and a preemption all end an attempt through the supervisor's terminate.
    job_dir, spec = attempts.run(
        'setsid sh -c \'trap "" TERM; echo $$ > "$WORK/daemon.pid"; exec sleep 300\' & '
        'while true; do sleep 0.05; done', kill_wait_s=0.5,
    )
    daemon = int(wait_for_file(tmp_path / "daemon.pid"))
    assert client.terminate(job_dir)
    status = attempts.wait_finished(job_dir)
    assert status.terminated_by == "SIGTERM"
    assert process_is_gone(daemon)
    assert spec.cgroup is not None and not any(os.path.exists(d) for d in spec.cgroup.values())


def test_memory_limit_kills_only_the_job_that_passed_it(attempts: Attempts, tmp_path: Path) -> None:
    hog, _ = attempts.run(f'{PYTHON} -c "x = bytearray(512 << 20); print(len(x))"',
                          AttemptLimits(memory_bytes=64 << 20), name="hog")
    neighbour, _ = attempts.run(f'{PYTHON} -c "x = bytearray(100 << 20); print(\'fine\', len(x))"', name="neighbour")
    hog_status = attempts.wait_finished(hog)
    assert hog_status.out_of_memory
    assert hog_status.ranks[0].exit_code == 128 + signal.SIGKILL
    assert hog_status.usage is not None and hog_status.usage["oom_kills"] >= 1
    assert "oom_kill event" in (tmp_path / "hog.out").read_text()
    neighbour_status = attempts.wait_finished(neighbour)
    assert neighbour_status.ranks[0].exit_code == 0 and not neighbour_status.out_of_memory
    assert (tmp_path / "neighbour.out").read_text().startswith("fine")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_the_cpuset_cannot_be_widened(attempts: Attempts, tmp_path: Path) -> None:
    mine, other = sorted(os.sched_getaffinity(0))[-1], sorted(os.sched_getaffinity(0))[0]
    # The scheduler's choice on a large fake machine: one CPU this host has, others it does not.
    job_dir, _ = attempts.run(
        f'{PYTHON} -c "import os\nprint(sorted(os.sched_getaffinity(0)))\n'
        f'try:\n    os.sched_setaffinity(0, {{{other}}})\n    print(\'widened\')\n'
        f'except OSError as e:\n    print(\'refused\', e.errno)"',
        AttemptLimits(cpus=(mine, 200, 201)), name="cpus",
    )
    attempts.wait_finished(job_dir)
    first, second = (tmp_path / "cpus.out").read_text().splitlines()
    assert first == f"[{mine}]"
    assert second == f"refused {errno.EINVAL}"


@pytest.mark.parametrize("only_listed", [False, True], ids=["gpus", "allowlist"])
def test_only_the_allocated_gpus_device_files_open(attempts: Attempts, tmp_path: Path, only_listed: bool) -> None:
    """job_devices = "gpus" (Slurm's ConstrainDevices=yes) denies the node's other GPUs and nothing else, so an
    InfiniBand verbs device (as NCCL opens across nodes) opens; "allowlist" denies every device not listed."""
    # A fake machine's device nodes: NVIDIA's major 195, and InfiniBand's uverbs (231:192), no driver behind
    # them (ENXIO where the cgroup lets them open).
    devices = tmp_path / "dev"
    devices.mkdir()
    for name, major, minor in (("nvidia0", 195, 0), ("nvidia1", 195, 1), ("nvidia255", 195, 255),
                               ("uverbs0", 231, 192)):
        os.mknod(devices / name, 0o666 | 0o020000, os.makedev(major, minor))
    probe_script = (
        "import os, sys\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n        os.close(os.open(name, os.O_RDWR)); print(name, 'opened')\n"
        "    except OSError as e:\n        print(os.path.basename(name), e.errno)\n"
    )
    (tmp_path / "probe.py").write_text(probe_script)
    paths = " ".join(str(devices / name) for name in ("nvidia0", "nvidia1", "nvidia255", "uverbs0"))
    job_dir, _ = attempts.run(
        f"{PYTHON} {tmp_path / 'probe.py'} {paths} /dev/null",
        AttemptLimits(gpu_minors=(0,), other_gpu_minors=(1,), only_listed_devices=only_listed), name="devices",
    )
    attempts.wait_finished(job_dir)
    uverbs = errno.EPERM if only_listed else errno.ENXIO
    assert (tmp_path / "devices.out").read_text().splitlines() == [
        f"nvidia0 {errno.ENXIO}", f"nvidia1 {errno.EPERM}", f"nvidia255 {errno.ENXIO}", f"uverbs0 {uverbs}",
        "/dev/null opened",
    ]


def test_a_fork_bomb_stays_inside_its_pids_limit(attempts: Attempts, tmp_path: Path) -> None:
    bomb = (
        "import os, signal\n"
        "refused = 0\n"
        "for _ in range(100):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        refused += 1\n"
        "        continue\n"
        "    if pid == 0:\n"
        "        os.setsid()\n"
        "        signal.pause()\n"
        "print('refused', refused, flush=True)\n"
    )
    (tmp_path / "bomb.py").write_text(bomb)
    job_dir, spec = attempts.run(f"{PYTHON} {tmp_path / 'bomb.py'}", AttemptLimits(pids_max=40), name="bomb")
    status = attempts.wait_finished(job_dir)  # the script ends; the children it left die with the attempt
    refused = int((tmp_path / "bomb.out").read_text().split()[1])
    assert 100 - refused < 40 <= 100 - refused + 2  # at most pids.max tasks, the shell and python included
    assert status.finished
    assert spec.cgroup is not None and not any(os.path.exists(d) for d in spec.cgroup.values())


def test_usage_is_what_the_job_used(attempts: Attempts, tmp_path: Path) -> None:
    job = (
        "import resource, time\n"
        "block = bytearray(300 << 20)\n"
        "for i in range(0, len(block), 4096): block[i] = 1\n"
        "end = time.process_time() + 1.0\n"
        "while time.process_time() < end: pass\n"
        "usage = resource.getrusage(resource.RUSAGE_SELF)\n"
        "print(usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime)\n"
    )
    (tmp_path / "use.py").write_text(job)
    job_dir, _ = attempts.run(f"exec {PYTHON} {tmp_path / 'use.py'}", name="usage")
    status = attempts.wait_finished(job_dir)
    rss, cpu = (tmp_path / "usage.out").read_text().split()
    assert status.usage is not None
    assert abs(status.usage["max_rss_bytes"] - int(rss)) <= 0.1 * int(rss), (status.usage, rss)
    assert abs(status.usage["cpu_time_ns"] / 1e9 - float(cpu)) <= 0.1 * float(cpu), (status.usage, cpu)


def test_an_agent_finding_its_supervisor_dead_empties_the_cgroup(attempts: Attempts, tmp_path: Path) -> None:
    state_dir = tmp_path / "agent"
    manager = JobManager(state_dir, str(tmp_path / "notify.sock"), allow_root_jobs=True,
                         containment=attempts.containment)
    job_dir = state_dir / JOBS_DIR / "41.0"
    job_dir, spec = attempts.run(
        'setsid sh -c \'echo $$ > "$WORK/daemon.pid"; exec sleep 300\' & while true; do sleep 0.05; done',
        job_dir=job_dir,
    )
    daemon = int(wait_for_file(tmp_path / "daemon.pid"))
    status = client.read_status(job_dir)
    assert status is not None
    assert manager.result(41, 0) is None  # a restarted agent re-adopts a running attempt: nothing is killed
    assert not process_is_gone(daemon)
    os.kill(status.supervisor_pid, signal.SIGKILL)
    wait_until(lambda: not client.is_alive(job_dir), DEADLINE_S, what="the supervisor to die")
    result = manager.result(41, 0)
    assert result is not None and result.error.startswith("supervisor died")
    assert process_is_gone(daemon)
    assert spec.cgroup is not None and not any(os.path.exists(d) for d in spec.cgroup.values())


def test_kill_orphans_empties_a_dead_supervisors_cgroup(attempts: Attempts, tmp_path: Path) -> None:
    """A supervisor in a cgroup records no process groups while its ranks run (the cgroup holds them): what
    it leaves when it dies is found there, the rank's own process group included (a job step's supervisor
    has no agent destroying its cgroup afterwards)."""
    job_dir, _spec = attempts.run('echo $$ > "$WORK/rank.pid"; exec sleep 300')
    rank = int(wait_for_file(tmp_path / "rank.pid"))
    status = client.read_status(job_dir)
    assert status is not None and status.state == "starting"  # no process group recorded
    assert client.kill_orphans(job_dir) == []  # alive: nothing is touched
    assert not process_is_gone(rank)
    os.kill(status.supervisor_pid, signal.SIGKILL)
    wait_until(lambda: not client.is_alive(job_dir), DEADLINE_S, what="the supervisor to die")
    client.kill_orphans(job_dir)
    wait_until(lambda: process_is_gone(rank), DEADLINE_S, what="the rank to be killed")


def test_launch_json_carries_the_cgroup_and_the_supervisor_reads_it(attempts: Attempts) -> None:
    dirs = attempts.cgroup(AttemptLimits())
    spec = LaunchSpec(job_id=1, attempt=0, uid=0, gid=0, groups=[], user="u",
                      ranks=[RankSpec(rank=0, argv=["true"], env={}, cwd="/", stdout="o", stderr="o")],
                      kill_wait_s=1.0, cgroup=dirs, gpus=[3])
    assert LaunchSpec.from_json(spec.to_json()) == spec
    from garrison.nodeagent.supervisor import core

    assert core.Launch(json.loads(spec.to_json())).cgroup == dirs
    with pytest.raises(ValueError):
        LaunchSpec.from_json(json.dumps({**json.loads(spec.to_json()), "cgroup": {"memory": 3}}))


def test_a_child_cgroup_for_a_job_step_inherits_the_limits_and_dies_with_the_attempt(attempts: Attempts) -> None:
    dirs = attempts.cgroup(AttemptLimits(memory_bytes=256 << 20, pids_max=50))
    step = attempts.containment.create_child(dirs, "step_0")
    assert all(path == os.path.join(dirs[name], "step_0") for name, path in step.items())
    assert Path(step["cpuset"], "cpuset.cpus").read_text() == Path(dirs["cpuset"], "cpuset.cpus").read_text()
    from garrison.nodeagent.supervisor import cgroup_runtime

    process = subprocess.Popen(["sleep", "300"], preexec_fn=lambda: cgroup_runtime.join(step))  # noqa: PLW1509
    try:
        with open(f"/proc/{process.pid}/cgroup") as own:
            assert any(line.endswith("/step_0") for line in own.read().splitlines() if ":memory:" in line)
        assert cgroup_runtime.members(dirs) == [process.pid]  # the attempt's members include its steps'
        assert attempts.containment.destroy(dirs)  # kills the step's process too, and removes both levels
        assert process.wait(timeout=DEADLINE_S) == -signal.SIGKILL
        assert not any(os.path.exists(path) for path in (*dirs.values(), *step.values()))
    finally:
        process.kill()
        process.wait()


def test_acknowledging_an_attempt_removes_a_cgroup_an_agent_crash_left(attempts: Attempts, tmp_path: Path) -> None:
    # An agent that made the attempt's cgroup and crashed before its supervisor started: the cgroup is
    # empty, and goes once the controller has the (failed) result.
    manager = JobManager(tmp_path / "agent", str(tmp_path / "notify.sock"), allow_root_jobs=True,
                         containment=attempts.containment)
    dirs = attempts.containment.create("job_7_0", AttemptLimits())
    assert dirs is not None and all(os.path.isdir(path) for path in dirs.values())
    (tmp_path / "agent" / JOBS_DIR / "7.0").mkdir()
    result = manager.result(7, 0)
    assert result is not None and result.error == "launch did not complete"
    manager.acknowledge(7, 0)
    assert not any(os.path.exists(path) for path in dirs.values())


def test_an_existing_cgroup_of_the_same_name_is_never_shared(attempts: Attempts) -> None:
    # Another agent given the same cgroup_root (a misconfiguration) runs job 1's attempt 0 too: ours must
    # fail to launch rather than join theirs, or our attempt's end would kill their processes.
    theirs = attempts.cgroup(AttemptLimits())
    process = subprocess.Popen(["sleep", "300"], preexec_fn=lambda: cgroup_runtime.join(theirs))  # noqa: PLW1509
    try:
        with pytest.raises(ContainmentError, match="exists already"):
            attempts.containment.create("job_1_0", AttemptLimits())
        assert process.poll() is None and cgroup_runtime.members(theirs) == [process.pid]
        assert all(os.path.isdir(path) for path in theirs.values())
    finally:
        process.kill()
        process.wait()
