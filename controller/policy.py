"""The scheduling policy's place in the controller: configuration in, snapshot inputs out.

``Policy`` owns what the pure core needs besides jobs and nodes: the accounting data (seeded from the
configuration on the first start, then managed with gadmin and kept in the store), the usage ledger
(charged on the engine's timer, saved every few seconds), the network topology of the nodes, the core's
``SchedulerConfig``, and the last plan (for gqueue --start and --priority). It decides nothing itself.
"""

from __future__ import annotations

import grp
import logging
from dataclasses import dataclass, replace

from garrison.config import ControllerConfig, SchedulerSettings, SwitchConfig
from garrison.controller.sched.cycle import Plan, SchedulerConfig
from garrison.controller.sched.presets import preset
from garrison.controller.sched.snapshot import Snapshot
from garrison.controller.state import ClusterState
from garrison.controller.usage import UsageLedger
from garrison.model.accounts import Account, Accounting, Limits, PartitionDef, Qos, User
from garrison.model.domain import Principal

log = logging.getLogger("garrison.controller.policy")


def scheduler_config(settings: SchedulerSettings) -> SchedulerConfig:
    """The core's configuration: the named preset, with every setting the admin gave on top."""
    base = preset(settings.policy)
    weights = base.weights
    overrides = {
        "age": settings.priority_weight_age,
        "fair_share": settings.priority_weight_fairshare,
        "qos": settings.priority_weight_qos,
        "job_size": settings.priority_weight_job_size,
        "partition": settings.priority_weight_partition,
        "time_limit": settings.priority_weight_time_limit,
        "max_age_s": settings.priority_max_age_s,
        "short_limit_s": settings.priority_time_limit_short_s,
        "long_limit_s": settings.priority_time_limit_long_s,
    }
    weights = replace(weights, **{k: v for k, v in overrides.items() if v is not None})
    return replace(
        base,
        weights=weights,
        backfill=base.backfill if settings.backfill is None else settings.backfill,
        reservations=base.reservations if settings.backfill_reservations is None else settings.backfill_reservations,
        max_job_test=settings.backfill_max_job_test,
        window_s=float(settings.backfill_window_s),
        resolution_s=float(settings.backfill_resolution_s),
        max_starts_per_cycle=settings.max_starts_per_cycle,
        preemption=settings.preemption,
    )


def seed_accounting(config: ControllerConfig) -> Accounting:
    """The accounting data a fresh controller starts with, from its configuration."""
    accounting = Accounting(
        default_account=config.default_account, enforce_associations=config.enforce_associations
    )
    for q in config.qos:
        accounting = accounting.with_qos(
            Qos(q.name, q.priority, (), q.max_gpus_per_user, q.max_jobs_per_user, q.max_time_s, q.grace_s)
        )
    for q in config.qos:  # preempts may name QoS declared later
        accounting = accounting.with_qos(replace(accounting.qos_map[q.name], preempts=q.preempts))
    accounting = accounting.with_default_qos(config.default_qos)
    pending = list(config.account_settings)
    while pending:  # parents before children, whatever order the file lists them in
        ready = [a for a in pending if not a.parent or a.parent in accounting.account_map]
        if not ready:
            raise ValueError(f"accounts {', '.join(a.name for a in pending)} form a cycle")
        for a in ready:
            accounting = accounting.with_account(
                Account(a.name, a.parent or None, a.shares, a.allowed_qos, a.description)
            )
            pending.remove(a)
    for u in config.users:
        accounting = accounting.with_user(
            User(u.name, u.default_account, tuple((name, u.shares) for name in u.accounts), u.coordinator_of)
        )
    for quota in config.quotas:
        kind, name = ("account", quota.account) if quota.account else ("user", quota.user)
        accounting = accounting.with_limits(kind, name, Limits(quota.max_gpus, quota.max_jobs, quota.max_gpu_hours))
    for part in config.partitions:
        accounting = accounting.with_partition(
            PartitionDef(part.name, part.nodes, part.default_time_s, part.max_time_s, part.default,
                         part.allowed_accounts, part.allowed_qos, part.priority)
        )
    return accounting


def switch_paths(switches: tuple[SwitchConfig, ...]) -> dict[str, tuple[str, ...]]:
    """node -> its switches from the top level down to its leaf (Slurm topology.conf semantics)."""
    parent: dict[str, str] = {}
    for switch in switches:
        for child in switch.switches:
            parent[child] = switch.name
    out: dict[str, tuple[str, ...]] = {}
    for switch in switches:
        if not switch.nodes:
            continue
        path = [switch.name]
        while path[-1] in parent and parent[path[-1]] not in path:
            path.append(parent[path[-1]])
        for node in switch.nodes:
            out[node] = tuple(reversed(path))
    # Every path as deep as the deepest, so that groups at one level compare like with like.
    depth = max((len(p) for p in out.values()), default=0)
    return {node: path + (path[-1],) * (depth - len(path)) for node, path in out.items()}


@dataclass(frozen=True)
class PlanRecord:
    """The last cycle's input and output, for the queue views (gqueue --start, --priority)."""

    snapshot: Snapshot
    plan: Plan
    at: float


class Policy:
    def __init__(self, config: ControllerConfig, state: ClusterState, now: float) -> None:
        self.config = config
        self.state = state
        self.scheduler = scheduler_config(config.scheduler)
        loaded = state.store.load_accounting()
        if loaded is None:
            loaded = seed_accounting(config)
            state.store.save_accounting(loaded)
            log.info("accounting seeded from the configuration: %d accounts, %d QoS, %d partitions",
                     len(loaded.accounts), len(loaded.qos), len(loaded.partitions))
        self.accounting = loaded
        settings = config.scheduler
        self.usage = UsageLedger(state.store.load_usage(), settings.fairshare_half_life_s,
                                 settings.quota_period_s, now)
        self.usage_saved_at = now
        self.switches = switch_paths(config.switches)
        self.admin_users = set(config.admins)
        self.admin_gids = _group_ids(config.admin_groups)
        self.last: PlanRecord | None = None
        self.refresh_node_partitions()

    # -- inputs of a cycle ----------------------------------------------------------------------------

    def node_partitions(self, name: str) -> frozenset[str]:
        return frozenset(p.name for p in self.accounting.partitions if p.has_node(name))

    def refresh_node_partitions(self) -> None:
        for name in self.state.nodes:
            self.state.node_partitions[name] = self.node_partitions(name)

    def snapshot(self) -> Snapshot:
        return self.state.snapshot(self.accounting, self.usage.view(), self.switches)

    def remember(self, snapshot: Snapshot, plan: Plan, now: float) -> None:
        self.last = PlanRecord(snapshot, plan, now)

    # -- usage ----------------------------------------------------------------------------------------

    def charge_usage(self, now: float) -> None:
        """Charge every running job's GPUs since the last charge; save the ledger now and then."""
        holders = []
        for live in self.state.live.values():
            job = self.state.jobs.get(live.job_id)
            if job is None or live.stale:
                continue
            gpus = sum(len(live.allocation.gpus_on(node)) for node in live.pending_nodes)
            if gpus:
                holders.append((job.account, job.user, gpus))
        self.usage.charge(now, holders)
        if now - self.usage_saved_at >= self.config.scheduler.usage_save_interval_s:
            self.save_usage(now)

    def save_usage(self, now: float) -> None:
        self.state.store.save_usage(self.usage.state())
        self.usage_saved_at = now

    # -- changes --------------------------------------------------------------------------------------

    def replace_accounting(self, accounting: Accounting) -> None:
        """Write a new version of the accounting data through to the store, then use it."""
        self.state.store.save_accounting(accounting)
        self.accounting = accounting
        self.refresh_node_partitions()

    # -- who may do what ------------------------------------------------------------------------------

    def is_admin(self, principal: Principal) -> bool:
        """A configured admin user, or a member of a configured admin group (root and the controller's
        own user are admins too: Engine.is_admin)."""
        return principal.user in self.admin_users or any(g in self.admin_gids for g in principal.groups)

    def coordinates(self, principal: Principal, account: str) -> bool:
        return self.accounting.coordinates(principal.user, account)


def _group_ids(names: tuple[str, ...]) -> set[int]:
    gids = set()
    for name in names:
        try:
            gids.add(grp.getgrnam(name).gr_gid)
        except KeyError:
            log.warning("admin group %r does not exist on this host: ignored", name)
    return gids

