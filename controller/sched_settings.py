"""How the controller's configuration becomes the scheduling core's inputs: its SchedulerConfig, the
accounting data a fresh controller seeds, and the nodes' switch paths.

Pure translations, shared by the daemon (controller/policy.py) and gsim (controller/sim/policies.py): they
import no daemon state, so the simulator derives its policies exactly as the controller does without
depending on the controller's memory or store.
"""

from __future__ import annotations

from dataclasses import replace

from garrison.config import ControllerConfig, SchedulerSettings, SwitchConfig
from garrison.controller.sched.cycle import SchedulerConfig
from garrison.controller.sched.presets import preset
from garrison.model.accounts import Account, Accounting, Limits, PartitionDef, Qos, User

__all__ = ["scheduler_config", "seed_accounting", "switch_paths"]


def scheduler_config(settings: SchedulerSettings) -> SchedulerConfig:
    """The core's configuration: the named preset, with every setting the admin gave on top."""
    base = preset(settings.policy)
    weights = base.weights
    overrides: dict[str, float | None] = {
        "age": settings.priority_weight_age,
        "fair_share": settings.priority_weight_fairshare,
        "qos": settings.priority_weight_qos,
        "job_size": settings.priority_weight_job_size,
        "partition": settings.priority_weight_partition,
        "time_limit": settings.priority_weight_time_limit,
        "small_job": settings.priority_weight_small_job,
        "attained_service": settings.priority_weight_attained_service,
        "attained_threshold_gpu_s": (None if settings.priority_attained_threshold_gpu_hours is None
                                     else settings.priority_attained_threshold_gpu_hours * 3600.0),
        "attained_starvation": settings.priority_attained_starvation,
        "max_age_s": settings.priority_max_age_s,
        "short_limit_s": settings.priority_time_limit_short_s,
        "long_limit_s": settings.priority_time_limit_long_s,
    }
    # (mypy checks a ** mapping's value type against every field: the weights are ints, the thresholds floats)
    weights = replace(weights, **{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]
    return replace(
        base,
        weights=weights,
        backfill=base.backfill if settings.backfill is None else settings.backfill,
        reservations=base.reservations if settings.backfill_reservations is None else settings.backfill_reservations,
        reserve_every_overdue=(base.reserve_every_overdue if settings.backfill_reserve_every_overdue is None
                               else settings.backfill_reserve_every_overdue),
        max_job_test=settings.backfill_max_job_test,
        window_s=float(settings.backfill_window_s),
        resolution_s=float(settings.backfill_resolution_s),
        max_starts_per_cycle=settings.max_starts_per_cycle,
        preemption=settings.preemption,
        max_grace_s=settings.preempt_max_grace_s,
        preempt_attained=settings.preempt_attained_service,
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
