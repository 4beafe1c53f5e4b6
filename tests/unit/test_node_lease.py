"""The node lease on the node's side: the agent's lease file, and supervisors that honour it by themselves
(real supervisors, real processes and signals), and a gang's start barrier.

Nothing sleeps to synchronise: tests wait for the supervisor's final status or a file under a deadline.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers.polling import wait_until

from garrison.model import lease as model_lease
from garrison.nodeagent.lease import NodeLease
from garrison.nodeagent.supervisor import client, core
from garrison.nodeagent.supervisor.spec import LaunchSpec, RankSpec, SupervisorStatus

DEADLINE_S = 15.0
SHELL_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin"}


def write_lease(path: Path, seconds_from_now: float) -> None:
    path.write_text(f"{core.boottime() + seconds_from_now:.6f}\n")


def launch(root: Path, name: str, script: str, *, lease_file: Path | None, barrier: bool = False,
           kill_wait_s: float = 5.0) -> Path:
    job_dir = root / name
    rank = RankSpec(rank=0, argv=["/bin/sh", "-c", script], env=dict(SHELL_ENV), cwd=str(root),
                    stdout=str(root / f"{name}.out"), stderr=str(root / f"{name}.out"))
    spec = LaunchSpec(job_id=7, attempt=0, uid=os.getuid(), gid=os.getgid(), groups=[], user="someone",
                      ranks=[rank], kill_wait_s=kill_wait_s,
                      lease_file=str(lease_file) if lease_file is not None else None, start_barrier=barrier)
    client.spawn(job_dir, spec)
    return job_dir


def finished(job_dir: Path) -> SupervisorStatus:
    def final() -> SupervisorStatus | None:
        status = client.read_status(job_dir)
        return status if status is not None and status.finished else None

    return wait_until(final, DEADLINE_S, what=f"{job_dir.name} to finish")


@pytest.fixture
def cleanup(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield tmp_path
    for job_dir in tmp_path.iterdir():
        if job_dir.is_dir():
            client.kill_now(job_dir)
            client.kill_orphans(job_dir)


# -- the agent's lease file --------------------------------------------------------------------------------


def test_a_grant_runs_from_when_its_request_was_sent_and_never_shortens_the_lease(tmp_path: Path) -> None:
    lease = NodeLease(tmp_path / "lease")
    assert lease.end is None and not lease.expired()
    first = lease.request()
    second = lease.request()
    assert lease.granted(second, 30.0)
    end = lease.end
    assert end is not None and core.read_lease_end(str(tmp_path / "lease")) == pytest.approx(end, abs=1e-5)
    assert end <= core.boottime() + 30.0
    # An older request answered late (or answered again) never moves the end back, nor forward past its own.
    assert not lease.granted(first, 30.0)
    assert not lease.granted(second, 60.0)  # each request is answered once
    assert not lease.granted(12345, 30.0)  # never sent
    assert lease.end == end
    assert oct((tmp_path / "lease").stat().st_mode & 0o777) == "0o644"


def test_a_lease_that_ran_out_is_seen_as_such_and_a_restarted_agent_inherits_it(tmp_path: Path) -> None:
    lease = NodeLease(tmp_path / "lease")
    since = core.boottime()
    assert lease.granted(lease.request(), 0.05)
    wait_until(lease.expired, 5, what="the lease to run out")
    assert lease.ran_out_since(since)
    assert not lease.ran_out_since(core.boottime())  # no grant since then: nothing ran out in that session
    assert NodeLease(tmp_path / "lease").end == pytest.approx(lease.end, abs=1e-5)
    (tmp_path / "garbled").write_text("soon\n")
    assert core.read_lease_end(str(tmp_path / "garbled")) is None


def test_a_refused_connection_extends_the_lease_from_when_it_was_tried_not_from_now(tmp_path: Path) -> None:
    """The agent tries the controller's port, is refused, then extends its lease; stalled in between (a GC
    pause, a starved CPU, SIGSTOP), it must not date the extension from when it resumed: a controller may
    have been listening since, counting this node's silence towards its fence delay."""
    lease = NodeLease(tmp_path / "lease")
    assert not lease.extend_while_no_controller(core.boottime())  # no lease held: nothing to extend
    assert lease.granted(lease.request(), 10.0)
    end = lease.end
    assert end is not None
    # Tried 3 s ago: its length from then ends before the lease held now, which stays as it is.
    assert not lease.extend_while_no_controller(core.boottime() - 3.0)
    assert lease.end == end and core.read_lease_end(str(tmp_path / "lease")) == pytest.approx(end, abs=1e-5)
    tried_at = core.boottime()
    assert lease.extend_while_no_controller(tried_at)
    assert lease.end == pytest.approx(tried_at + 10.0, abs=1e-5) and lease.end > end


def test_the_supervisors_check_interval_is_the_one_the_controller_counts_on() -> None:
    assert core.LEASE_CHECK_INTERVAL_S == model_lease.SUPERVISOR_LEASE_CHECK_S
    assert model_lease.fence_delay_s(10.0, 5.0) == 10.0 + 1.0 + 5.0 + model_lease.FENCE_MARGIN_S


# -- supervisors honour it ---------------------------------------------------------------------------------


def test_a_supervisor_stops_its_ranks_with_sigterm_when_the_lease_runs_out(cleanup: Path) -> None:
    root = cleanup
    lease_file = root / "lease"
    write_lease(lease_file, 1.0)
    marker = root / "got-term"
    job_dir = launch(root, "fenced", f"trap 'touch {marker}; exit 143' TERM; while :; do sleep 0.05; done",
                     lease_file=lease_file)
    status = finished(job_dir)
    assert status.lease_expired and status.terminated_by == "SIGTERM"
    assert marker.exists(), "the rank was not given SIGTERM first"
    assert [r.exit_code for r in status.ranks] == [143]
    assert status.finished_at is not None and status.started_at is not None
    assert status.finished_at - status.started_at < 1.0 + core.LEASE_CHECK_INTERVAL_S + 1.0


def test_a_rank_ignoring_sigterm_is_killed_after_the_kill_wait(cleanup: Path) -> None:
    root = cleanup
    lease_file = root / "lease"
    write_lease(lease_file, 0.5)
    job_dir = launch(root, "stubborn", "trap '' TERM; while :; do sleep 0.05; done", lease_file=lease_file,
                     kill_wait_s=0.5)
    status = finished(job_dir)
    assert status.lease_expired and [r.exit_code for r in status.ranks] == [128 + 9]


def test_a_rank_that_ended_on_its_own_before_the_lease_ran_out_keeps_its_exit_status(cleanup: Path) -> None:
    # The leader exits 0 but leaves a process in its group: the rank has ended (as a Slurm task) and the
    # leftover is killed at once, before the lease runs out; the rank's result is its own, not the lease's.
    root = cleanup
    lease_file = root / "lease"
    write_lease(lease_file, 1.0)
    status = finished(launch(root, "lingering", "sleep 30 & exit 0", lease_file=lease_file, kill_wait_s=0.5))
    assert not status.lease_expired and [r.exit_code for r in status.ranks] == [0]


def test_a_renewed_lease_lets_the_job_finish(cleanup: Path) -> None:
    root = cleanup
    lease_file = root / "lease"
    first_end = core.boottime() + 1.5
    lease_file.write_text(f"{first_end:.6f}\n")
    done = root / "may-end"
    job_dir = launch(root, "renewed", f"while [ ! -e {done} ]; do sleep 0.05; done; exit 0", lease_file=lease_file)
    write_lease(lease_file, 60.0)  # renewed, as the agent does on each grant
    # Past the first end and one more check, the supervisor has seen the renewal and kept the ranks.
    wait_until(lambda: core.boottime() > first_end + core.LEASE_CHECK_INTERVAL_S + 0.2, 10,
               what="the first lease's end and one check to pass")
    status = client.read_status(job_dir)
    assert status is not None and not status.finished
    done.touch()
    status = finished(job_dir)
    assert not status.lease_expired and [r.exit_code for r in status.ranks] == [0]


def test_no_rank_starts_once_the_lease_has_run_out(cleanup: Path) -> None:
    root = cleanup
    lease_file = root / "lease"
    write_lease(lease_file, -1.0)
    ran = root / "ran"
    status = finished(launch(root, "late", f"touch {ran}", lease_file=lease_file))
    assert status.lease_expired and not ran.exists()
    assert status.ranks[0].error == "not started: node lease expired"
    # A missing lease file is no lease, as well.
    status = finished(launch(root, "nolease", f"touch {ran}", lease_file=root / "absent"))
    assert status.lease_expired and not ran.exists()


# -- a gang's start barrier --------------------------------------------------------------------------------


def test_the_ranks_wait_at_the_barrier_until_the_gang_is_released(cleanup: Path) -> None:
    root = cleanup
    ran = root / "ran"
    job_dir = launch(root, "held", f"touch {ran}", lease_file=None, barrier=True)
    status = wait_until(lambda: client.read_status(job_dir), DEADLINE_S, what="the supervisor to start")
    assert status.state == "starting" and client.is_alive(job_dir)
    assert not ran.exists()
    assert client.release(job_dir)
    status = finished(job_dir)
    assert ran.exists() and [r.exit_code for r in status.ranks] == [0]


def test_a_gang_stopped_at_the_barrier_runs_no_user_code(cleanup: Path) -> None:
    root = cleanup
    ran = root / "ran"
    job_dir = launch(root, "stopped", f"touch {ran}", lease_file=None, barrier=True)
    wait_until(lambda: client.read_status(job_dir), DEADLINE_S, what="the supervisor to start")
    assert client.terminate(job_dir)
    status = finished(job_dir)
    assert not ran.exists()
    assert status.ranks[0].error == "not started: SIGTERM requested before start"


def test_a_stop_requested_while_the_supervisor_was_being_started_is_not_lost(cleanup: Path) -> None:
    # The agent's stop came between the job directory's creation and the supervisor's start, when there was
    # no pid to signal: the request file alone must stop the attempt, barrier or not.
    root = cleanup
    ran = root / "ran"
    for name, barrier in (("early-barrier", True), ("early-plain", False)):
        job_dir = root / name
        job_dir.mkdir()
        (job_dir / core.TERMINATE_REQUEST_FILE).touch()
        status = finished(launch(root, name, f"touch {ran}", lease_file=None, barrier=barrier))
        assert not ran.exists() and status.ranks[0].error == "not started: SIGTERM requested before start"


def test_a_lease_running_out_at_the_barrier_starts_nothing(cleanup: Path) -> None:
    root = cleanup
    lease_file = root / "lease"
    write_lease(lease_file, 0.3)
    ran = root / "ran"
    status = finished(launch(root, "expired", f"touch {ran}", lease_file=lease_file, barrier=True))
    assert status.lease_expired and not ran.exists()


# -- the agent's job manager: launches under the lease, and its own stop when the lease ran out ----------


def test_the_agent_launches_under_the_lease_and_a_stop_for_the_lease_is_reported_as_such(cleanup: Path) -> None:
    import pwd

    from garrison.model.domain import Allocation, JobSpec, NodeAllocation
    from garrison.model.launch import LaunchDescription
    from garrison.nodeagent.jobs import JobManager

    root = cleanup
    lease = NodeLease(root / "agent-lease")
    assert lease.granted(lease.request(), 60.0)
    manager = JobManager(root / "agent", str(root / "notify.sock"), allow_root_jobs=True, lease_file=lease.path)
    me = pwd.getpwuid(os.getuid())
    manager.launch(LaunchDescription(
        job_id=3, attempt=0, user=me.pw_name, uid=me.pw_uid, gid=os.getgid(),
        spec=JobSpec(name="s", command=("sleep", "60"), gpus_per_node=1, workdir="/tmp"),
        allocation=Allocation((NodeAllocation("n1", (0,)), NodeAllocation("n2", (0,)))), node_rank=0,
        master_addr="127.0.0.1", master_port=29517, restart_count=0, kill_wait_s=1.0, time_limit_s=60,
        start_barrier=True,
    ))
    job_dir = manager.job_dir(3, 0)
    spec = LaunchSpec.from_json((job_dir / core.LAUNCH_FILE).read_text())
    assert spec.lease_file == str(lease.path) and spec.start_barrier
    assert manager.result(3, 0) is None
    assert manager.release(3, 0)
    wait_until(lambda: (client.read_status(job_dir) or finished_status_placeholder()).state == "running",
               DEADLINE_S, what="the released ranks to run")
    assert manager.stop_for_lease(3, 0)
    result = wait_until(lambda: manager.result(3, 0), DEADLINE_S, what="the attempt to end")
    assert result.lease_expired and [r.exit_code for r in result.ranks] == [-15]  # the job's: killed by SIGTERM


def finished_status_placeholder() -> SupervisorStatus:
    return SupervisorStatus(job_id=None, attempt=None, supervisor_pid=0, state="starting", started_at=None,
                            finished_at=None)
