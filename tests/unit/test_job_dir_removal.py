"""An acknowledged attempt's job directory (nodeagent/jobs.py): renamed out of the attempts' names in one step,
then removed without following what the job's user put in it; a removal an agent did not finish is finished
at its next start. Real directories; the agent runs acknowledge on a thread of its own (nodeagent/agent.py)."""

from __future__ import annotations

import os
from pathlib import Path

from garrison.nodeagent.jobfiles import remove_tree
from garrison.nodeagent.jobs import JOBS_DIR, REMOVING_SUFFIX, JobManager


def manager(tmp_path: Path) -> JobManager:
    return JobManager(tmp_path / "agent", str(tmp_path / "notify.sock"), allow_root_jobs=True)


def finished_attempt(jobs: JobManager, job_id: int, victim: Path) -> Path:
    job_dir = jobs.job_dir(job_id, 0)
    (job_dir / "user").mkdir(parents=True)
    (job_dir / "status.json").write_text("{}")
    # The job's user may leave a link to anything in its own directory: removing must not follow it.
    (job_dir / "user" / "link").symlink_to(victim)
    return job_dir


def test_acknowledging_removes_the_job_directory_and_never_what_a_link_in_it_names(tmp_path: Path) -> None:
    jobs = manager(tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    job_dir = finished_attempt(jobs, 7, victim)
    assert jobs.attempts() == [(7, 0)]
    jobs.acknowledge(7, 0)
    assert not job_dir.exists() and jobs.attempts() == []
    assert os.listdir(tmp_path / "agent" / JOBS_DIR) == []
    assert (victim / "keep").read_text() == "x"
    jobs.acknowledge(7, 0)  # acknowledged again (a result reported again after a reconnect): nothing to do


def test_a_removal_an_agent_did_not_finish_is_no_attempt_and_is_finished_at_the_next_start(tmp_path: Path) -> None:
    jobs = manager(tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir()
    job_dir = finished_attempt(jobs, 8, victim)
    # What acknowledge's rename leaves if the agent dies before its rmtree ends.
    job_dir.rename(job_dir.with_name(job_dir.name + REMOVING_SUFFIX))
    restarted = manager(tmp_path)
    assert restarted.attempts() == []  # never reported as an attempt, running or finished
    assert restarted.remove_leftover_removals() == 1
    assert os.listdir(tmp_path / "agent" / JOBS_DIR) == [] and victim.is_dir()


def test_remove_tree_removes_what_a_job_left_in_its_user_directory_and_follows_no_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    tree = tmp_path / "jobs" / "9.0"
    user = tree / "user"
    (user / "deep" / "deeper").mkdir(parents=True)
    (user / "deep" / "deeper" / "file").write_text("y")
    (user / "to-dir").symlink_to(victim)
    (user / "deep" / "to-file").symlink_to(victim / "keep")
    os.mkfifo(user / "fifo")
    (tree / "empty-subdir").mkdir()
    (tree / "status.json").write_text("{}")
    (tree / "top-link").symlink_to(victim)
    remove_tree(tree)
    assert not tree.exists() and not tree.is_symlink()
    assert sorted(os.listdir(victim)) == ["keep"] and (victim / "keep").read_text() == "x"
    remove_tree(tree)  # gone already: nothing to do


def test_remove_tree_given_a_link_leaves_what_it_names(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    link = tmp_path / "link"
    link.symlink_to(victim)
    remove_tree(link)
    assert (victim / "keep").read_text() == "x"


def test_a_scratch_directory_elsewhere_goes_with_its_attempt_and_leftovers_with_the_next_start(tmp_path: Path) -> None:
    """The agent's scratch_dir: each attempt's SLURM_TMPDIR is DIR/JOB.ATTEMPT, removed when the attempt is
    acknowledged (links in it not followed); one whose attempt is gone is removed at the next start, one
    whose attempt still runs is kept."""
    scratch = tmp_path / "scratch"
    jobs = JobManager(tmp_path / "agent", str(tmp_path / "notify.sock"), allow_root_jobs=True,
                      scratch_dir=str(scratch))
    assert jobs.scratch_dir(7, 0) == scratch / "7.0" and oct(scratch.stat().st_mode & 0o777) == "0o711"
    victim = tmp_path / "victim"
    victim.mkdir()
    finished_attempt(jobs, 7, victim)
    (scratch / "7.0" / "env" / "bin").mkdir(parents=True)
    (scratch / "7.0" / "data").symlink_to(victim)
    jobs.acknowledge(7, 0)
    assert os.listdir(scratch) == [] and victim.is_dir()
    finished_attempt(jobs, 8, victim)  # still here (running, for the scan)
    (scratch / "8.0").mkdir()
    (scratch / "9.0").mkdir()  # its attempt's directory is gone: an agent died between the two removals
    assert manager_with(tmp_path, scratch).remove_leftover_removals() == 1
    assert sorted(os.listdir(scratch)) == ["8.0"]


def manager_with(tmp_path: Path, scratch: Path) -> JobManager:
    return JobManager(tmp_path / "agent", str(tmp_path / "notify.sock"), allow_root_jobs=True,
                      scratch_dir=str(scratch))
