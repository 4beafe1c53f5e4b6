"""Accounts, users, QoS, partitions and quotas: the policy data an admin manages with gadmin.

Plain immutable values with no I/O, so the pure scheduling core reads them from its snapshot and the
simulator can build them by hand. ``Accounting`` is one whole, validated version of the data; every change
(``with_account``, ``without_qos``, ...) returns a new version or raises ``AccountingError`` with one line
saying what is wrong, so a half-applied change never exists. The controller keeps the current version in
memory and writes each new one through to the store (controller/policy.py).

The account tree works like Slurm's associations: accounts nest (organisation > team), users belong to one
or more accounts with a number of shares each, and fair share divides each level among its children in
proportion to their shares.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property

# Slurm sites name accounts with @ too (IDRIS: six@gpu, abc@a100), so it is allowed after the first character.
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}$")
DEFAULT_ACCOUNT = "default"
UNSET: object = object()  # "leave as it is" for a field of a modify (None means "no limit")


class AccountingError(ValueError):
    """A change that would leave the accounting data inconsistent (one line, for gadmin to print)."""


@dataclass(frozen=True, slots=True)
class Account:
    name: str
    parent: str | None = None  # None: a top-level account (an organisation)
    shares: int = 1
    allowed_qos: tuple[str, ...] = ()  # empty: what the parent allows (at the top: any QoS)
    description: str = ""


@dataclass(frozen=True, slots=True)
class User:
    name: str
    default_account: str
    accounts: tuple[tuple[str, int], ...]  # (account, shares), sorted by account
    coordinator_of: tuple[str, ...] = ()  # accounts whose jobs (and sub-accounts' jobs) this user manages

    def shares_in(self, account: str) -> int | None:
        return next((shares for name, shares in self.accounts if name == account), None)

    @property
    def account_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.accounts)


@dataclass(frozen=True, slots=True)
class Qos:
    name: str
    priority: int = 0  # scaled against the highest QoS priority into the QoS priority factor
    preempts: tuple[str, ...] = ()  # QoS whose running jobs a job of this QoS may preempt
    max_gpus_per_user: int | None = None
    max_jobs_per_user: int | None = None
    max_time_s: int | None = None
    grace_s: int = 60  # how long a preempted job of this QoS has between its warning and its end
    description: str = ""


@dataclass(frozen=True, slots=True)
class Limits:
    """Hard limits on an account (with everything under it) or on a user (across accounts)."""

    max_gpus: int | None = None  # GPUs allocated at once
    max_jobs: int | None = None  # jobs running at once
    max_gpu_hours: float | None = None  # GPU-hours per quota period, counting running jobs' whole limits

    def is_empty(self) -> bool:
        return self.max_gpus is None and self.max_jobs is None and self.max_gpu_hours is None


@dataclass(frozen=True, slots=True)
class PartitionDef:
    name: str
    nodes: tuple[str, ...] = ()  # empty: every node
    default_time_s: int = 3600
    max_time_s: int = 7 * 86400
    default: bool = False
    allowed_accounts: tuple[str, ...] = ()  # empty: any account (sub-accounts of a listed one included)
    allowed_qos: tuple[str, ...] = ()  # empty: any QoS
    priority: int = 0  # scaled against the highest partition priority into the partition factor

    def has_node(self, node: str) -> bool:
        return not self.nodes or node in self.nodes


@dataclass(frozen=True)
class Accounting:
    """One consistent version of the accounting data. Lookups are indexed on first use."""

    accounts: tuple[Account, ...] = ()
    users: tuple[User, ...] = ()
    qos: tuple[Qos, ...] = ()
    partitions: tuple[PartitionDef, ...] = ()
    account_limits: tuple[tuple[str, Limits], ...] = ()
    user_limits: tuple[tuple[str, Limits], ...] = ()
    default_account: str = DEFAULT_ACCOUNT
    default_qos: str = ""
    # True: users must be registered (gadmin user add) and may charge only their accounts. False: an
    # unregistered user may charge any account, as one more member with one share.
    enforce_associations: bool = False
    version: int = field(default=0, compare=False)  # bumped by every change, so caches know when to rebuild

    # -- lookups -------------------------------------------------------------------------------------

    @cached_property
    def account_map(self) -> Mapping[str, Account]:
        return {a.name: a for a in self.accounts}

    @cached_property
    def user_map(self) -> Mapping[str, User]:
        return {u.name: u for u in self.users}

    @cached_property
    def qos_map(self) -> Mapping[str, Qos]:
        return {q.name: q for q in self.qos}

    @cached_property
    def partition_map(self) -> Mapping[str, PartitionDef]:
        return {p.name: p for p in self.partitions}

    @cached_property
    def account_limit_map(self) -> Mapping[str, Limits]:
        return dict(self.account_limits)

    @cached_property
    def user_limit_map(self) -> Mapping[str, Limits]:
        return dict(self.user_limits)

    @cached_property
    def _ancestors(self) -> dict[str, tuple[str, ...]]:
        out: dict[str, tuple[str, ...]] = {}
        for account in self.accounts:
            chain = [account.name]
            parent = account.parent
            while parent is not None and parent not in chain:
                chain.append(parent)
                parent_account = self.account_map.get(parent)
                parent = parent_account.parent if parent_account is not None else None
            out[account.name] = tuple(chain)
        return out

    def ancestors(self, account: str) -> tuple[str, ...]:
        """The account itself, then its parent, up to its top-level account. An unknown account (a
        snapshot built without accounting) is its own top level."""
        return self._ancestors.get(account, (account,))

    def children(self, account: str | None) -> tuple[Account, ...]:
        return tuple(a for a in self.accounts if a.parent == account)

    def descendants(self, account: str) -> set[str]:
        return {name for name, chain in self._ancestors.items() if account in chain}

    def default_partition(self) -> PartitionDef | None:
        return next((p for p in self.partitions if p.default), self.partitions[0] if self.partitions else None)

    def allowed_qos(self, account: str) -> tuple[str, ...]:
        """The QoS jobs of ``account`` may use: its own list, else its nearest ancestor's; () = any."""
        for name in self.ancestors(account):
            found = self.account_map.get(name)
            if found is not None and found.allowed_qos:
                return found.allowed_qos
        return ()

    def coordinates(self, user: str, account: str) -> bool:
        """Whether ``user`` coordinates ``account`` or an account above it."""
        record = self.user_map.get(user)
        if record is None or not record.coordinator_of:
            return False
        return any(name in record.coordinator_of for name in self.ancestors(account))

    def account_for(self, user: str, requested: str | None) -> str:
        """The account a job of ``user`` charges, or AccountingError saying why it may not."""
        record = self.user_map.get(user)
        if requested is None:
            if record is not None:
                return record.default_account
            if self.enforce_associations:
                raise AccountingError(f"user {user!r} has no account (an admin adds one with gadmin user add)")
            return self.default_account
        if requested not in self.account_map:
            raise AccountingError(f"unknown account {requested!r}")
        if record is not None:
            if requested not in record.account_names:
                raise AccountingError(f"user {user!r} may not charge account {requested!r}")
        elif self.enforce_associations:
            raise AccountingError(f"user {user!r} has no account (an admin adds one with gadmin user add)")
        return requested

    def partition_allows_account(self, partition: PartitionDef, account: str) -> bool:
        if not partition.allowed_accounts:
            return True
        return any(name in partition.allowed_accounts for name in self.ancestors(account))

    # -- changes -------------------------------------------------------------------------------------

    def _next(self, **changes: object) -> Accounting:
        return replace(self, version=self.version + 1, **changes)  # type: ignore[arg-type]

    def with_account(self, account: Account) -> Accounting:
        """Add or replace an account."""
        _check_name(account.name, "account")
        if account.shares < 1:
            raise AccountingError(f"account {account.name!r}: shares must be at least 1")
        if account.parent is not None:
            if account.parent not in self.account_map:
                raise AccountingError(f"account {account.name!r}: unknown parent account {account.parent!r}")
            if account.name in self.ancestors(account.parent):
                raise AccountingError(f"account {account.name!r}: parent {account.parent!r} is under it")
        self._check_qos_names(account.allowed_qos, f"account {account.name!r}")
        accounts = [a for a in self.accounts if a.name != account.name] + [account]
        return self._next(accounts=tuple(sorted(accounts, key=lambda a: a.name)))

    def without_account(self, name: str) -> Accounting:
        if name not in self.account_map:
            raise AccountingError(f"unknown account {name!r}")
        children = self.children(name)
        if children:
            raise AccountingError(f"account {name!r} has sub-accounts ({', '.join(a.name for a in children)})")
        members = [u.name for u in self.users if name in u.account_names]
        if members:
            raise AccountingError(f"account {name!r} still has users ({', '.join(members[:5])})")
        if name == self.default_account:
            raise AccountingError(f"account {name!r} is the default account")
        parts = [p.name for p in self.partitions if name in p.allowed_accounts]
        if parts:
            raise AccountingError(f"account {name!r} is allowed in partition(s) {', '.join(parts)}")
        coordinators = [u.name for u in self.users if name in u.coordinator_of]
        if coordinators:
            raise AccountingError(f"account {name!r} has coordinators ({', '.join(coordinators)})")
        return self._next(
            accounts=tuple(a for a in self.accounts if a.name != name),
            account_limits=tuple((k, v) for k, v in self.account_limits if k != name),
        )

    def with_user(self, user: User) -> Accounting:
        _check_name(user.name, "user")
        if not user.accounts:
            raise AccountingError(f"user {user.name!r}: needs at least one account")
        for account, shares in user.accounts:
            if account not in self.account_map:
                raise AccountingError(f"user {user.name!r}: unknown account {account!r}")
            if shares < 1:
                raise AccountingError(f"user {user.name!r}: shares must be at least 1")
        if user.default_account not in user.account_names:
            raise AccountingError(
                f"user {user.name!r}: default account {user.default_account!r} is not one of its accounts"
            )
        for account in user.coordinator_of:
            if account not in self.account_map:
                raise AccountingError(f"user {user.name!r}: unknown account {account!r} to coordinate")
        normal = replace(
            user,
            accounts=tuple(sorted(dict(user.accounts).items())),
            coordinator_of=tuple(sorted(set(user.coordinator_of))),
        )
        users = [u for u in self.users if u.name != user.name] + [normal]
        return self._next(users=tuple(sorted(users, key=lambda u: u.name)))

    def without_user(self, name: str) -> Accounting:
        if name not in self.user_map:
            raise AccountingError(f"unknown user {name!r}")
        return self._next(
            users=tuple(u for u in self.users if u.name != name),
            user_limits=tuple((k, v) for k, v in self.user_limits if k != name),
        )

    def with_limits(self, kind: str, name: str, limits: Limits) -> Accounting:
        """Set (or, with empty limits, clear) the quota of an account or a user."""
        for value, what in ((limits.max_gpus, "max GPUs"), (limits.max_jobs, "max jobs"),
                            (limits.max_gpu_hours, "max GPU-hours")):
            if value is not None and value < 0:
                raise AccountingError(f"{what} must not be negative")
        if kind == "account":
            if name not in self.account_map:
                raise AccountingError(f"unknown account {name!r}")
            current = self.account_limits
        elif kind == "user":
            _check_name(name, "user")
            current = self.user_limits
        else:
            raise AccountingError(f"quota kind must be account or user, not {kind!r}")
        kept = [(k, v) for k, v in current if k != name]
        if not limits.is_empty():
            kept.append((name, limits))
        ordered = tuple(sorted(kept, key=lambda item: item[0]))
        return self._next(**{"account_limits" if kind == "account" else "user_limits": ordered})

    def with_qos(self, qos: Qos) -> Accounting:
        _check_name(qos.name, "QoS")
        if qos.name in qos.preempts:
            raise AccountingError(f"QoS {qos.name!r} may not preempt itself")
        known = set(self.qos_map) | {qos.name}
        for other in qos.preempts:
            if other not in known:
                raise AccountingError(f"QoS {qos.name!r}: unknown QoS {other!r} to preempt")
        for value, what in ((qos.max_gpus_per_user, "max GPUs per user"), (qos.max_jobs_per_user,
                            "max jobs per user"), (qos.max_time_s, "max time")):
            if value is not None and value < 0:
                raise AccountingError(f"QoS {qos.name!r}: {what} must not be negative")
        if qos.grace_s < 0:
            raise AccountingError(f"QoS {qos.name!r}: grace time must not be negative")
        table = [q for q in self.qos if q.name != qos.name] + [qos]
        return self._next(qos=tuple(sorted(table, key=lambda q: q.name)))

    def without_qos(self, name: str) -> Accounting:
        if name not in self.qos_map:
            raise AccountingError(f"unknown QoS {name!r}")
        if name == self.default_qos:
            raise AccountingError(f"QoS {name!r} is the default QoS")
        users = [q.name for q in self.qos if name in q.preempts]
        users += [a.name for a in self.accounts if name in a.allowed_qos]
        users += [p.name for p in self.partitions if name in p.allowed_qos]
        if users:
            raise AccountingError(f"QoS {name!r} is still named by {', '.join(users)}")
        return self._next(qos=tuple(q for q in self.qos if q.name != name))

    def with_partition(self, partition: PartitionDef) -> Accounting:
        _check_name(partition.name, "partition")
        if partition.default_time_s <= 0 or partition.max_time_s <= 0:
            raise AccountingError(f"partition {partition.name!r}: time limits must be positive")
        if partition.default_time_s > partition.max_time_s:
            raise AccountingError(f"partition {partition.name!r}: default time is longer than max time")
        for account in partition.allowed_accounts:
            if account not in self.account_map:
                raise AccountingError(f"partition {partition.name!r}: unknown account {account!r}")
        self._check_qos_names(partition.allowed_qos, f"partition {partition.name!r}")
        others = [p for p in self.partitions if p.name != partition.name]
        if partition.default:
            others = [replace(p, default=False) for p in others]
        position = next((i for i, p in enumerate(self.partitions) if p.name == partition.name), len(others))
        others.insert(position, partition)
        return self._next(partitions=tuple(others))

    def without_partition(self, name: str) -> Accounting:
        if name not in self.partition_map:
            raise AccountingError(f"unknown partition {name!r}")
        if len(self.partitions) == 1:
            raise AccountingError(f"partition {name!r} is the only partition")
        return self._next(partitions=tuple(p for p in self.partitions if p.name != name))

    def with_default_qos(self, name: str) -> Accounting:
        if name and name not in self.qos_map:
            raise AccountingError(f"unknown QoS {name!r}")
        return self._next(default_qos=name)

    def _check_qos_names(self, names: Iterable[str], where: str) -> None:
        for name in names:
            if name not in self.qos_map:
                raise AccountingError(f"{where}: unknown QoS {name!r}")


def _check_name(name: str, what: str) -> None:
    if not NAME.match(name):
        raise AccountingError(f"invalid {what} name {name!r}: 1-64 letters, digits and _.-@ (not first)")


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """GPU-seconds charged to one (account, user) association."""

    account: str
    user: str
    decayed_gpu_s: float = 0.0  # halved every half-life: what fair share looks at
    period_gpu_s: float = 0.0  # raw, since the current quota period began: what GPU-hour quotas look at
    total_gpu_s: float = 0.0  # raw, ever


@dataclass(frozen=True)
class UsageState:
    """The usage ledger as persisted: its records, when they were last decayed, and the quota period."""

    records: tuple[UsageRecord, ...] = ()
    updated_at: float = 0.0
    period_start: float = 0.0
