"""A node refuses to run a job whose user name maps to another uid there (or is unknown there), rather than
run it as someone else or without that person's groups."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from garrison.controller.domain import Allocation, JobSpec, NodeAllocation
from garrison.nodeagent.jobs import JobManager, LaunchRequest, RefusedLaunch


def request(user: str, uid: int) -> LaunchRequest:
    return LaunchRequest(
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
