"""The Accounting service (gacct): requests for job records and GPU usage, answered from the engine's
accounting queries (controller/accounting_query.py, which read the store on a pool of their own).

This module only checks and converts: messages into queries, records and usage rows into messages. It
never touches the store itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import grpc

from garrison.controller.accounting_query import AccountingQuery, JobQuery, UsageQuery
from garrison.controller.clock import Clock
from garrison.controller.engine import PermissionDenied
from garrison.controller.rpc import convert_admin
from garrison.controller.rpc.services import Authenticator, mapped_errors
from garrison.controller.validate import ValidationError
from garrison.model.domain import JobState, Principal
from garrison.model.jobrefs import MAX_ID, parse_job_ref
from garrison.protos.v1 import accounting_pb2 as apb
from garrison.protos.v1 import accounting_pb2_grpc as apb_grpc

# Jobs per ListJobRecords answer: well under gRPC's 4 MiB message limit even for jobs with many attempts.
PAGE_SIZE = 1000
MAX_FILTER_VALUES = 1000


def job_query_from_pb(request: apb.JobRecordsRequest) -> JobQuery:
    """The store query for a request; ValidationError (INVALID_ARGUMENT) names what is wrong."""
    for name, values in (
        ("job ids", request.job_ids),
        ("users", request.users),
        ("accounts", request.accounts),
        ("states", request.states),
    ):
        if len(values) > MAX_FILTER_VALUES:
            raise ValidationError(f"too many {name}: at most {MAX_FILTER_VALUES}")
    job_ids: list[int] = []
    array_tasks: list[tuple[int, int]] = []
    for text in request.job_ids:
        try:
            job_id, task = parse_job_ref(text)
        except ValueError as exc:
            raise ValidationError(str(exc)) from None
        if task is None:
            job_ids.append(job_id)
        else:
            array_tasks.append((job_id, task))
    states: list[JobState] = []
    for name in request.states:
        try:
            states.append(JobState(name.upper()))
        except ValueError:
            raise ValidationError(f"unknown job state {name!r}") from None
    if request.after_job_id > MAX_ID:
        raise ValidationError(f"invalid job id {request.after_job_id}: too large")
    start = request.start_time if request.HasField("start_time") else None
    end = request.end_time if request.HasField("end_time") else None
    for label, value in (("start time", start), ("end time", end)):
        if value is not None and not math.isfinite(value):
            raise ValidationError(f"invalid {label} {value!r}")
    if start is not None and end is not None and start > end:
        raise ValidationError("the start time is after the end time")
    return JobQuery(
        job_ids=tuple(job_ids),
        array_tasks=tuple(array_tasks),
        users=tuple(request.users),
        accounts=tuple(request.accounts),
        states=tuple(states),
        active_after=start,
        active_before=end,
        after_job_id=request.after_job_id,
        limit=min(request.limit, PAGE_SIZE) if request.limit else PAGE_SIZE,
    )


def usage_query_from_pb(request: apb.UsageRequest) -> UsageQuery:
    """The usage query for a request; ValidationError (INVALID_ARGUMENT) names what is wrong."""
    start, end = request.start_time, request.end_time
    if not (math.isfinite(start) and math.isfinite(end)):
        raise ValidationError("the period's start and end must be finite times")
    if start >= end:
        raise ValidationError("the period's start must be before its end")
    if len(request.users) > MAX_FILTER_VALUES or len(request.accounts) > MAX_FILTER_VALUES:
        raise ValidationError(f"too many users or accounts: at most {MAX_FILTER_VALUES}")
    return UsageQuery(start=start, end=end, users=tuple(request.users), accounts=tuple(request.accounts))


def usage_request_for(principal: Principal, request: apb.UsageRequest, is_admin: bool) -> apb.UsageRequest:
    """What ``principal`` may ask of GPU usage: admins anyone's (as gadmin usage); others only their own, as
    Slurm's PrivateData=usage (no -u means "mine"; another user's name is refused, never silently dropped)."""
    if is_admin:
        return request
    others = [user for user in request.users if user != principal.user]
    if others:
        raise PermissionDenied(
            f"the usage of {others[0][:40]} is shown to admins only (gadmin usage); without -u you see your own"
        )
    own = apb.UsageRequest()
    own.CopyFrom(request)
    del own.users[:]
    own.users.append(principal.user)
    return own


class AccountingService(apb_grpc.AccountingServicer):
    """Every authenticated user may read every job record, as gqueue shows every job; GPU usage is each
    user's own, every user's to admins only."""

    def __init__(
        self, queries: AccountingQuery, auth: Authenticator, clock: Clock,
        is_admin: Callable[[Principal], bool] = lambda principal: False,
    ) -> None:
        self.queries = queries
        self.auth = auth
        self.clock = clock
        self.is_admin = is_admin

    # Each answer is read and shaped on the queries' pool (AccountingQuery.run), as a whole.

    def _list(self, request: apb.JobRecordsRequest, now: float) -> apb.JobRecordsResponse:
        query = job_query_from_pb(request)
        jobs = self.queries.job_records(query)
        return apb.JobRecordsResponse(
            jobs=[convert_admin.job_record_to_pb(job, now) for job in jobs], now=now, page_size=query.limit or 0
        )

    def _usage(self, request: apb.UsageRequest, now: float) -> apb.UsageResponse:
        query = usage_query_from_pb(request)
        rows = self.queries.usage(query, now)
        return apb.UsageResponse(
            rows=[convert_admin.usage_to_pb(row) for row in rows], start_time=query.start, end_time=query.end,
            now=now,
        )

    @mapped_errors
    async def ListJobRecords(
        self, request: apb.JobRecordsRequest, context: grpc.aio.ServicerContext
    ) -> apb.JobRecordsResponse:
        self.auth.principal(context)
        return await self.queries.run(self._list, request, self.clock.now())

    @mapped_errors
    async def GetUsage(self, request: apb.UsageRequest, context: grpc.aio.ServicerContext) -> apb.UsageResponse:
        principal = self.auth.principal(context)
        request = usage_request_for(principal, request, self.is_admin(principal))
        return await self.queries.run(self._usage, request, self.clock.now())
