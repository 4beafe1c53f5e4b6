"""The Admin service (protos/v1/admin.proto): gadmin's accounting and node commands, gcontrol's job control,
and gqueue's --start and --priority views. Thin: authenticate, convert, call AdminOps, convert back."""

from __future__ import annotations

import grpc

from garrison.controller.admin import AdminOps
from garrison.controller.commands import JobFilter
from garrison.controller.engine import Engine
from garrison.controller.limits import MAX_JOB_REF_CHARS, check_filters, check_list
from garrison.controller.rpc import convert_admin
from garrison.controller.rpc.services import Authenticator, mapped_errors
from garrison.controller.validate import ValidationError
from garrison.model.domain import JobState
from garrison.protos.v1 import admin_pb2 as adminpb
from garrison.protos.v1 import admin_pb2_grpc as admin_grpc
from garrison.protos.v1 import garrison_pb2 as pb
from garrison.wire import convert

ADD, MODIFY, DELETE = adminpb.ADD, adminpb.MODIFY, adminpb.DELETE


def _action(value: int) -> int:
    if value not in (ADD, MODIFY, DELETE):
        raise ValidationError("action must be add, modify or delete")
    return value


class AdminService(admin_grpc.AdminServicer):
    def __init__(self, engine: Engine, auth: Authenticator) -> None:
        self.engine = engine
        self.auth = auth
        self.ops = AdminOps(engine)

    def _policy(self) -> adminpb.PolicyInfo:
        return convert_admin.policy_to_pb(self.engine.policy.accounting)

    @mapped_errors
    async def GetPolicy(self, request: adminpb.GetPolicyRequest, context: grpc.aio.ServicerContext) -> adminpb.PolicyInfo:
        # gadmin is for admins only, reads included (issue 3): users see their jobs' factors in gqueue.
        self.ops.require_admin(self.auth.principal(context), "read the accounts, QoS and quota tables")
        return self._policy()

    @mapped_errors
    async def ChangeAccount(self, request: adminpb.AccountChange, context: grpc.aio.ServicerContext) -> adminpb.PolicyInfo:
        principal = self.auth.principal(context)
        action = _action(request.action)
        if action == ADD:
            self.ops.add_account(principal, convert_admin.account_from_pb(request))
        elif action == MODIFY:
            self.ops.modify_account(principal, request.name, **convert_admin.account_changes_from_pb(request))
        else:
            self.ops.delete_account(principal, request.name)
        return self._policy()

    @mapped_errors
    async def ChangeUser(self, request: adminpb.UserChange, context: grpc.aio.ServicerContext) -> adminpb.PolicyInfo:
        principal = self.auth.principal(context)
        action = _action(request.action)
        if action == ADD:
            self.ops.add_user(principal, convert_admin.user_from_pb(request))
        elif action == MODIFY:
            self.ops.modify_user(
                principal, request.name, add_accounts=list(request.add_accounts),
                remove_accounts=list(request.remove_accounts),
                default_account=request.default_account if request.HasField("default_account") else None,
                shares=request.shares if request.HasField("shares") else None,
                add_coordinator=list(request.add_coordinator), remove_coordinator=list(request.remove_coordinator),
            )
        else:
            self.ops.delete_user(principal, request.name)
        return self._policy()

    @mapped_errors
    async def SetQuota(self, request: adminpb.QuotaChange, context: grpc.aio.ServicerContext) -> adminpb.PolicyInfo:
        principal = self.auth.principal(context)
        self.ops.set_quota(principal, request.kind, request.name, **convert_admin.quota_changes_from_pb(request))
        return self._policy()

    @mapped_errors
    async def ChangeQos(self, request: adminpb.QosChange, context: grpc.aio.ServicerContext) -> adminpb.PolicyInfo:
        principal = self.auth.principal(context)
        action = _action(request.action)
        if action == ADD:
            self.ops.add_qos(principal, convert_admin.qos_from_pb(request), make_default=request.make_default)
        elif action == MODIFY:
            self.ops.modify_qos(principal, request.name, make_default=request.make_default,
                                **convert_admin.qos_changes_from_pb(request))
        else:
            self.ops.delete_qos(principal, request.name)
        return self._policy()

    @mapped_errors
    async def ChangePartition(
        self, request: adminpb.PartitionChange, context: grpc.aio.ServicerContext
    ) -> adminpb.PolicyInfo:
        principal = self.auth.principal(context)
        action = _action(request.action)
        if action == ADD:
            self.ops.add_partition(principal, convert_admin.partition_from_pb(request))
        elif action == MODIFY:
            self.ops.modify_partition(principal, request.name, **convert_admin.partition_changes_from_pb(request))
        else:
            self.ops.delete_partition(principal, request.name)
        return self._policy()

    @mapped_errors
    async def GetFairShare(
        self, request: adminpb.FairShareRequest, context: grpc.aio.ServicerContext
    ) -> adminpb.FairShareResponse:
        self.ops.require_admin(self.auth.principal(context), "read every account's usage")
        ledger = self.engine.policy.usage
        lines = self.ops.usage(list(request.accounts), list(request.users))
        return adminpb.FairShareResponse(entries=convert_admin.fair_share_to_pb(lines), half_life_s=ledger.half_life_s,
                                         period_start=ledger.period_start, period_s=ledger.period_s)

    @mapped_errors
    async def SetNodeState(self, request: adminpb.NodeStateChange, context: grpc.aio.ServicerContext) -> pb.NodeInfo:
        principal = self.auth.principal(context)
        node = self.ops.set_node_drain(principal, request.node, request.drain, request.reason)
        allocated = list(self.engine.state.gpu_owner.get(node.name, {}))
        return convert.node_to_pb(node, allocated, node.name in self.engine.state.connected)

    @mapped_errors
    async def ControlJobs(
        self, request: adminpb.JobControlRequest, context: grpc.aio.ServicerContext
    ) -> adminpb.JobControlResponse:
        principal = self.auth.principal(context)
        refs = list(request.job_ids)
        if request.action == "hold":
            changed = self.ops.hold(principal, refs)
        elif request.action == "release":
            changed = self.ops.release(principal, refs)
        elif request.action == "requeue":
            changed = self.ops.requeue(principal, refs)
        elif request.action == "update":
            changed = self.ops.update(
                principal, refs,
                time_limit_s=request.time_limit_s if request.HasField("time_limit_s") else None,
                priority=request.priority if request.HasField("priority") else None,
                qos=request.qos if request.HasField("qos") else None,
                nice=request.nice if request.HasField("nice") else None,
                name=request.name if request.HasField("name") else None,
                comment=request.comment if request.HasField("comment") else None,
                dependency=request.dependency if request.HasField("dependency") else None,
                array_task_throttle=(request.array_task_throttle if request.HasField("array_task_throttle")
                                     else None),
            )
        else:
            raise ValidationError("action must be hold, release, requeue or update")
        return adminpb.JobControlResponse(job_ids=changed)

    @mapped_errors
    async def QueueDetails(
        self, request: adminpb.QueueDetailsRequest, context: grpc.aio.ServicerContext
    ) -> adminpb.QueueDetailsResponse:
        self.auth.principal(context)
        check_list(request.job_ids, "job ids", MAX_JOB_REF_CHARS)
        check_list(request.users, "users")
        check_filters(request)
        engine = self.engine
        # The queue's own selection (ListJobs'), pending jobs only: those are the ones with a position.
        jobs = engine.list_jobs(JobFilter(
            users=frozenset(request.users), job_refs=tuple(request.job_ids), states=frozenset({JobState.PENDING}),
            names=tuple(request.names), partitions=tuple(request.partitions), accounts=tuple(request.accounts)))
        now = engine.clock.now()
        last = engine.policy.last
        return adminpb.QueueDetailsResponse(
            jobs=[convert_admin.pending_detail_to_pb(line, now)
                  for line in self.ops.pending_details(jobs, explain=request.explain)],
            weights=convert_admin.priority_weights_to_pb(engine.policy.scheduler.weights),
            cycle_time=last.at if last is not None else 0.0,
            now=now,
        )
