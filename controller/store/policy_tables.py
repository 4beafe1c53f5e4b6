"""The scheduling policy's tables (migration 0002): accounting data, decayed usage, job holds.

A mixin of SqlStore, kept in its own file so the job and node tables' code stays as it was. The accounting
data is small and changes only when an admin runs gadmin, so ``save_accounting`` rewrites all of it in one
transaction (a reader never sees half an admin change); usage is upserted in one executemany.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Insert, delete, select
from sqlalchemy.engine import Connection

from garrison.model.accounts import (
    Account,
    Accounting,
    Limits,
    PartitionDef,
    Qos,
    UsageRecord,
    UsageState,
    User,
)

from . import schema

SEEDED = "seeded"


def _list(text: str) -> tuple[str, ...]:
    value = json.loads(text)
    if not isinstance(value, list):
        raise ValueError(f"stored list is not a JSON list: {text[:80]!r}")
    return tuple(str(v) for v in value)


def _dump(values: Sequence[str]) -> str:
    return json.dumps(list(values), separators=(",", ":"))


class PolicyTables:
    """SqlStore's accounting, usage and hold methods (see interface.Store)."""

    _sqlite: bool

    def _write(self) -> contextlib.AbstractContextManager[Connection]:
        raise NotImplementedError

    def _snapshot(self) -> contextlib.AbstractContextManager[Connection]:
        raise NotImplementedError

    def _upsert(self, table: Any) -> Insert:
        raise NotImplementedError

    # -- accounting -----------------------------------------------------------------------------------

    def load_accounting(self) -> Accounting | None:
        with self._snapshot() as connection:
            settings = dict(connection.execute(select(schema.policy_settings.c.key,
                                                      schema.policy_settings.c.value)).all())
            if SEEDED not in settings:
                return None
            account_rows = connection.execute(select(schema.accounts).order_by(schema.accounts.c.name)).all()
            user_rows = connection.execute(select(schema.users).order_by(schema.users.c.name)).all()
            member_rows = connection.execute(select(schema.user_accounts)).all()
            coordinator_rows = connection.execute(select(schema.coordinators)).all()
            qos_rows = connection.execute(select(schema.qos).order_by(schema.qos.c.name)).all()
            quota_rows = connection.execute(select(schema.quotas).order_by(schema.quotas.c.name)).all()
            partition_rows = connection.execute(
                select(schema.partitions).order_by(schema.partitions.c.position)
            ).all()
        members: dict[str, list[tuple[str, int]]] = {}
        for row in member_rows:
            members.setdefault(row.user_name, []).append((row.account, row.shares))
        coordinates: dict[str, list[str]] = {}
        for row in coordinator_rows:
            coordinates.setdefault(row.user_name, []).append(row.account)
        return Accounting(
            accounts=tuple(
                Account(r.name, r.parent, r.shares, _list(r.allowed_qos_json), r.description) for r in account_rows
            ),
            users=tuple(
                User(r.name, r.default_account, tuple(sorted(members.get(r.name, []))),
                     tuple(sorted(coordinates.get(r.name, []))))
                for r in user_rows
            ),
            qos=tuple(
                Qos(r.name, r.priority, _list(r.preempts_json), r.max_gpus_per_user, r.max_jobs_per_user,
                    r.max_time_s, r.grace_s, r.description)
                for r in qos_rows
            ),
            partitions=tuple(
                PartitionDef(r.name, _list(r.nodes_json), r.default_time_s, r.max_time_s, bool(r.is_default),
                             _list(r.allowed_accounts_json), _list(r.allowed_qos_json), r.priority)
                for r in partition_rows
            ),
            account_limits=tuple(
                (r.name, Limits(r.max_gpus, r.max_jobs, r.max_gpu_hours)) for r in quota_rows if r.kind == "account"
            ),
            user_limits=tuple(
                (r.name, Limits(r.max_gpus, r.max_jobs, r.max_gpu_hours)) for r in quota_rows if r.kind == "user"
            ),
            default_account=settings.get("default_account", "default"),
            default_qos=settings.get("default_qos", ""),
            enforce_associations=settings.get("enforce_associations") == "true",
        )

    def save_accounting(self, accounting: Accounting) -> None:
        tables = (schema.accounts, schema.users, schema.user_accounts, schema.coordinators, schema.qos,
                  schema.quotas, schema.partitions)
        rows: dict[str, list[dict[str, Any]]] = {
            "accounts": [
                {"name": a.name, "parent": a.parent, "shares": a.shares,
                 "allowed_qos_json": _dump(a.allowed_qos), "description": a.description}
                for a in accounting.accounts
            ],
            "users": [{"name": u.name, "default_account": u.default_account} for u in accounting.users],
            "user_accounts": [
                {"user_name": u.name, "account": account, "shares": shares}
                for u in accounting.users for account, shares in u.accounts
            ],
            "coordinators": [
                {"user_name": u.name, "account": account} for u in accounting.users for account in u.coordinator_of
            ],
            "qos": [
                {"name": q.name, "priority": q.priority, "preempts_json": _dump(q.preempts),
                 "max_gpus_per_user": q.max_gpus_per_user, "max_jobs_per_user": q.max_jobs_per_user,
                 "max_time_s": q.max_time_s, "grace_s": q.grace_s, "description": q.description}
                for q in accounting.qos
            ],
            "quotas": [
                {"kind": kind, "name": name, "max_gpus": limits.max_gpus, "max_jobs": limits.max_jobs,
                 "max_gpu_hours": limits.max_gpu_hours}
                for kind, table in (("account", accounting.account_limits), ("user", accounting.user_limits))
                for name, limits in table
            ],
            "partitions": [
                {"name": p.name, "position": i, "nodes_json": _dump(p.nodes), "default_time_s": p.default_time_s,
                 "max_time_s": p.max_time_s, "is_default": p.default,
                 "allowed_accounts_json": _dump(p.allowed_accounts), "allowed_qos_json": _dump(p.allowed_qos),
                 "priority": p.priority}
                for i, p in enumerate(accounting.partitions)
            ],
        }
        settings = {
            SEEDED: "true",
            "default_account": accounting.default_account,
            "default_qos": accounting.default_qos,
            "enforce_associations": "true" if accounting.enforce_associations else "false",
        }
        with self._write() as connection:
            for table in tables:
                connection.execute(delete(table))
                if rows[table.name]:
                    connection.execute(table.insert(), rows[table.name])
            connection.execute(self._upsert(schema.policy_settings),
                               [{"key": k, "value": v} for k, v in settings.items()])

    # -- usage ----------------------------------------------------------------------------------------

    def load_usage(self) -> UsageState:
        with self._snapshot() as connection:
            settings = dict(connection.execute(select(schema.policy_settings.c.key,
                                                      schema.policy_settings.c.value)).all())
            rows = connection.execute(
                select(schema.usage_ledger).order_by(schema.usage_ledger.c.account, schema.usage_ledger.c.user_name)
            ).all()
        return UsageState(
            records=tuple(
                UsageRecord(r.account, r.user_name, r.decayed_gpu_s, r.period_gpu_s, r.total_gpu_s) for r in rows
            ),
            updated_at=float(settings.get("usage_updated_at", 0.0)),
            period_start=float(settings.get("usage_period_start", 0.0)),
        )

    def save_usage(self, state: UsageState) -> None:
        rows = [
            {"account": r.account, "user_name": r.user, "decayed_gpu_s": r.decayed_gpu_s,
             "period_gpu_s": r.period_gpu_s, "total_gpu_s": r.total_gpu_s}
            for r in state.records
        ]
        settings = [
            {"key": "usage_updated_at", "value": repr(state.updated_at)},
            {"key": "usage_period_start", "value": repr(state.period_start)},
        ]
        with self._write() as connection:
            if rows:
                connection.execute(self._upsert(schema.usage_ledger), rows)
            connection.execute(self._upsert(schema.policy_settings), settings)

    # -- holds ----------------------------------------------------------------------------------------

    def load_holds(self) -> dict[int, bool]:
        with self._snapshot() as connection:
            rows = connection.execute(select(schema.job_holds)).all()
        return {row.job_id: bool(row.by_admin) for row in rows}

    def set_holds(self, job_ids: Sequence[int], by_admin: bool) -> None:
        if not job_ids:
            return
        with self._write() as connection:
            connection.execute(self._upsert(schema.job_holds),
                               [{"job_id": job_id, "by_admin": by_admin} for job_id in job_ids])

    def set_hold(self, job_id: int, by_admin: bool | None) -> None:
        with self._write() as connection:
            if by_admin is None:
                connection.execute(delete(schema.job_holds).where(schema.job_holds.c.job_id == job_id))
            else:
                connection.execute(self._upsert(schema.job_holds), {"job_id": job_id, "by_admin": by_admin})
