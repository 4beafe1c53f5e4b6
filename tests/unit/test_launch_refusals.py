"""What a node says when it will not or cannot run an attempt: a user name that maps to another uid there
(or is unknown there), and a supervisor that died under its job."""

from __future__ import annotations

import os
import pwd
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.polling import wait_until

from garrison.model.domain import Allocation, JobSpec, NodeAllocation
from garrison.model.launch import LaunchDescription
from garrison.nodeagent.jobs import JobManager, RefusedLaunch


def request(user: str, uid: int) -> LaunchDescription:
    return LaunchDescription(
        job_id=1, attempt=0, user=user, uid=uid, gid=os.getgid(),
        spec=JobSpec(name="who", command=("true",), gpus_per_node=1, workdir="/tmp"),
        allocation=Allocation((NodeAllocation("n", (0,)),)), node_rank=0, master_addr="127.0.0.1",
        master_port=29500, restart_count=0, kill_wait_s=1.0, time_limit_s=60,
    )


def unused_uid() -> int:
    uid = 4242
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1


def test_a_user_name_with_another_uid_here_is_refused(tmp_path: Path) -> None:
    manager = JobManager(tmp_path / "agent", str(tmp_path / "notify.sock"), allow_root_jobs=True)
    me = pwd.getpwuid(os.getuid()).pw_name
    other = unused_uid()
    with pytest.raises(RefusedLaunch, match=f"user {me} is uid {os.getuid()} on this node but submitted as uid "
                                            f"{other}: user ids must be the same on every node"):
        manager.launch(request(me, other))
    with pytest.raises(RefusedLaunch, match=f"user no-such-user-gtest \\(uid {other}\\) does not exist on this node"):
        manager.launch(request("no-such-user-gtest", other))
    assert not any((tmp_path / "agent").rglob("*.new")), "a refused launch leaves nothing behind"


def test_a_supervisor_killed_under_its_job_is_reported_with_its_last_words(tmp_path: Path) -> None:
    import signal

    from garrison.nodeagent.supervisor import client as supervisor

    manager = JobManager(tmp_path / "agent", str(tmp_path / "notify.sock"), allow_root_jobs=True)
    me = pwd.getpwuid(os.getuid())
    sleeper = JobSpec(name="s", command=("sleep", "60"), gpus_per_node=1, workdir="/tmp")
    manager.launch(replace(request(me.pw_name, me.pw_uid), spec=sleeper))
    job_dir = manager.job_dir(1, 0)

    def status_with_the_rank_pgid() -> supervisor.SupervisorStatus | None:
        status = supervisor.read_status(job_dir)
        return status if status is not None and status.ranks and status.ranks[0].pgid is not None else None

    status = wait_until(status_with_the_rank_pgid, 20, what="the supervisor to report its rank's process group")
    with open(job_dir / "supervisor.log", "a") as log:
        log.write("RuntimeError: the last thing it said\n")  # what a crashing supervisor leaves behind
    pid = supervisor.supervisor_pid(job_dir)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not supervisor.is_alive(job_dir), 20, what="the supervisor to die")
    result = manager.result(1, 0)
    assert result is not None and result.error == "supervisor died: RuntimeError: the last thing it said"
    assert result.supervisor_lost  # the node's failure: the controller requeues the job
    # What it left running was killed (the rank's process group is gone once init has reaped it).
    pgid = status.ranks[0].pgid

    def group_is_gone() -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_until(group_is_gone, 20, what=f"init to reap the killed rank's process group {pgid}")
