"""The controller's Prometheus metrics.

Two kinds:

- Events, counted as they happen: job starts, ends (by final state), requeues and preemptions, and the
  latency of each scheduling cycle. ``job_changed`` is the ClusterState observer that counts job
  transitions; ``record_preemption`` is for the preemption code; ``observe_scheduling_cycle`` for the engine.
- The cluster's state, read at scrape time: jobs by state (and, for pending ones, why they wait), GPUs per
  node, node states, heartbeat ages. ClusterState lives on the event loop thread and is not safe to read
  from the HTTP server's thread, so ``ClusterCollector`` takes its sample on the loop (one short pass over
  the jobs and nodes) and formats it in the scrape thread.

Every metric is in ``registry()`` (this process's, with the process and Python collectors), which
``serve_metrics`` exposes on ``[controller] metrics_address``. The events are counted without prometheus-client,
which is imported only for the registry (see below).
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import functools
import logging
import math
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from garrison.model.domain import Job, JobState, NodeState

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

    from garrison.controller.clock import Clock
    from garrison.controller.state import ClusterState

log = logging.getLogger("garrison.controller.metrics")

# How long a scrape waits for the event loop to take the cluster sample before it answers without it.
SAMPLE_TIMEOUT_S = 5.0

# The events are counted here in plain Python, and prometheus-client is imported only to expose them
# (``registry()``, when the endpoint starts): with the HTTP server it brings, importing it cost a restarted
# controller ~0.03 s of CPU before it could serve (issue 23). The samples are those its own Counter and
# Histogram give (``_total``, ``_bucket``/``_count``/``_sum``, and ``_created``).
_LOCK = threading.Lock()  # counts are bumped on the event loop and the plan's thread, read by scrapes


class _Counter:
    """A counter by label values, exposed as prometheus-client's Counter exposes one."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, tuple(labelnames)
        # label values -> [count, creation time]; an unlabelled counter exists (at 0) from the start.
        self._values: dict[tuple[str, ...], list[float]] = {} if labelnames else {(): [0.0, time.time()]}

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        if len(labels) != len(self.labelnames):
            raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {labels}")
        with _LOCK:
            value = self._values.get(labels)
            if value is None:
                value = self._values[labels] = [0.0, time.time()]
            value[0] += amount

    def family(self) -> Metric:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        with _LOCK:
            values = [(labels, count, created) for labels, (count, created) in self._values.items()]
        for labels, count, created in values:
            family.add_metric(list(labels), count, created=created)
        return family


class _Histogram:
    """An unlabelled histogram, exposed as prometheus-client's Histogram exposes one."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        self.name, self.documentation = name, documentation
        self.bounds = (*sorted(buckets), math.inf)
        self._counts = [0] * len(self.bounds)  # per bucket, not cumulative
        self._sum = 0.0
        self._created = time.time()

    def observe(self, amount: float) -> None:
        with _LOCK:
            self._counts[bisect.bisect_left(self.bounds, amount)] += 1  # the first bound >= amount
            self._sum += amount

    def family(self) -> Metric:
        from prometheus_client.metrics_core import Metric
        from prometheus_client.utils import floatToGoString

        with _LOCK:
            counts, total = list(self._counts), self._sum
        family = Metric(self.name, self.documentation, "histogram")
        cumulative = 0
        for bound, count in zip(self.bounds, counts, strict=True):
            cumulative += count
            family.add_sample(f"{self.name}_bucket", {"le": floatToGoString(bound)}, cumulative)
        family.add_sample(f"{self.name}_count", {}, cumulative)
        family.add_sample(f"{self.name}_sum", {}, total)
        family.add_sample(f"{self.name}_created", {}, self._created)
        return family


_CYCLE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SCHEDULING_CYCLE_SECONDS = _Histogram(
    "garrison_scheduling_cycle_seconds",
    "Time of one scheduling cycle: taking the snapshot, computing the plan on it and applying it.",
    _CYCLE_BUCKETS,
)
SCHEDULING_CYCLE_CPU_SECONDS = _Histogram(
    "garrison_scheduling_cycle_cpu_seconds",
    "CPU time of one scheduling cycle (the snapshot, the plan's thread and applying it): unlike its wall time, not "
    "stretched by other processes or by requests sharing the interpreter.",
    _CYCLE_BUCKETS,
)
JOB_STARTS = _Counter("garrison_job_starts", "Job attempts started (a requeued job starts again).", ["partition"])
JOB_ENDS = _Counter("garrison_job_ends", "Jobs that reached a final state, by that state.", ["partition", "state"])
JOB_REQUEUES = _Counter(
    "garrison_job_requeues", "Jobs sent back to the queue after an attempt (node failure, preemption, restart).",
    ["partition"],
)
JOB_SUBMISSIONS = _Counter("garrison_job_submissions", "Jobs submitted (each task of an array counts).", ["partition"])
PREEMPTIONS = _Counter("garrison_preemptions", "Job attempts preempted to make room for other jobs.")
PLAN_REJECTIONS = _Counter(
    "garrison_plan_rejections",
    "Starts and preemptions of a scheduling plan that no longer held when it was applied, by reason.",
    ["kind", "reason"],
)
REPORT_GROUPS = _Counter(
    "garrison_agent_report_groups",
    "Group commits: store transactions that made two or more agents' reports durable at once.",
)
REPORTS_GROUPED = _Counter("garrison_agent_reports_grouped", "Agents' reports written in a group commit of two or more.")
_EVENTS: tuple[_Counter | _Histogram, ...] = (
    SCHEDULING_CYCLE_SECONDS, SCHEDULING_CYCLE_CPU_SECONDS, JOB_STARTS, JOB_ENDS, JOB_REQUEUES, JOB_SUBMISSIONS,
    PREEMPTIONS, PLAN_REJECTIONS, REPORT_GROUPS, REPORTS_GROUPED,
)


class _EventCollector:
    """The counted events, for the registry."""

    def collect(self) -> Iterator[Metric]:
        for event in _EVENTS:
            yield event.family()

    def describe(self) -> Iterator[Metric]:
        return self.collect()


@functools.cache
def registry() -> CollectorRegistry:
    """This process's registry: the events, the process and Python collectors (and the cluster's, once
    installed). Imports prometheus-client, on first call."""
    from prometheus_client.gc_collector import GCCollector
    from prometheus_client.platform_collector import PlatformCollector
    from prometheus_client.process_collector import ProcessCollector
    from prometheus_client.registry import CollectorRegistry

    made = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=made)
    PlatformCollector(registry=made)
    GCCollector(registry=made)
    made.register(_EventCollector())
    return made


def record_report_group(size: int) -> None:
    """A group commit of ``size`` agents' reports (engine.flush_reports)."""
    REPORT_GROUPS.inc()
    REPORTS_GROUPED.inc(amount=size)


def record_plan_rejection(kind: str, reason: str) -> None:
    """``kind``: start or preemption; ``reason``: the ledger's Rejected name (GPUS_TAKEN, MEMORY_SHORT...)."""
    PLAN_REJECTIONS.inc(kind, reason)


def observe_scheduling_cycle(seconds: float, cpu_seconds: float | None = None) -> None:
    SCHEDULING_CYCLE_SECONDS.observe(seconds)
    if cpu_seconds is not None:
        SCHEDULING_CYCLE_CPU_SECONDS.observe(cpu_seconds)


def record_preemption(count: int = 1) -> None:
    """Count ``count`` preempted job attempts (called by the preemption code when it stops victims)."""
    PREEMPTIONS.inc(amount=count)


def job_changed(old: Job | None, new: Job) -> None:
    """ClusterState's job observer: count starts, ends and requeues from one job's change."""
    if old is not None and old.state == new.state:
        return
    if old is None and new.state == JobState.PENDING:
        JOB_SUBMISSIONS.inc(new.partition)
    elif new.state == JobState.CONFIGURING:
        JOB_STARTS.inc(new.partition)
    elif new.state.is_terminal and (old is None or not old.state.is_terminal):
        JOB_ENDS.inc(new.partition, new.state.value)
    elif new.state == JobState.PENDING and old is not None and old.state != JobState.PENDING:
        JOB_REQUEUES.inc(new.partition)


# -- the cluster's state, sampled at scrape time ----------------------------------------------------------


@dataclass(frozen=True)
class NodeSample:
    name: str
    state: str  # UP, DOWN, DRAIN, or UNKNOWN (UP in the store but not connected)
    gpus: int
    allocated_gpus: int
    heartbeat_age_s: float


@dataclass(frozen=True)
class ClusterSample:
    jobs: dict[tuple[str, str], int]  # (state, reason) -> count; reason only for pending jobs
    nodes: tuple[NodeSample, ...]
    agents_connected: int


def pending_reason(state: ClusterState, job: Job) -> str:
    """Why a pending job waits, as a label of few values: the scheduler's reason (Resources, Priority...),
    else the head of the job's own ("Requeued: node n1 not responding" -> "Requeued")."""
    reason = state.wait_reasons.get(job.job_id) or job.reason or "None"
    return reason.split(":", 1)[0].strip() or "None"


def sample_cluster(state: ClusterState, now: float) -> ClusterSample:
    """One pass over the jobs and nodes in memory. Run it on the thread that owns ``state``."""
    jobs: Tally[tuple[str, str]] = Tally()
    for job in state.jobs.values():
        reason = pending_reason(state, job) if job.state == JobState.PENDING else ""
        jobs[(job.state.value, reason)] += 1
    nodes = []
    for node in sorted(state.nodes.values(), key=lambda n: n.name):
        connected = node.name in state.connected
        shown = node.state.value if connected or node.state != NodeState.UP else "UNKNOWN"
        nodes.append(
            NodeSample(
                name=node.name,
                state=shown,
                gpus=node.gpu_count,
                allocated_gpus=len(state.gpu_owner.get(node.name, {})),
                heartbeat_age_s=max(now - node.last_heartbeat, 0.0),
            )
        )
    return ClusterSample(jobs=dict(jobs), nodes=tuple(nodes), agents_connected=len(state.connected))


def cluster_metrics(sample: ClusterSample) -> list[Metric]:
    from prometheus_client.core import GaugeMetricFamily

    jobs = GaugeMetricFamily(
        "garrison_jobs", "Jobs in the controller's memory by state; pending ones also by why they wait.",
        labels=["state", "reason"],
    )
    # Every state appears, at 0 when empty, so that dashboards and alerts see a series instead of none.
    counts = dict(sample.jobs)
    for state in JobState:
        if state != JobState.PENDING:
            counts.setdefault((state.value, ""), 0)
    if not any(key[0] == JobState.PENDING.value for key in counts):
        counts[(JobState.PENDING.value, "None")] = 0
    for (state_name, reason), count in sorted(counts.items()):
        jobs.add_metric([state_name, reason], count)

    gpus = GaugeMetricFamily("garrison_node_gpus", "GPUs a node has.", labels=["node"])
    allocated = GaugeMetricFamily("garrison_node_gpus_allocated", "GPUs of a node held by job attempts.",
                                  labels=["node"])
    node_state = GaugeMetricFamily("garrison_node_state", "1 for the state a node is in.", labels=["node", "state"])
    heartbeat = GaugeMetricFamily("garrison_node_heartbeat_age_seconds",
                                  "Seconds since the node's agent was last heard from.", labels=["node"])
    for node in sample.nodes:
        gpus.add_metric([node.name], node.gpus)
        allocated.add_metric([node.name], node.allocated_gpus)
        for state_name in ("UP", "DOWN", "DRAIN", "UNKNOWN"):
            node_state.add_metric([node.name, state_name], 1.0 if node.state == state_name else 0.0)
        heartbeat.add_metric([node.name], node.heartbeat_age_s)
    total = GaugeMetricFamily("garrison_gpus", "GPUs in the cluster.", value=sum(n.gpus for n in sample.nodes))
    total_allocated = GaugeMetricFamily(
        "garrison_gpus_allocated", "GPUs held by job attempts.", value=sum(n.allocated_gpus for n in sample.nodes)
    )
    agents = GaugeMetricFamily("garrison_agents_connected", "Agents with an open link to the controller.",
                               value=sample.agents_connected)
    return [jobs, gpus, allocated, node_state, heartbeat, total, total_allocated, agents]


class ClusterCollector:
    """Gauges of the cluster's state; create it on the event loop thread that owns the state.

    ``between_plans``, when given, is awaited on the loop before each sample (Engine.between_plans): a
    sample is a pass over every job in memory, and taken while a plan is computed on the planning thread it
    would take the GIL from it, every switch interval, for as long as the pass lasts."""

    def __init__(self, state: ClusterState, clock: Clock, loop: asyncio.AbstractEventLoop,
                 between_plans: Callable[[], Coroutine[object, object, None]] | None = None) -> None:
        self.state = state
        self.clock = clock
        self.loop = loop
        self.loop_thread = threading.get_ident()
        self.between_plans = between_plans
        self.failed_samples = 0

    def _sample_on_loop(self) -> ClusterSample:
        if threading.get_ident() == self.loop_thread:
            return sample_cluster(self.state, self.clock.now())
        result: concurrent.futures.Future[ClusterSample] = concurrent.futures.Future()

        def take() -> None:
            try:
                result.set_result(sample_cluster(self.state, self.clock.now()))
            except BaseException as exc:  # noqa: B036 - handed to the waiting scrape thread
                result.set_exception(exc)

        def take_between_plans() -> None:
            if self.between_plans is None:
                take()
            else:
                self.loop.create_task(self.between_plans()).add_done_callback(lambda _waited: take())

        self.loop.call_soon_threadsafe(take_between_plans)
        return result.result(timeout=SAMPLE_TIMEOUT_S)

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        try:
            sample = self._sample_on_loop()
        except (concurrent.futures.TimeoutError, RuntimeError) as exc:
            # A busy or closed loop: answer with the event metrics alone rather than fail the scrape.
            self.failed_samples += 1
            log.warning("metrics: no cluster sample this scrape (%s)", type(exc).__name__)
            sample = None
        if sample is not None:
            yield from cluster_metrics(sample)
        yield GaugeMetricFamily(
            "garrison_metrics_sample_failures", "Scrapes answered without the cluster sample.",
            value=self.failed_samples,
        )

    def describe(self) -> Iterator[Metric]:
        return iter(())  # the families depend on the cluster; registering must not take a sample


def install_cluster_collector(
    state: ClusterState, clock: Clock, loop: asyncio.AbstractEventLoop,
    between_plans: Callable[[], Coroutine[object, object, None]] | None = None,
) -> Callable[[], None]:
    """Register a ClusterCollector for ``state``; returns the function that unregisters it."""
    collector = ClusterCollector(state, clock, loop, between_plans)
    registry().register(collector)  # type: ignore[arg-type]  # prometheus-client's Collector, by its methods
    return lambda: registry().unregister(collector)  # type: ignore[arg-type]
