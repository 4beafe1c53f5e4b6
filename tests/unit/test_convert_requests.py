"""The RPC layer's conversions between messages and the engine's commands (controller/rpc/convert_requests.py
and the accounting queries), and that bad requests are still refused with the same status and one-line
message: directly, and over real gRPC against a real controller."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from security_helpers import ControllerProcess, running_controller

from garrison.auth import issue_credential, load_or_create_key
from garrison.controller.accounting_query import UsageQuery
from garrison.controller.commands import (
    AttemptFinished,
    AttemptStarted,
    CancelResult,
    CheckpointMarked,
    JobFilter,
    RunningAttempt,
    StillAlive,
    SubmitCommand,
    TestSubmitResult,
    Welcome,
)
from garrison.controller.rpc.accounting import usage_query_from_pb
from garrison.controller.rpc.convert_requests import (
    agent_event_from_pb,
    cancel_command_from_pb,
    cancel_result_to_pb,
    instruction_to_pb,
    job_filter_from_pb,
    registration_from_pb,
    submit_command_from_pb,
    submit_estimate_to_pb,
)
from garrison.controller.rpc.services import _one_line, _status_for
from garrison.controller.state import AckResult, SignalAttempt
from garrison.model.domain import (
    Allocation,
    JobSpec,
    JobState,
    NodeAllocation,
    NodeResult,
    Principal,
    RankOutcome,
)
from garrison.model.launch import LaunchDescription
from garrison.protos.v1 import accounting_pb2 as apb
from garrison.protos.v1 import accounting_pb2_grpc as apb_grpc
from garrison.protos.v1 import garrison_pb2 as pb
from garrison.protos.v1 import garrison_pb2_grpc as pb_grpc
from garrison.wire.convert import launch_from_pb, spec_from_pb


def refusal(call: Any, *args: Any) -> tuple[grpc.StatusCode | None, str]:
    """The status and client-facing message a conversion's error becomes (services.mapped_errors)."""
    with pytest.raises(Exception) as caught:
        call(*args)
    return _status_for(caught.value), _one_line(caught.value)


INVALID = grpc.StatusCode.INVALID_ARGUMENT


# ------------------------------------------------------------------------------------------------
# Requests -> commands


def test_a_submission_carries_its_array_limit_only_when_given() -> None:
    spec = pb.JobSpec(name="t", command=["true"], workdir="/")
    plain = submit_command_from_pb(pb.SubmitJobRequest(spec=spec, array_indices=[1, 2], hold=True))
    assert plain == SubmitCommand(spec=spec_from_pb(spec), array_indices=(1, 2), hold=True)
    limited = submit_command_from_pb(pb.SubmitJobRequest(spec=spec, array_indices=[1, 2], array_max_running=3))
    assert limited == SubmitCommand(spec=replace(spec_from_pb(spec), array_max_running=3), array_indices=(1, 2))


def test_a_bad_launch_mode_is_refused_as_before() -> None:
    request = pb.SubmitJobRequest(spec=pb.JobSpec(name="t", command=["true"], launch="bogus"))
    assert refusal(submit_command_from_pb, request) == (
        INVALID, "unknown launch mode 'bogus' (expected rank, node, single or allocation)"
    )


def test_job_filters_read_states_in_any_case_and_name_the_first_unknown_one() -> None:
    selection = job_filter_from_pb(pb.ListJobsRequest(states=["running", "PENDING"], users=["a"], job_ids=["7_1"]))
    assert selection == JobFilter(
        job_refs=("7_1",), users=frozenset({"a"}), states=frozenset({JobState.RUNNING, JobState.PENDING})
    )
    assert refusal(job_filter_from_pb, pb.ListJobsRequest(states=["zz", "bogus", "RUNNING"])) == (
        INVALID, "unknown job state 'BOGUS'"
    )


def test_a_cancel_reads_its_signal_before_its_states() -> None:
    command = cancel_command_from_pb(pb.CancelJobsRequest(job_ids=["3"], signal="usr1"))
    assert command.signal == 10 and command.jobs.job_refs == ("3",) and command.jobs.users == frozenset()
    by_user = cancel_command_from_pb(pb.CancelJobsRequest(user="bob"))
    assert by_user.signal is None and by_user.jobs.users == {"bob"} and by_user.jobs.has_filters
    assert refusal(cancel_command_from_pb, pb.CancelJobsRequest(signal="NOPE", states=["bogus"])) == (
        INVALID, "signal: unknown signal 'NOPE'"
    )
    assert refusal(cancel_command_from_pb, pb.CancelJobsRequest(states=["bogus"])) == (
        INVALID, "unknown job state 'BOGUS'"
    )


def test_usage_queries_are_checked_as_before() -> None:
    query = usage_query_from_pb(apb.UsageRequest(start_time=1.0, end_time=2.0, users=["a"]))
    assert query == UsageQuery(start=1.0, end=2.0, users=("a",))
    assert refusal(usage_query_from_pb, apb.UsageRequest(start_time=2.0, end_time=2.0)) == (
        INVALID, "the period's start must be before its end"
    )
    assert refusal(usage_query_from_pb, apb.UsageRequest(start_time=float("nan"), end_time=2.0)) == (
        INVALID, "the period's start and end must be finite times"
    )


# ------------------------------------------------------------------------------------------------
# Results -> responses


def test_an_estimate_without_a_start_has_no_start_field() -> None:
    unknown = submit_estimate_to_pb(TestSubmitResult(partition="main", reason="Dependency"))
    assert not unknown.HasField("estimated_start") and unknown.reason == "Dependency"
    known = submit_estimate_to_pb(TestSubmitResult(partition="main", estimated_start=5.0, nodes=("n1", "n2")))
    assert known.estimated_start == 5.0 and list(known.nodes) == ["n1", "n2"] and known.partition == "main"


def test_a_cancel_result_becomes_its_response() -> None:
    response = cancel_result_to_pb(CancelResult(signalled=(4,), not_running=("5",)))
    assert list(response.signalled) == [4] and list(response.not_running) == ["5"] and not response.cancelled


# ------------------------------------------------------------------------------------------------
# The agent link


def test_a_registration_and_the_agents_messages_become_domain_events() -> None:
    register = pb.Register(
        node_name="n1",
        running=[pb.JobRef(job_id=3, attempt=1, checkpoint_time=9.5)],
        finished=[pb.JobResult(job_id=2, attempt=0, ranks=[pb.RankResult(rank=0, exit_code=1)])],
    )
    registration = registration_from_pb(register, "10.0.0.1")
    assert registration.node == "n1" and registration.address == "10.0.0.1"
    assert registration.running == (RunningAttempt(3, 1, 9.5),)
    assert registration.finished == (NodeResult(2, 0, (RankOutcome(0, 1),)),)

    assert agent_event_from_pb(pb.AgentMessage(started=pb.JobStarted(job_id=3, attempt=1))) == AttemptStarted(3, 1)
    assert agent_event_from_pb(
        pb.AgentMessage(checkpointed=pb.Checkpointed(job_id=3, attempt=1, time=7.0))
    ) == CheckpointMarked(3, 1, 7.0)
    assert agent_event_from_pb(pb.AgentMessage(finished=pb.JobResult(job_id=3, attempt=1))) == AttemptFinished(
        NodeResult(3, 1, ())
    )
    for alive in (pb.AgentMessage(), pb.AgentMessage(register=register)):
        assert agent_event_from_pb(alive) == StillAlive()
    # A heartbeat also says the node has no fault (""): what lifts a drain the agent's fault made.
    assert agent_event_from_pb(pb.AgentMessage(heartbeat=pb.Heartbeat(time=1.0))) == StillAlive(node_fault="")


def test_the_engines_instructions_become_controller_messages() -> None:
    launch = LaunchDescription(
        job_id=7, attempt=1, user="alice", uid=1000, gid=1000, spec=JobSpec(name="t", command=("true",)),
        allocation=Allocation((NodeAllocation("n1", (0,)), NodeAllocation("n2", (1,)))), node_rank=1,
        master_addr="10.0.0.1", master_port=20001, restart_count=1, kill_wait_s=5.0, time_limit_s=60,
        array_job_id=6, array_task_id=1,
    )
    message = instruction_to_pb(launch)
    assert message.WhichOneof("kind") == "launch" and launch_from_pb(message.launch) == launch
    # What Slurm's variables need beyond the spec travels too (and the spec's submit host).
    slurm = replace(launch, spec=replace(launch.spec, submit_host="login1"), account="physics", partition="gpu",
                    qos="high", cluster_name="tiny", array_task_count=4, array_task_min=1, array_task_max=7,
                    array_task_step=2, batch_signal=10, start_time=1_700_000_000.25)
    assert launch_from_pb(instruction_to_pb(slurm).launch) == slurm

    for action, wire in (("signal", pb.SignalJob.SIGNAL), ("terminate", pb.SignalJob.TERMINATE), ("kill", pb.SignalJob.KILL)):
        signal = instruction_to_pb(SignalAttempt("n1", 7, 1, action, 15 if action == "signal" else 0)).signal
        assert (signal.job_id, signal.attempt, signal.action) == (7, 1, wire)
    assert instruction_to_pb(SignalAttempt("n1", 7, 1, "signal", 15)).signal.signal == 15
    ack = instruction_to_pb(AckResult("n1", 7, 1))
    assert ack.WhichOneof("kind") == "ack" and (ack.ack.job_id, ack.ack.attempt) == (7, 1)
    assert instruction_to_pb(Welcome(2.5)).registered.heartbeat_interval_s == 2.5


# ------------------------------------------------------------------------------------------------
# Over real gRPC: the same status codes and messages as before the engine stopped reading messages


ALICE = Principal("alice", 5001, 5001, (5001,))


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProcess]:
    with running_controller(tmp_path_factory.mktemp("refusals")) as process:
        yield process


def refused_over_grpc(controller: ControllerProcess, stub_type: Any, method: str, request: Any) -> tuple[Any, str]:
    key = load_or_create_key(Path(controller.root / "state" / "credential.key"))
    token = issue_credential(key, ALICE, time.time(), 60.0)
    with controller.client_channel() as channel, pytest.raises(grpc.RpcError) as caught:
        getattr(stub_type(channel), method)(request, timeout=10, metadata=(("x-garrison-credential", token),))
    return caught.value.code(), caught.value.details()


@pytest.mark.parametrize(
    ("stub", "method", "request_message", "expected"),
    [
        (pb_grpc.ControllerStub, "SubmitJob", pb.SubmitJobRequest(spec=pb.JobSpec(name="t", command=["true"], launch="x")),
         (INVALID, "unknown launch mode 'x' (expected rank, node, single or allocation)")),
        (pb_grpc.ControllerStub, "CancelJobs", pb.CancelJobsRequest(job_ids=["1"], signal="NOPE", states=["bad"]),
         (INVALID, "signal: unknown signal 'NOPE'")),
        (pb_grpc.ControllerStub, "CancelJobs", pb.CancelJobsRequest(states=["bad"]),
         (INVALID, "unknown job state 'BAD'")),
        (pb_grpc.ControllerStub, "CancelJobs", pb.CancelJobsRequest(),
         (INVALID, "nothing to cancel: give job ids, a user, states, names, partitions or accounts")),
        (pb_grpc.ControllerStub, "CancelJobs", pb.CancelJobsRequest(job_ids=["999"], signal="USR1"),
         (grpc.StatusCode.NOT_FOUND, "no such job 999")),
        (pb_grpc.ControllerStub, "ListJobs", pb.ListJobsRequest(states=["bad"], job_ids=["999"]),
         (INVALID, "unknown job state 'BAD'")),
        (pb_grpc.ControllerStub, "GetJob", pb.GetJobRequest(job_id="999"),
         (grpc.StatusCode.NOT_FOUND, "no such job 999")),
        (apb_grpc.AccountingStub, "GetUsage", apb.UsageRequest(start_time=5.0, end_time=1.0),
         (INVALID, "the period's start must be before its end")),
        (apb_grpc.AccountingStub, "ListJobRecords", apb.JobRecordsRequest(states=["bad"]),
         (INVALID, "unknown job state 'bad'")),
    ],
    ids=["launch-mode", "signal-first", "cancel-state", "cancel-nothing", "signal-unknown-job", "list-state",
         "get-unknown", "usage-period", "records-state"],
)
def test_bad_requests_get_the_same_status_and_message(
    controller: ControllerProcess, stub: Any, method: str, request_message: Any, expected: tuple[Any, str]
) -> None:
    assert refused_over_grpc(controller, stub, method, request_message) == expected


def test_state_filters_take_slurms_codes_and_long_names() -> None:
    """squeue -t PD, scancel -t R: the controller reads Slurm's compact codes as it reads the long names, in any
    case (garrison/model/state_codes.py), and names the first unknown state."""
    from garrison.controller.rpc.convert_requests import job_states
    from garrison.controller.validate import ValidationError
    from garrison.model.domain import JobState

    assert job_states(["pd", "R", "completing", "OOM"]) == {
        JobState.PENDING, JobState.RUNNING, JobState.COMPLETING, JobState.OUT_OF_MEMORY}
    with pytest.raises(ValidationError, match="'XX'"):
        job_states(["PD", "xx"])
