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

from garrison.config import ControllerConfig
from garrison.controller.sched.cycle import Plan
from garrison.controller.sched.snapshot import Snapshot
from garrison.controller.sched_settings import scheduler_config, seed_accounting, switch_paths
from garrison.controller.state import ClusterState
from garrison.controller.usage import UsageLedger
from garrison.model.accounts import Accounting
from garrison.model.domain import Principal

log = logging.getLogger("garrison.controller.policy")


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
        self.scheduler = replace(scheduler_config(config.scheduler), priority_interval_s=priority_interval_s(config))
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
        self.state.scheduling_inputs_changed()
        for name in self.state.nodes:
            self.state.node_partitions[name] = self.node_partitions(name)

    def snapshot(self) -> Snapshot:
        """The next cycle's input; its priorities are priced as of the last plan's while that is recent
        enough (SchedulerConfig.priority_interval_s), so that a cycle prices only the jobs that changed."""
        snapshot = self.state.snapshot(self.accounting, self.usage.view(), self.switches)
        if self.last is not None and self.last.plan.pricing is not None:
            snapshot = replace(snapshot, pricing=self.last.plan.pricing)
        return snapshot

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


def priority_interval_s(config: ControllerConfig) -> float:
    """How long a cycle's priorities stand (SchedulerConfig.priority_interval_s): the scheduling interval (30 s
    by default: age moves a priority by a point in minutes), or a hundredth of the fair-share half-life if
    that is shorter, so that fair share follows usage within about 1% of a half-life however short it is
    configured (the end-to-end tests run a one-minute half-life)."""
    return min(config.schedule_interval_s, config.scheduler.fairshare_half_life_s / 100)


def _group_ids(names: tuple[str, ...]) -> set[int]:
    gids = set()
    for name in names:
        try:
            gids.add(grp.getgrnam(name).gr_gid)
        except KeyError:
            log.warning("admin group %r does not exist on this host: ignored", name)
    return gids

