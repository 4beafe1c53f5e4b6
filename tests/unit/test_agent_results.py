"""The agent's side of an attempt's end: how its result reaches the controller (nodeagent/agent.py)."""

from __future__ import annotations

import asyncio
import os
import pwd
from pathlib import Path

from helpers.polling import wait_until

from garrison.config import AgentConfig
from garrison.model.domain import Allocation, JobSpec, NodeAllocation, NodeInventory
from garrison.model.launch import LaunchDescription
from garrison.nodeagent.agent import Agent
from garrison.protos.v1 import garrison_pb2 as pb
from garrison.wire import convert

DEADLINE_S = 30.0


def trivial_launch(job_id: int) -> LaunchDescription:
    me = pwd.getpwuid(os.getuid())
    return LaunchDescription(
        job_id=job_id, attempt=0, user=me.pw_name, uid=me.pw_uid, gid=me.pw_gid,
        spec=JobSpec(name="quick", command=("true",), gpus_per_node=0, workdir="/tmp"),
        allocation=Allocation((NodeAllocation("n", ()),)), node_rank=0, master_addr="127.0.0.1",
        master_port=29500, restart_count=0, kill_wait_s=1.0, time_limit_s=60,
    )


def test_a_job_that_ends_before_its_launch_is_done_is_reported_without_waiting_for_the_rescan(
    tmp_path: Path,
) -> None:
    """The agent looks for a launched attempt's result when its supervisor's notification comes. A trivial
    job's notification can come before the launch is done (the attempt is not yet known as active then): it is
    kept, and the launch looks once it is done, rather than leaving the result to the once-a-second rescan."""
    inventory = NodeInventory(hostname="n", gpus=(), nvlink=(), topo=(), cpus=1, memory_mb=1024)
    agent = Agent(AgentConfig(state_dir=str(tmp_path / "agent")), "n", inventory, allow_root_jobs=True)
    agent.lease.granted(agent.lease.request(), 60.0)  # as the controller grants it: supervisors honour it
    key = (7, 0)
    real_launch = agent.jobs.launch

    def launch_and_wait_for_the_notification(launch: LaunchDescription) -> None:
        real_launch(launch)
        # Hold the launch back until its supervisor has ended and its notification has been taken in.
        wait_until(lambda: key in agent._ended_before_launched, DEADLINE_S, what="the early notification")

    agent.jobs.launch = launch_and_wait_for_the_notification  # type: ignore[method-assign]

    async def scenario() -> pb.AgentMessage:
        loop = asyncio.get_running_loop()
        notify = agent._open_notify_socket()
        loop.add_reader(notify.fileno(), agent._on_notify, notify)
        outbox: asyncio.Queue[pb.AgentMessage] = asyncio.Queue()
        agent.outbox = outbox  # no rescan loop runs here: only the launch's own look can find the result
        try:
            await agent._launch(convert.launch_to_pb(trivial_launch(key[0])))
            while True:
                message = await asyncio.wait_for(outbox.get(), DEADLINE_S)
                if message.WhichOneof("kind") == "finished":
                    return message
        finally:
            loop.remove_reader(notify.fileno())
            notify.close()
            agent._pool.shutdown(wait=True)
            agent._cleanup.shutdown(wait=True)

    finished = asyncio.run(scenario())
    assert (finished.finished.job_id, finished.finished.attempt) == key
    assert [rank.exit_code for rank in finished.finished.ranks] == [0] and not finished.finished.error, finished
    assert key not in agent._ended_before_launched and key not in agent.active
