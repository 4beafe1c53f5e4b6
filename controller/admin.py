"""Admin and job-control operations (gadmin, gcontrol), with their permission checks.

Who may do what:
- admins (root, the controller's own user, users in ``admins``, members of ``admin_groups``) change the
  accounting data, drain and resume nodes, and control every job;
- an account's coordinators control the jobs of that account and of the accounts under it;
- a job's owner holds, releases, requeues it and lowers its time limit or changes its QoS within what its
  account and partition allow; raising a time limit and setting a priority take an admin (or, for the time
  limit, a coordinator);
- anyone may read the accounting data and usage (like sacctmgr show and sshare).

Every refusal raises PermissionDenied with the reason; bad values raise ValidationError (one line). The
state changes themselves go through ClusterState's named operations or Policy.replace_accounting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from garrison.controller.dependency import parse_dependency
from garrison.controller.engine import Engine, NotFound, PermissionDenied
from garrison.controller.sched.explain import explain_wait
from garrison.controller.sched.fairshare import fair_share_factors, normalised_shares
from garrison.controller.sched.priority import PriorityContext, PriorityFactors
from garrison.controller.sched.snapshot import PendingJob
from garrison.controller.validate import (
    MAX_COMMENT_LEN,
    MAX_JOB_NAME_CHARS,
    MAX_NICE,
    ValidationError,
    valid_job_name,
)
from garrison.model.accounts import (
    UNSET,
    Account,
    Accounting,
    AccountingError,
    Limits,
    PartitionDef,
    Qos,
    User,
)
from garrison.model.domain import Job, JobState, Node, Principal
from garrison.model.partitions import in_partition, partition_names

log = logging.getLogger("garrison.controller.admin")
MAX_ARRAY_TASK_THROTTLE = 1_000_000  # scontrol update ArrayTaskThrottle=: above any array's size
MAX_DEPENDENCY_CHARS = 4096  # scontrol update Dependency=: a hundred jobs written out, with room

T = TypeVar("T")
MAX_EXPLAINED = 20  # jobs one QueueDetails call explains (gqueue --explain JOBID asks for one)

@dataclass(frozen=True)
class UsageLine:
    account: str
    user: str
    decayed_gpu_s: float
    period_gpu_s: float
    total_gpu_s: float
    normalised_shares: float
    fair_share: float


@dataclass(frozen=True)
class PendingLine:
    job: Job
    position: int  # 0: not in the last cycle's queue (submitted since)
    estimated_start: float | None
    priority: int | None
    factors: PriorityFactors | None
    explanation: tuple[str, ...] = ()  # why it waits (sched/explain.py), when asked for


class AdminOps:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.policy = engine.policy
        self.state = engine.state
        self._indexed: tuple[object, _CycleIndex] | None = None  # the last cycle's, and its index

    # -- permission checks ------------------------------------------------------------------------------

    def require_admin(self, principal: Principal, what: str) -> None:
        if not self.engine.is_admin(principal):
            raise PermissionDenied(f"only admins may {what} ({principal.user} is not an admin)")

    def _may_control(self, principal: Principal, job: Job) -> str | None:
        """'admin', 'coordinator' or 'owner' (the strongest that applies), or None."""
        if self.engine.is_admin(principal):
            return "admin"
        if self.policy.coordinates(principal, job.account):
            return "coordinator"
        if principal.uid == job.uid:
            return "owner"
        return None

    def _controlled(self, principal: Principal, refs: Sequence[str], what: str) -> list[tuple[Job, str]]:
        if not refs:
            raise ValidationError(f"nothing to {what}: give job ids")
        out = []
        for job in self.engine._resolve_refs(refs):
            role = self._may_control(principal, job)
            if role is None:
                raise PermissionDenied(
                    f"job {job.display_id} belongs to {job.user} in account {job.account}; only its owner, the "
                    f"account's coordinators and admins may {what} it"
                )
            out.append((job, role))
        return out

    # -- accounting data ------------------------------------------------------------------------------

    def _change(self, principal: Principal, what: str, change: Callable[[Accounting], Accounting]) -> Accounting:
        self.require_admin(principal, what)
        try:
            updated = change(self.policy.accounting)
        except AccountingError as exc:
            raise ValidationError(str(exc)) from None
        self.policy.replace_accounting(updated)
        log.info("%s: %s", principal.user, what)
        self.engine.request_schedule()
        return updated

    def _jobs_using(self, predicate: Callable[[Job], bool]) -> list[Job]:
        return [j for j in self.state.jobs.values() if not j.state.is_terminal and predicate(j)]

    def add_account(self, principal: Principal, account: Account) -> Accounting:
        self.require_admin(principal, f"add account {account.name}")
        if account.name in self.policy.accounting.account_map:
            raise ValidationError(f"account {account.name!r} exists (use gadmin account modify)")
        return self._change(principal, f"add account {account.name}", lambda a: a.with_account(account))

    def modify_account(self, principal: Principal, name: str, parent: object = UNSET, shares: object = UNSET,
                       allowed_qos: object = UNSET, description: object = UNSET) -> Accounting:
        self.require_admin(principal, f"modify account {name}")
        current = self._existing(self.policy.accounting.account_map, name, "account")
        changes = _given(parent=parent, shares=shares, allowed_qos=allowed_qos, description=description)
        if "parent" in changes:
            changes["parent"] = changes["parent"] or None
        return self._change(principal, f"modify account {name}", lambda a: a.with_account(replace(current, **changes)))

    def delete_account(self, principal: Principal, name: str) -> Accounting:
        self.require_admin(principal, f"delete account {name}")
        self._existing(self.policy.accounting.account_map, name, "account")
        busy = self._jobs_using(lambda j: j.account == name)
        if busy:
            raise ValidationError(f"account {name!r} has {len(busy)} unfinished job(s), e.g. {busy[0].display_id}")
        return self._change(principal, f"delete account {name}", lambda a: a.without_account(name))

    def add_user(self, principal: Principal, user: User) -> Accounting:
        self.require_admin(principal, f"add user {user.name}")
        if user.name in self.policy.accounting.user_map:
            raise ValidationError(f"user {user.name!r} exists (use gadmin user modify)")
        return self._change(principal, f"add user {user.name}", lambda a: a.with_user(user))

    def modify_user(self, principal: Principal, name: str, add_accounts: Sequence[str] = (),
                    remove_accounts: Sequence[str] = (), default_account: str | None = None,
                    shares: int | None = None, add_coordinator: Sequence[str] = (),
                    remove_coordinator: Sequence[str] = ()) -> Accounting:
        self.require_admin(principal, f"modify user {name}")
        current = self._existing(self.policy.accounting.user_map, name, "user")
        members = dict(current.accounts)
        for account in add_accounts:
            members.setdefault(account, shares or 1)
        for account in remove_accounts:
            if account not in members:
                raise ValidationError(f"user {name!r} is not in account {account!r}")
            del members[account]
        if shares is not None:
            members = {account: shares for account in members}
        coordinator = (set(current.coordinator_of) | set(add_coordinator)) - set(remove_coordinator)
        updated = User(name, default_account or current.default_account, tuple(sorted(members.items())),
                       tuple(sorted(coordinator)))
        return self._change(principal, f"modify user {name}", lambda a: a.with_user(updated))

    def delete_user(self, principal: Principal, name: str) -> Accounting:
        self.require_admin(principal, f"delete user {name}")
        self._existing(self.policy.accounting.user_map, name, "user")
        return self._change(principal, f"delete user {name}", lambda a: a.without_user(name))

    def set_quota(self, principal: Principal, kind: str, name: str, max_gpus: object = UNSET,
                  max_jobs: object = UNSET, max_gpu_hours: object = UNSET) -> Accounting:
        self.require_admin(principal, f"set the quota of {kind} {name}")
        table = (self.policy.accounting.account_limit_map if kind == "account"
                 else self.policy.accounting.user_limit_map)
        current = table.get(name, Limits())
        updated = replace(current, **_given(max_gpus=max_gpus, max_jobs=max_jobs, max_gpu_hours=max_gpu_hours))
        return self._change(principal, f"set the quota of {kind} {name}",
                            lambda a: a.with_limits(kind, name, updated))

    def add_qos(self, principal: Principal, qos: Qos, make_default: bool = False) -> Accounting:
        self.require_admin(principal, f"add QoS {qos.name}")
        if qos.name in self.policy.accounting.qos_map:
            raise ValidationError(f"QoS {qos.name!r} exists (use gadmin qos modify)")

        def change(a: Accounting) -> Accounting:
            a = a.with_qos(qos)
            return a.with_default_qos(qos.name) if make_default else a

        return self._change(principal, f"add QoS {qos.name}", change)

    def modify_qos(self, principal: Principal, name: str, make_default: bool = False, **fields: object) -> Accounting:
        self.require_admin(principal, f"modify QoS {name}")
        current = self._existing(self.policy.accounting.qos_map, name, "QoS")
        updated = replace(current, **_given(**fields))

        def change(a: Accounting) -> Accounting:
            a = a.with_qos(updated)
            return a.with_default_qos(name) if make_default else a

        return self._change(principal, f"modify QoS {name}", change)

    def delete_qos(self, principal: Principal, name: str) -> Accounting:
        self.require_admin(principal, f"delete QoS {name}")
        self._existing(self.policy.accounting.qos_map, name, "QoS")
        default = self.policy.accounting.default_qos
        busy = self._jobs_using(lambda j: (j.spec.qos or default) == name)
        if busy:
            raise ValidationError(f"QoS {name!r} has {len(busy)} unfinished job(s), e.g. {busy[0].display_id}")
        return self._change(principal, f"delete QoS {name}", lambda a: a.without_qos(name))

    def add_partition(self, principal: Principal, partition: PartitionDef) -> Accounting:
        self.require_admin(principal, f"add partition {partition.name}")
        if partition.name in self.policy.accounting.partition_map:
            raise ValidationError(f"partition {partition.name!r} exists (use gadmin partition modify)")
        return self._change(principal, f"add partition {partition.name}", lambda a: a.with_partition(partition))

    def modify_partition(self, principal: Principal, name: str, **fields: object) -> Accounting:
        self.require_admin(principal, f"modify partition {name}")
        current = self._existing(self.policy.accounting.partition_map, name, "partition")
        updated = replace(current, **_given(**fields))
        return self._change(principal, f"modify partition {name}", lambda a: a.with_partition(updated))

    def delete_partition(self, principal: Principal, name: str) -> Accounting:
        self.require_admin(principal, f"delete partition {name}")
        self._existing(self.policy.accounting.partition_map, name, "partition")
        busy = self._jobs_using(lambda j: in_partition(j.partition, name))
        if busy:
            raise ValidationError(f"partition {name!r} has {len(busy)} unfinished job(s), e.g. {busy[0].display_id}")
        return self._change(principal, f"delete partition {name}", lambda a: a.without_partition(name))

    @staticmethod
    def _existing(table: Mapping[str, T], name: str, what: str) -> T:
        found = table.get(name)
        if found is None:
            raise NotFound(f"no such {what} {name!r}")
        return found

    # -- usage ----------------------------------------------------------------------------------------

    def usage(self, accounts: Sequence[str] = (), users: Sequence[str] = ()) -> list[UsageLine]:
        accounting = self.policy.accounting
        entries = self.policy.usage.entries
        associations = set(entries)
        for user in accounting.users:
            associations.update((account, user.name) for account in user.account_names)
        wanted_accounts: set[str] = set()
        for account in accounts:
            wanted_accounts |= accounting.descendants(account) or {account}
        selected = sorted(
            a for a in associations
            if (not accounts or a[0] in wanted_accounts) and (not users or a[1] in users)
        )
        shares = normalised_shares(accounting, associations)
        factors = fair_share_factors(accounting, associations, {k: e.decayed for k, e in entries.items()})
        lines = []
        for assoc in selected:
            entry = entries.get(assoc)
            lines.append(UsageLine(
                account=assoc[0], user=assoc[1],
                decayed_gpu_s=entry.decayed if entry else 0.0,
                period_gpu_s=entry.period if entry else 0.0,
                total_gpu_s=entry.total if entry else 0.0,
                normalised_shares=shares[assoc], fair_share=factors[assoc],
            ))
        return lines

    # -- nodes ----------------------------------------------------------------------------------------

    def set_node_drain(self, principal: Principal, name: str, drain: bool, reason: str) -> Node:
        self.require_admin(principal, f"{'drain' if drain else 'resume'} node {name}")
        if name not in self.state.nodes:
            raise NotFound(f"no such node {name!r}")
        reason = reason.strip()
        if drain and not reason:
            raise ValidationError("give a reason for draining (--reason)")
        if len(reason) > 256 or "\n" in reason:
            raise ValidationError("the reason must be one line of at most 256 characters")
        node = self.state.set_drain(name, drain, reason)
        log.info("%s %s node %s%s", principal.user, "drained" if drain else "resumed", name,
                 f": {reason}" if reason else "")
        self.engine.request_schedule()
        return node

    # -- job control ----------------------------------------------------------------------------------

    def hold(self, principal: Principal, refs: Sequence[str]) -> list[int]:
        jobs = self._controlled(principal, refs, "hold")
        by_admin = any(role != "owner" for _, role in jobs)
        held = self.state.hold([j.job_id for j, _ in jobs if j.state == JobState.PENDING], by_admin)
        if held:
            log.info("%s held job(s) %s", principal.user, ", ".join(map(str, held)))
        return held

    def release(self, principal: Principal, refs: Sequence[str]) -> list[int]:
        jobs = self._controlled(principal, refs, "release")
        for job, role in jobs:
            if role == "owner" and job.job_id in self.state.admin_held:
                raise PermissionDenied(f"job {job.display_id} was held by an admin or coordinator; only they may "
                                       "release it")
        released = self.state.release([j.job_id for j, _ in jobs])
        if released:
            log.info("%s released job(s) %s", principal.user, ", ".join(map(str, released)))
            self.engine.request_schedule()
        return released

    def requeue(self, principal: Principal, refs: Sequence[str]) -> list[int]:
        jobs = self._controlled(principal, refs, "requeue")
        requeued, instructions = self.state.requeue([j.job_id for j, _ in jobs], self.engine.clock.now())
        self.engine.execute(instructions)
        if requeued:
            log.info("%s requeued job(s) %s", principal.user, ", ".join(map(str, requeued)))
        return requeued

    def update(self, principal: Principal, refs: Sequence[str], time_limit_s: int | None = None,
               priority: int | None = None, qos: str | None = None, nice: int | None = None,
               name: str | None = None, comment: str | None = None, dependency: str | None = None,
               array_task_throttle: int | None = None) -> list[int]:
        """scontrol update's fields; ``comment`` and ``dependency`` "" clear them, ``array_task_throttle`` 0 lifts
        an array's %limit (its tasks that have ended are left as they were). Every job or none."""
        fields = (time_limit_s, priority, qos, nice, name, comment, dependency, array_task_throttle)
        if all(value is None for value in fields):
            raise ValidationError("nothing to update: give --time-limit, --priority, --qos, --nice, --name, "
                                  "--comment, --dependency or --array-task-throttle")
        throttle_only = all(value is None for value in fields[:-1])
        if array_task_throttle is not None and not 0 <= array_task_throttle <= MAX_ARRAY_TASK_THROTTLE:
            raise ValidationError(f"--array-task-throttle must be between 0 and {MAX_ARRAY_TASK_THROTTLE}")
        if nice is not None and abs(nice) > MAX_NICE:
            raise ValidationError(f"--nice must be between -{MAX_NICE} and {MAX_NICE}")
        if name is not None and not valid_job_name(name):
            raise ValidationError(f"job name must be 1-{MAX_JOB_NAME_CHARS} printable characters, not only spaces")
        if comment is not None and (len(comment) > MAX_COMMENT_LEN or not comment.isprintable()):
            raise ValidationError(f"--comment must be at most {MAX_COMMENT_LEN} printable characters")
        if dependency is not None and len(dependency) > MAX_DEPENDENCY_CHARS:
            raise ValidationError(f"--dependency is longer than {MAX_DEPENDENCY_CHARS} characters")
        if dependency:
            try:
                parse_dependency(dependency)
            except ValueError as exc:
                raise ValidationError(str(exc)) from None
            dependency = self.engine.known_dependency(dependency)  # every job it names exists, written one way
        jobs = self._controlled(principal, refs, "update")
        accounting = self.policy.accounting
        changed: list[Job] = []
        for job, role in jobs:
            if job.state.is_terminal:
                if throttle_only and job.array_job_id is not None:
                    continue  # an array's ended tasks keep the limit they ran under
                raise ValidationError(f"job {job.display_id} has finished")
            updated = job
            if priority is not None:
                if role != "admin":
                    raise PermissionDenied(f"only admins may set a job's priority ({principal.user} is not an admin)")
                if job.state != JobState.PENDING:
                    raise ValidationError(f"job {job.display_id} is not pending; its priority no longer matters")
                updated = replace(updated, priority=priority)
            if nice is not None:
                if nice < 0 and role != "admin":
                    raise PermissionDenied(f"only admins may give a negative --nice ({principal.user} is not an admin)")
                if job.state != JobState.PENDING:
                    raise ValidationError(f"job {job.display_id} is not pending; its priority no longer matters")
                updated = replace(updated, spec=replace(updated.spec, nice=nice))
            if time_limit_s is not None:
                if time_limit_s <= 0:
                    raise ValidationError("the time limit must be positive")
                if time_limit_s > job.time_limit_s and role == "owner":
                    raise PermissionDenied(f"only admins and coordinators may raise a time limit (job "
                                           f"{job.display_id} has {job.time_limit_s}s)")
                for name in partition_names(job.partition):  # -p a,b: every partition it waits in
                    part = accounting.partition_map.get(name)
                    if part is not None and time_limit_s > part.max_time_s:
                        raise ValidationError(f"time limit {time_limit_s}s exceeds partition {part.name!r} maximum "
                                              f"of {part.max_time_s}s")
                updated = replace(updated, time_limit_s=time_limit_s)
            if qos is not None:
                if job.state != JobState.PENDING:
                    raise ValidationError(f"job {job.display_id} is not pending; its QoS can no longer change")
                self._check_qos(job, qos, updated.time_limit_s)
                updated = replace(updated, spec=replace(updated.spec, qos=qos))
            if name is not None:
                updated = replace(updated, spec=replace(updated.spec, name=name))
            if comment is not None:
                updated = replace(updated, spec=replace(updated.spec, comment=comment or None))
            if dependency is not None:
                if job.state != JobState.PENDING:
                    raise ValidationError(f"job {job.display_id} is not pending; its dependency no longer matters")
                if dependency and str(job.job_id) in self._dependency_job_ids(dependency):
                    raise ValidationError(f"job {job.display_id} cannot depend on itself")
                updated = replace(updated, spec=replace(updated.spec, dependency=dependency or None))
            if array_task_throttle is not None:
                if job.array_job_id is None:
                    raise ValidationError(f"job {job.display_id} is not a job array's task: it has no task limit")
                updated = replace(updated, spec=replace(updated.spec, array_max_running=array_task_throttle or None))
            changed.append(updated)
        with self.state.atomically():  # every job or none
            for job in changed:
                self.state.update_job(job)
        log.info("%s updated job(s) %s", principal.user, ", ".join(str(j.job_id) for j in changed))
        self.engine.request_schedule()
        return [j.job_id for j in changed]

    def _dependency_job_ids(self, dependency: str) -> set[str]:
        """The ids of the jobs a dependency list stands for (an array's id: every task of it)."""
        found = self.engine._resolve_refs(parse_dependency(dependency).job_refs())
        return {str(job.job_id) for job in found}

    def _check_qos(self, job: Job, qos: str, time_limit_s: int) -> None:
        accounting = self.policy.accounting
        found = accounting.qos_map.get(qos)
        if found is None:
            raise ValidationError(f"unknown QoS {qos!r}")
        allowed = accounting.allowed_qos(job.account)
        if allowed and qos not in allowed:
            raise PermissionDenied(f"account {job.account!r} may not use QoS {qos!r} (allowed: {', '.join(allowed)})")
        for name in partition_names(job.partition):  # -p a,b: every partition it waits in
            part = accounting.partition_map.get(name)
            if part is not None and part.allowed_qos and qos not in part.allowed_qos:
                raise PermissionDenied(f"partition {part.name!r} does not allow QoS {qos!r}")
        if found.max_time_s is not None and time_limit_s > found.max_time_s:
            raise ValidationError(f"time limit {time_limit_s}s exceeds QoS {qos!r} maximum of {found.max_time_s}s")

    # -- queue views (gqueue --start, --priority) ---------------------------------------------------------

    def pending_details(self, jobs: Sequence[Job], explain: bool = False) -> list[PendingLine]:
        """Queue position, estimated start, priority factors; with ``explain``, why each job waits (for at most
        MAX_EXPLAINED jobs: each costs a pass of the filters over the nodes)."""
        lines = self._pending_lines(jobs)
        last = self.policy.last
        if not explain or last is None:
            return lines
        index = self._cycle_index(last)  # built by _pending_lines: explain_wait looks the job up, no pass
        explained = []
        for i, line in enumerate(lines):
            found = explain_wait(last.snapshot, last.plan, self.policy.scheduler, last.at, line.job.job_id,
                                 positions=index.position, pending=index.views) if i < MAX_EXPLAINED else None
            explained.append(replace(line, explanation=found.lines if found is not None else ()))
        return explained

    def _pending_lines(self, jobs: Sequence[Job]) -> list[PendingLine]:
        last = self.policy.last
        if last is None:
            return [PendingLine(j, 0, None, None, None) for j in jobs if j.state == JobState.PENDING]
        index = self._cycle_index(last)
        position, views, pricing = index.position, index.views, index.pricing
        lines = []
        for job in jobs:
            if job.state != JobState.PENDING:
                continue
            view = views.get(job.job_id)
            lines.append(PendingLine(
                job=job,
                position=position.get(job.job_id, 0),
                estimated_start=last.plan.estimated_starts.get(job.job_id),
                priority=last.plan.priorities.get(job.job_id),
                factors=pricing.factors(view) if view is not None else None,
            ))
        return sorted(lines, key=lambda line: (line.position or 1 << 62, line.job.job_id))


    def _cycle_index(self, last: Any) -> _CycleIndex:
        """The last cycle's queue positions and job views by id, built once per cycle: gjob on a pending job
        asks for one, and rebuilding them for 50,000 pending jobs on every call cost it tens of ms. The
        factors are those of the context the plan was priced as of (its priorities may be up to the
        priority interval old), so that they add up to the priority shown."""
        if self._indexed is None or self._indexed[0] is not last:
            pricing = last.plan.pricing
            if pricing is None:
                pricing = PriorityContext(last.snapshot, last.at, self.policy.scheduler.weights)
            self._indexed = (last, _CycleIndex(
                position=dict(zip(last.plan.order, range(1, len(last.plan.order) + 1), strict=True)),  # 1-based
                views={p.job_id: p for p in last.snapshot.pending},
                pricing=pricing,
            ))
        return self._indexed[1]


@dataclass(frozen=True)
class _CycleIndex:
    position: dict[int, int]
    views: dict[int, PendingJob]
    pricing: PriorityContext


def _given(**fields: object) -> dict[str, Any]:
    return {name: value for name, value in fields.items() if value is not UNSET}
