"""The node lease and the start barrier on the wire: lease requests in, grants and releases out, the fenced
result and the barrier flag both ways."""

from __future__ import annotations

from garrison.controller.commands import LeaseGrant, StillAlive
from garrison.controller.instructions import ReleaseGang
from garrison.controller.rpc.convert_requests import (
    agent_event_from_pb,
    instruction_to_pb,
    registration_from_pb,
)
from garrison.model.domain import Allocation, JobSpec, NodeAllocation, NodeResult, RankOutcome
from garrison.model.launch import LaunchDescription
from garrison.nodeagent.agent import result_to_pb
from garrison.nodeagent.jobs import AttemptResult
from garrison.nodeagent.jobs import RankResult as AgentRankResult
from garrison.protos.v1 import garrison_pb2 as pb
from garrison.wire.convert import launch_from_pb, launch_to_pb, result_from_pb


def test_lease_requests_become_events_and_grants_become_messages() -> None:
    heartbeat = pb.AgentMessage(heartbeat=pb.Heartbeat(time=1.0, lease_request=41))
    # A heartbeat also says whether the node has a fault ("": none); another message proves only life.
    assert agent_event_from_pb(heartbeat) == StillAlive(lease_request=41, node_fault="")
    assert agent_event_from_pb(pb.AgentMessage(heartbeat=pb.Heartbeat(time=1.0))) == StillAlive(node_fault="")
    assert agent_event_from_pb(pb.AgentMessage()) == StillAlive()
    faulty = pb.AgentMessage(heartbeat=pb.Heartbeat(time=1.0, node_fault="disk\nfull\x1b[2J" + "x" * 500))
    fault = agent_event_from_pb(faulty).node_fault  # type: ignore[union-attr]
    assert fault is not None and fault.startswith("disk?full?[2J") and len(fault) == 200
    register = pb.Register(node_name="n1", lease_request=7)
    assert registration_from_pb(register, "10.0.0.1").lease_request == 7
    grant = instruction_to_pb(LeaseGrant(41, 60.0))
    assert grant.WhichOneof("kind") == "lease" and (grant.lease.request, grant.lease.duration_s) == (41, 60.0)
    release = instruction_to_pb(ReleaseGang("n2", 9, 1))
    assert release.WhichOneof("kind") == "release" and (release.release.job_id, release.release.attempt) == (9, 1)


def test_a_fenced_result_and_the_barrier_flag_travel_both_ways() -> None:
    fenced = AttemptResult(9, 1, (AgentRankResult(0, 143),), lease_expired=True)
    assert result_from_pb(result_to_pb(fenced)) == NodeResult(9, 1, (RankOutcome(0, 143),), lease_expired=True)
    lost = AttemptResult(9, 2, (), error="supervisor died", supervisor_lost=True)
    assert result_from_pb(result_to_pb(lost)) == NodeResult(9, 2, (), error="supervisor died", supervisor_lost=True)
    assert not result_from_pb(result_to_pb(AttemptResult(9, 1, ()))).lease_expired
    launch = LaunchDescription(
        job_id=9, attempt=1, user="alice", uid=1000, gid=1000, spec=JobSpec(name="t", command=("true",)),
        allocation=Allocation((NodeAllocation("n1", (0,)), NodeAllocation("n2", (0,)))), node_rank=1,
        master_addr="10.0.0.1", master_port=20001, restart_count=1, kill_wait_s=5.0, time_limit_s=60,
        start_barrier=True,
    )
    assert launch_from_pb(launch_to_pb(launch)) == launch
