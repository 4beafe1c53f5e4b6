"""The Admin service over real gRPC against a real controller process: who may change what, the reasons
given when refused, and that the accounting data and holds survive a restart.

Callers are told apart by credentials signed with the controller's own key (as the local credential
service would sign them for those users), so the tests can act as several users from one process.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from helpers.polling import wait_until
from security_helpers import ControllerProcess, running_controller

from garrison.auth import issue_credential, load_or_create_key
from garrison.model.domain import Principal
from garrison.protos.v1 import admin_pb2 as adminpb
from garrison.protos.v1 import admin_pb2_grpc
from garrison.protos.v1 import garrison_pb2 as pb
from garrison.protos.v1 import garrison_pb2_grpc as pb_grpc

POLICY = """\
admins = ["carol"]
admin_groups = ["adm"]
accounts = ["default", {name = "org"}, {name = "teamA", parent = "org"}, {name = "teamB", parent = "org"}]
users = [
  {name = "cora", accounts = ["teamA"], coordinator_of = ["teamA"]},
  {name = "mallory", accounts = ["teamA", "teamB"]},
]
schedule_interval_s = 0.1

[controller.scheduler]
fairshare_half_life = 60
"""

MALLORY = Principal("mallory", 5001, 5001, (5001,))
EVE = Principal("eve", 5002, 5002, (5002,))
CAROL = Principal("carol", 5003, 5003, (5003,))  # an admin by name
GADM = Principal("gadm", 5004, 5004, (5004, 4))  # an admin by group (adm is gid 4)
CORA = Principal("cora", 5005, 5005, (5005,))  # coordinates teamA


class Caller:
    def __init__(self, controller: ControllerProcess, channel: grpc.Channel) -> None:
        self.key = load_or_create_key(controller.root / "state" / "credential.key")
        self.admin = admin_pb2_grpc.AdminStub(channel)
        self.client = pb_grpc.ControllerStub(channel)

    def __call__(self, who: Principal, method: str, request: Any, service: str = "admin") -> Any:
        token = issue_credential(self.key, who, time.time(), 60.0)
        stub = self.admin if service == "admin" else self.client
        return getattr(stub, method)(request, timeout=10, metadata=(("x-garrison-credential", token),))

    def refused(self, who: Principal, method: str, request: Any, code: grpc.StatusCode = grpc.StatusCode.PERMISSION_DENIED,
                service: str = "admin") -> str:
        with pytest.raises(grpc.RpcError) as caught:
            self(who, method, request, service)
        assert caught.value.code() == code, caught.value.details()
        return str(caught.value.details())


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProcess]:
    with running_controller(tmp_path_factory.mktemp("admin"), extra=POLICY) as process:
        yield process


@pytest.fixture
def call(controller: ControllerProcess) -> Iterator[Caller]:
    with controller.client_channel() as channel:
        yield Caller(controller, channel)


def submit(call: Caller, who: Principal, **spec: Any) -> int:
    request = pb.SubmitJobRequest(spec=pb.JobSpec(name="t", command=["true"], workdir="/", **spec))
    return int(call(who, "SubmitJob", request, service="client").job_id)


def reason(call: Caller, job_id: int) -> str:
    (job,) = call(CAROL, "ListJobs", pb.ListJobsRequest(job_ids=[str(job_id)]), service="client").jobs
    return str(job.reason)


def test_gadmin_reads_and_changes_are_for_admins(call: Caller) -> None:
    assert "only admins may" in call.refused(MALLORY, "GetPolicy", adminpb.GetPolicyRequest())
    assert "only admins may" in call.refused(MALLORY, "GetFairShare", adminpb.FairShareRequest())
    policy = call(CAROL, "GetPolicy", adminpb.GetPolicyRequest())
    assert {a.name for a in policy.accounts} == {"default", "org", "teamA", "teamB"}
    assert {u.name for u in policy.users} == {"cora", "mallory"}
    add = adminpb.AccountChange(action=adminpb.ADD, name="lab", parent="org")
    assert call.refused(MALLORY, "ChangeAccount", add) == "only admins may add account lab (mallory is not an admin)"
    assert "only admins may" in call.refused(CORA, "ChangeAccount", add)  # coordinators manage jobs, not accounts
    call(CAROL, "ChangeAccount", add)
    modified = call(GADM, "ChangeAccount", adminpb.AccountChange(action=adminpb.MODIFY, name="lab", shares=5))
    assert next(a for a in modified.accounts if a.name == "lab").shares == 5
    quota = adminpb.QuotaChange(kind="account", name="teamB", max_gpus=4)
    assert "only admins may set the quota" in call.refused(EVE, "SetQuota", quota)
    call(CAROL, "SetQuota", quota)
    drain = adminpb.NodeStateChange(node="node9", drain=True, reason="fan")
    assert "only admins may drain node node9" in call.refused(MALLORY, "SetNodeState", drain)
    assert call.refused(CAROL, "SetNodeState", drain, grpc.StatusCode.NOT_FOUND) == "no such node 'node9'"
    bad = adminpb.AccountChange(action=adminpb.ADD, name="x", parent="nowhere")
    assert "unknown parent account" in call.refused(CAROL, "ChangeAccount", bad, grpc.StatusCode.INVALID_ARGUMENT)


def test_owners_coordinators_and_admins_control_jobs(call: Caller) -> None:
    job = submit(call, MALLORY, gpus=1, time_limit_s=600)  # no nodes: it stays pending
    other = submit(call, MALLORY, gpus=1, account="teamB")
    hold = adminpb.JobControlRequest(action="hold", job_ids=[str(job)])
    details = call.refused(EVE, "ControlJobs", hold)
    assert details == (f"job {job} belongs to mallory in account teamA; only its owner, the account's coordinators "
                       "and admins may hold it")
    assert call.refused(CORA, "ControlJobs", adminpb.JobControlRequest(action="hold", job_ids=[str(other)]))
    assert list(call(MALLORY, "ControlJobs", hold).job_ids) == [job]
    wait_until(lambda: reason(call, job) == "Held", 20, what="the hold to show")
    # A coordinator's hold is an admin's hold: the owner cannot release it.
    call(CORA, "ControlJobs", hold)
    release = adminpb.JobControlRequest(action="release", job_ids=[str(job)])
    assert "held by an admin or coordinator" in call.refused(MALLORY, "ControlJobs", release)
    assert list(call(CORA, "ControlJobs", release).job_ids) == [job]
    wait_until(lambda: reason(call, job) != "Held", 20, what="the release to show")

    priority = adminpb.JobControlRequest(action="update", job_ids=[str(job)], priority=100)
    assert "only admins may set a job's priority" in call.refused(MALLORY, "ControlJobs", priority)
    assert "only admins may set a job's priority" in call.refused(CORA, "ControlJobs", priority)
    call(CAROL, "ControlJobs", priority)
    longer = adminpb.JobControlRequest(action="update", job_ids=[str(job)], time_limit_s=1200)
    assert "only admins and coordinators may raise a time limit" in call.refused(MALLORY, "ControlJobs", longer)
    call(CORA, "ControlJobs", longer)
    shorter = adminpb.JobControlRequest(action="update", job_ids=[str(job)], time_limit_s=300, qos="high")
    call(MALLORY, "ControlJobs", shorter)
    (info,) = call(MALLORY, "ListJobs", pb.ListJobsRequest(job_ids=[str(job)]), service="client").jobs
    assert info.time_limit_s == 300 and info.priority == 100

    wait_until(
        lambda: call(MALLORY, "QueueDetails", adminpb.QueueDetailsRequest(
            job_ids=[str(job)])).jobs[0].HasField("priority"),
        20, what="a cycle to price the job",
    )
    (detail,) = call(MALLORY, "QueueDetails", adminpb.QueueDetailsRequest(job_ids=[str(job)])).jobs
    assert detail.position >= 1 and detail.factors.admin == 100 and detail.factors.qos > 0
    # Coordinators may cancel their account's jobs; others may not.
    cancel = pb.CancelJobsRequest(job_ids=[str(job)])
    call.refused(EVE, "CancelJobs", cancel, service="client")
    assert list(call(CORA, "CancelJobs", cancel, service="client").cancelled) == [job]


def test_list_jobs_by_reference_mixes_arrays_tasks_and_plain_jobs(call: Caller) -> None:
    array = int(call(MALLORY, "SubmitJob", pb.SubmitJobRequest(
        spec=pb.JobSpec(name="t", command=["true"], workdir="/"), array_indices=[1, 2, 3]),
        service="client").job_id)
    plain = submit(call, MALLORY)

    def listed(*refs: str) -> list[str]:
        request = pb.ListJobsRequest(job_ids=list(refs))
        return [job.display_id for job in call(MALLORY, "ListJobs", request, service="client").jobs]

    tasks = [f"{array}_1", f"{array}_2", f"{array}_3"]
    assert listed(str(array)) == tasks  # an array's id stands for all its tasks
    assert listed(f"{array}_2", str(plain)) == [f"{array}_2", str(plain)]
    assert listed(str(plain), str(array), f"{array}_3") == [*tasks, str(plain)]  # each once, in id order
    missing = call.refused(MALLORY, "ListJobs", pb.ListJobsRequest(job_ids=[str(plain), f"{array}_9"]),
                           code=grpc.StatusCode.NOT_FOUND, service="client")
    assert missing == f"no such job {array}_9"


def test_list_and_cancel_select_by_name_partition_and_account(call: Caller) -> None:
    def submit_as(who: Principal, name: str, account: str = "") -> int:
        spec = pb.JobSpec(name=name, command=["true"], workdir="/", account=account)
        return int(call(who, "SubmitJob", pb.SubmitJobRequest(spec=spec), service="client").job_id)

    alpha_a = submit_as(MALLORY, "filter-alpha", "teamA")
    beta_b = submit_as(MALLORY, "filter-beta", "teamB")
    alpha_eve = submit_as(EVE, "filter-alpha")
    mine = {alpha_a, beta_b, alpha_eve}

    def listed(**filters: list[str]) -> set[int]:
        jobs = call(CAROL, "ListJobs", pb.ListJobsRequest(**filters), service="client").jobs
        return {job.job_id for job in jobs} & mine

    assert listed(names=["filter-alpha"]) == {alpha_a, alpha_eve}
    assert listed(accounts=["teamB"]) == {beta_b}
    assert listed(names=["filter-alpha"], accounts=["teamA"]) == {alpha_a}  # every filter given must hold
    assert listed(partitions=["main"]) == mine and listed(partitions=["nosuch"]) == set()
    too_long = call.refused(CAROL, "ListJobs", pb.ListJobsRequest(names=["x" * 200]),
                            code=grpc.StatusCode.INVALID_ARGUMENT, service="client")
    assert too_long.startswith("invalid name 'xxx") and "\n" not in too_long

    # scancel --name: filters alone select only the caller's own jobs (eve's alpha stays pending).
    cancelled = call(MALLORY, "CancelJobs", pb.CancelJobsRequest(names=["filter-alpha"]), service="client").cancelled
    assert list(cancelled) == [alpha_a]
    assert listed(states=["PENDING"]) == {beta_b, alpha_eve}
    by_account = call(MALLORY, "CancelJobs", pb.CancelJobsRequest(
        accounts=["teamB"], partitions=["main"], names=["filter-beta", "filter-alpha"]), service="client")
    assert list(by_account.cancelled) == [beta_b]
    assert call(CAROL, "CancelJobs", pb.CancelJobsRequest(names=["filter-alpha"], states=["PENDING"]),
                service="client").cancelled == [alpha_eve]  # an admin's filters reach every user's jobs


def test_only_admins_may_raise_a_priority_with_a_negative_nice(call: Caller) -> None:
    def submit_nice(who: Principal, nice: int) -> int:
        spec = pb.JobSpec(name="nice", command=["true"], workdir="/", nice=nice)
        return int(call(who, "SubmitJob", pb.SubmitJobRequest(spec=spec), service="client").job_id)

    refused = call.refused(MALLORY, "SubmitJob", pb.SubmitJobRequest(spec=pb.JobSpec(
        name="nice", command=["true"], workdir="/", nice=-10)), service="client")
    assert refused == "only admins may give a negative --nice (it raises the job's priority)"
    out_of_range = call.refused(CAROL, "SubmitJob", pb.SubmitJobRequest(spec=pb.JobSpec(
        name="nice", command=["true"], workdir="/", nice=-2_147_483_647)), code=grpc.StatusCode.INVALID_ARGUMENT,
        service="client")
    assert "--nice must be between" in out_of_range
    lowered, raised = submit_nice(MALLORY, 300), submit_nice(CAROL, -300)

    def factors() -> dict[int, int]:
        details = call(CAROL, "QueueDetails", adminpb.QueueDetailsRequest(job_ids=[str(lowered), str(raised)])).jobs
        return {d.job.job_id: d.factors.nice for d in details if d.HasField("factors")}

    assert wait_until(lambda: len(factors()) == 2 and factors(), 20, what="a cycle to price both jobs") == {
        lowered: 300, raised: -300}

    # gcontrol update --nice: an owner may choose any nice value but a negative one; an admin any.
    def update(who: Principal, job: int, nice: int) -> list[int]:
        request = adminpb.JobControlRequest(action="update", job_ids=[str(job)], nice=nice)
        return list(call(who, "ControlJobs", request).job_ids)

    assert update(MALLORY, lowered, 0) == [lowered]
    assert "only admins may give a negative --nice" in call.refused(MALLORY, "ControlJobs", adminpb.JobControlRequest(
        action="update", job_ids=[str(lowered)], nice=-1))
    assert update(CAROL, lowered, -40) == [lowered]
    assert wait_until(
        lambda: factors() == {lowered: -40, raised: -300} and factors(),
        20, what="the new nice values",
    )


def test_update_name_comment_and_dependency_as_scontrol_update_does(call: Caller) -> None:
    # scontrol update JobId=N JobName=... Comment=... Dependency=...: the owner's, checked as a submission is.
    def submit_held() -> int:
        request = pb.SubmitJobRequest(spec=pb.JobSpec(name="t", command=["true"], workdir="/"), hold=True)
        return int(call(MALLORY, "SubmitJob", request, service="client").job_id)

    first, second = submit_held(), submit_held()

    def update(who: Principal, job: int, **fields: Any) -> list[int]:
        return list(call(who, "ControlJobs", adminpb.JobControlRequest(action="update", job_ids=[str(job)],
                                                                       **fields)).job_ids)

    def job(job_id: int) -> Any:
        return call(MALLORY, "GetJob", pb.GetJobRequest(job_id=str(job_id)), service="client")

    assert update(MALLORY, second, name="renamed", comment="lr 3e-4", dependency=f"afterok:{first}") == [second]
    spec = job(second).spec
    assert (spec.name, spec.comment, spec.dependency) == ("renamed", "lr 3e-4", f"afterok:{first}")
    assert update(MALLORY, second, comment="", dependency="") == [second]  # empty clears them
    spec = job(second).spec
    assert (spec.comment, spec.dependency, spec.name) == ("", "", "renamed")
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    assert "no such job" in call.refused(MALLORY, "ControlJobs", adminpb.JobControlRequest(
        action="update", job_ids=[str(second)], dependency="afterok:999999"), code=invalid)
    assert "cannot depend on itself" in call.refused(MALLORY, "ControlJobs", adminpb.JobControlRequest(
        action="update", job_ids=[str(second)], dependency=f"afterany:{second}"), code=invalid)
    assert "job name must be" in call.refused(MALLORY, "ControlJobs", adminpb.JobControlRequest(
        action="update", job_ids=[str(second)], name="a\nb"), code=invalid)
    assert "--comment must be" in call.refused(MALLORY, "ControlJobs", adminpb.JobControlRequest(
        action="update", job_ids=[str(second)], comment="x" * 5000), code=invalid)
    call.refused(EVE, "ControlJobs", adminpb.JobControlRequest(action="update", job_ids=[str(second)], name="mine"))
    assert "not a job array's task" in call.refused(MALLORY, "ControlJobs", adminpb.JobControlRequest(
        action="update", job_ids=[str(second)], array_task_throttle=2), code=invalid)
    assert job(second).spec.name == "renamed"  # nothing of the refused updates landed
    call(MALLORY, "CancelJobs", pb.CancelJobsRequest(job_ids=[str(first), str(second)]), service="client")


def test_accounting_and_holds_survive_a_restart(controller: ControllerProcess, tmp_path: Path) -> None:
    with controller.client_channel() as channel:
        call = Caller(controller, channel)
        call(CAROL, "ChangeQos", adminpb.QosChange(action=adminpb.ADD, name="gold", priority=99, max_gpus_per_user=3))
        call(CAROL, "ChangeAccount", adminpb.AccountChange(action=adminpb.ADD, name="vault", parent="teamB"))
        job = submit(call, MALLORY, gpus=1)
        call(CAROL, "ControlJobs", adminpb.JobControlRequest(action="hold", job_ids=[str(job)]))
    controller.stop()
    with running_controller(controller.root, reuse=controller) as again, again.client_channel() as channel:
        call = Caller(again, channel)
        policy = call(CAROL, "GetPolicy", adminpb.GetPolicyRequest())
        gold = next(q for q in policy.qos if q.name == "gold")
        assert gold.priority == 99 and gold.max_gpus_per_user == 3
        assert next(a for a in policy.accounts if a.name == "vault").parent == "teamB"
        wait_until(lambda: reason(call, job) == "Held", 20, what="the hold to show after the restart")
        release = adminpb.JobControlRequest(action="release", job_ids=[str(job)])
        assert "held by an admin" in call.refused(MALLORY, "ControlJobs", release)


