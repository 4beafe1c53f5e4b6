"""The one module of gsim that knows the scheduling core's types: policies, snapshots and plans.

The simulator must run the very code the daemon runs, so it never decides anything itself: it turns its
virtual cluster into the core's ``Snapshot``, calls ``schedule(snapshot, now, config)``, and reads the
``Plan``. Everything that depends on the shape of those types lives here, so a change in the core is
absorbed in one place. Where the daemon has a function that prepares the core's inputs, gsim calls that
function rather than a copy of it:

- ``load_policy``: a policy name -> the core's ``SchedulerConfig``. ``fifo`` and ``fifo-easy`` are the
  core's presets (sched/presets.py); ``garrison`` is what the daemon derives from its configuration
  (controller/sched_settings.py ``scheduler_config``), from the shipped defaults or from ``--config``. The
  accounting data (accounts, QoS, partitions, quotas) is seeded from the same configuration with the
  daemon's ``seed_accounting``;
- ``SnapshotBuilder``: the snapshot's pieces kept up to date as the replay starts and ends jobs (node
  views rebuilt only for nodes whose GPUs changed, pending and running views built once), and fair-share
  usage charged through the daemon's own ``UsageLedger``, so a cycle costs what the scheduler does.

Plans are applied by the controller's own attempt ledger (controller/ledger.py ``AttemptLedger.apply``),
in replay.py.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from garrison.config import ConfigError, ControllerConfig, PartitionConfig, load_config
from garrison.controller.sched.attained import Service
from garrison.controller.sched.cycle import SchedulerConfig
from garrison.controller.sched.explain import never_text
from garrison.controller.sched.feasibility import Feasibility, IdleCluster
from garrison.controller.sched.pipeline import build_pipeline
from garrison.controller.sched.placement import Placer, request_for
from garrison.controller.sched.presets import policy_presets
from garrison.controller.sched.snapshot import NodeView, PendingJob, RunningJob, Snapshot, node_view
from garrison.controller.sched_settings import scheduler_config, seed_accounting, switch_paths
from garrison.controller.sim.cluster import SimCluster
from garrison.controller.sim.trace import TraceJob
from garrison.controller.usage import UsageLedger
from garrison.model.accounts import Accounting, UsageState
from garrison.model.domain import Allocation, JobSpec

POLICY_NAMES = ("fifo", "fifo-easy", "garrison")

# Without --config, partitions do not cap time limits: a trace's long jobs are what they are (the shipped
# 7-day maximum would make the daemon refuse them, and a study of scheduling quality should not).
UNCAPPED_TIME_S = 100 * 365 * 86400


class PolicyError(ValueError):
    """A policy that cannot be built (unknown name, bad configuration file), in one line."""


@dataclass(frozen=True)
class Policy:
    name: str
    config: SchedulerConfig
    controller: ControllerConfig  # the daemon configuration the policy runs under
    accounting: Accounting  # accounts, QoS, partitions, quotas, as a fresh daemon seeds them
    description: str


DESCRIPTIONS = {
    "fifo": "arrival order, no backfill: the first blocked job holds back its partition",
    "fifo-easy": "arrival order with EASY backfill (one reservation)",
    "garrison": "the daemon's configuration: multifactor priority, fair share, backfill, topology",
}


def simulation_defaults() -> ControllerConfig:
    """The shipped controller configuration, except that partitions do not cap time limits."""
    shipped = ControllerConfig()
    return replace(shipped, partitions=tuple(replace(p, max_time_s=UNCAPPED_TIME_S) for p in shipped.partitions))


def controller_config(config_file: Path | None) -> ControllerConfig:
    if config_file is None:
        return simulation_defaults()
    try:
        return load_config(config_file).controller
    except ConfigError as err:
        raise PolicyError(str(err)) from None


def load_policy(name: str, config_file: Path | None = None, *, preemption: bool = False) -> Policy:
    """The scheduling core's configuration for a policy name; ``preemption`` turns the core's preemption
    on (it then preempts where the QoS table allows: a QoS listing others in ``preempts``)."""
    if name not in POLICY_NAMES:
        raise PolicyError(f"unknown policy {name!r} (known: {', '.join(POLICY_NAMES)}, all)")
    controller = controller_config(config_file)
    try:
        accounting = seed_accounting(controller)
        config = scheduler_config(controller.scheduler) if name == "garrison" else policy_presets()[name]
    except ValueError as err:
        raise PolicyError(f"{config_file}: {err}" if config_file else str(err)) from None
    if preemption:
        config = replace(config, preemption=True)
    return Policy(name, config, controller, accounting, DESCRIPTIONS[name])


def default_partition(policy: Policy) -> PartitionConfig:
    controller = policy.controller
    return next((p for p in controller.partitions if p.default), controller.partitions[0])


def job_spec(job: TraceJob, job_id: int) -> JobSpec:
    """The JobSpec the daemon would hold for ``gsub -G GPUS -t LIMIT -A ACCOUNT [-q QOS] COMMAND``.

    The command is a placeholder: the true duration is nowhere in what the scheduler is given.
    """
    return JobSpec(
        name=f"trace-{job_id}",
        command=("trace-job",),
        gpus=job.gpus,
        time_limit_s=job.time_limit_s,
        account=job.account,
        qos=job.qos,
    )


def never_runs(policy: Policy, cluster: SimCluster, jobs: list[TraceJob]) -> dict[int, str]:
    """The trace jobs (by index) that no state of the cluster could ever run, each with why: the core's own
    answer (sched/feasibility.py), as the daemon refuses such a job at submission."""
    nodes = SnapshotBuilder(cluster, policy, 0.0).build().nodes
    idle = IdleCluster(sorted(nodes, key=lambda v: (v.switches, v.name)), Placer(build_pipeline()))
    partition = default_partition(policy).name
    refused: dict[int, str] = {}
    for index, job in enumerate(jobs):
        request = request_for(index + 1, job_spec(job, index + 1), partition, float(job.time_limit_s or 0))
        verdict = idle.verdict(request)
        if verdict.feasibility == Feasibility.NEVER:
            refused[index] = never_text(request, verdict.tally, partition)
    return refused


@dataclass(slots=True)
class _Running:
    view: RunningJob
    gpus: int
    account: str
    user: str


class SnapshotBuilder:
    """The scheduling core's view of the virtual cluster, kept up to date incrementally.

    Node views are rebuilt only for nodes whose free GPUs changed, pending and running views are built
    once, and the tuples handed to the core are cached until something changes: most events touch one or
    two nodes, and the queue can hold a thousand jobs.
    """

    def __init__(self, cluster: SimCluster, policy: Policy, start: float) -> None:
        self.policy = policy
        self.accounting = policy.accounting
        controller = policy.controller
        self.partition = default_partition(policy).name
        configured_switches = switch_paths(controller.switches) if controller.switches else {}
        self._order = [n.name for n in cluster.nodes]
        self._base: dict[str, NodeView] = {}
        for node in cluster.nodes:
            self._base[node.name] = node_view(
                node.inventory,
                node.name,
                schedulable=True,
                free_gpus=frozenset(range(node.gpu_count)),
                partitions=frozenset(p.name for p in self.accounting.partitions if p.has_node(node.name)),
                switches=configured_switches.get(node.name, (node.switch,)),
            )
        self._views = dict(self._base)
        self._in_order = list(self._views) == self._order
        self._free_views: dict[str, dict[frozenset[int], NodeView]] = {
            name: {view.free_gpus: view} for name, view in self._base.items()
        }
        self._pending: dict[int, PendingJob] = {}
        self._running: dict[int, _Running] = {}
        self._running_views: dict[int, RunningJob] = {}  # each running job's view, in _running's order
        # GPUs held per (account, user): charged as one holder each, since decayed usage is linear in the
        # GPUs held (a few accounts instead of hundreds of running jobs at every event).
        self._held: Counter[tuple[str, str]] = Counter()
        settings = controller.scheduler
        self.ledger = UsageLedger(UsageState(), settings.fairshare_half_life_s, settings.quota_period_s, start)
        self._nodes_tuple: tuple[NodeView, ...] | None = None
        self._pending_tuple: tuple[PendingJob, ...] | None = None
        self._running_tuple: tuple[RunningJob, ...] | None = None

    # -- changes ---------------------------------------------------------------------------------------

    def set_free(self, node: str, free: frozenset[int]) -> None:
        # A node has few distinct sets of free GPUs (at most 2^8): one view each, made once, so a node that
        # comes back to an earlier state hands the core the very view it had then.
        known = self._free_views[node]
        view = known.get(free)
        if view is None:
            view = known[free] = replace(self._base[node], free_gpus=free)
        self._views[node] = view
        self._nodes_tuple = None

    def job_arrived(self, job_id: int, job: TraceJob, submit_time: float, service: Service = ()) -> None:
        """A job joins the queue: on its arrival, or requeued after a preemption with ``service``, the (start,
        end, GPUs) of its earlier attempts (for attained service, sched/attained.py)."""
        account = job.account or self.accounting.default_account
        self._pending[job_id] = PendingJob(
            job_id=job_id,
            spec=job_spec(job, job_id),
            partition=self.partition,
            submit_time=submit_time,
            user=job.user or "",
            account=account,
            qos=job.qos or "",
            time_limit_s=job.time_limit_s,
            service=service,
        )
        self._pending_tuple = None

    def job_started(self, job_id: int, attempt: int, allocation: Allocation, now: float) -> None:
        pending = self._pending.pop(job_id)
        self._pending_tuple = None
        limit = pending.time_limit_s
        assert limit is not None, "complete_jobs gives every job a time limit"
        view = RunningJob(
            job_id=job_id,
            attempt=attempt,
            allocation=allocation,
            start_time=now,
            time_limit_s=limit,
            user=pending.user,
            account=pending.account_name,
            qos=pending.qos,
            partition=pending.partition,
            service=pending.service,
        )
        self._running[job_id] = _Running(view, allocation.gpu_count(), pending.account_name, pending.user)
        self._running_views[job_id] = view
        self._held[(pending.account_name, pending.user)] += allocation.gpu_count()
        self._running_tuple = None

    def job_stopping(self, job_id: int) -> None:
        """Preemption has begun: its GPUs come free at the end of the grace period, and it is no victim."""
        running = self._running[job_id]
        running.view = self._running_views[job_id] = replace(running.view, stopping=True)
        self._running_tuple = None

    def job_checkpointed(self, job_id: int, when: float) -> None:
        running = self._running[job_id]
        if running.view.checkpoint_time != when:
            running.view = self._running_views[job_id] = replace(running.view, checkpoint_time=when)
            self._running_tuple = None

    def job_ended(self, job_id: int) -> None:
        ended = self._running.pop(job_id)
        del self._running_views[job_id]
        holder = (ended.account, ended.user)
        self._held[holder] -= ended.gpus
        if not self._held[holder]:
            del self._held[holder]
        self._running_tuple = None

    def charge(self, now: float) -> None:
        """Charge fair-share usage up to ``now`` for what ran since the last charge (as the daemon's timer)."""
        self.ledger.charge(now, [(account, user, gpus) for (account, user), gpus in self._held.items()])

    # -- the core's input ------------------------------------------------------------------------------

    def build(self) -> Snapshot:
        if self._nodes_tuple is None:
            # _views holds the nodes in _order (made in it, then only assigned to): its values, in C.
            self._nodes_tuple = tuple(self._views.values()) if self._in_order else tuple(
                self._views[name] for name in self._order)
        if self._pending_tuple is None:
            self._pending_tuple = tuple(self._pending.values())
        if self._running_tuple is None:
            self._running_tuple = tuple(self._running_views.values())
        return Snapshot(
            nodes=self._nodes_tuple,
            pending=self._pending_tuple,
            running=self._running_tuple,
            accounting=self.accounting,
            usage=self.ledger.view(),
        )

