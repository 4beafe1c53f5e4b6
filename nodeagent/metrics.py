"""The agent's Prometheus metrics: each GPU's load through NVML, and the GPUs of each job running here.

Read at scrape time, in the HTTP server's thread: NVML for the GPUs (thread-safe, and the real pynvml and
the fake library answer the same calls), and the job directories for which attempt holds which GPUs. A job's
GPUs are exclusively its own while it runs, so a job's usage is its GPUs' usage: no per-process accounting
is needed, and it works the same with the fake NVML, which runs no processes.

The job directories are the agent's own durable record (``STATE_DIR/jobs/<job>.<attempt>/launch.json``,
written before the supervisor starts); reading them needs nothing from the agent's event loop, and they
survive an agent restart, so the metrics do too.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pynvml
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics_core import Metric
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

from garrison.nodeagent.supervisor import client as supervisor
from garrison.nodeagent.supervisor.spec import LaunchSpec

log = logging.getLogger("garrison.agent.metrics")

MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuReading:
    index: int
    uuid: str
    name: str
    gpu_percent: float | None  # None: the GPU does not report it (e.g. MIG mode)
    memory_percent: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None


@dataclass(frozen=True)
class JobOnNode:
    """A job attempt running on this node and the GPU indices it holds here."""

    job_id: int
    attempt: int
    user: str
    gpus: tuple[int, ...]


def running_jobs(jobs_dir: Path) -> list[JobOnNode]:
    """Attempts whose supervisor has not reported the end of every rank, with their GPUs.

    launch.json names the GPUs the attempt holds on this node by the node's indices (its ranks'
    CUDA_VISIBLE_DEVICES may number them from 0: see launch/env.py). Nodes of an allocation with no ranks
    here (``--launch single``) have no launch.json and are not listed.
    """
    found: list[JobOnNode] = []
    try:
        entries = sorted(os.scandir(jobs_dir), key=lambda e: e.name)
    except FileNotFoundError:
        return found
    for entry in entries:
        head, _, tail = entry.name.partition(".")
        if not (head.isdigit() and tail.isdigit()) or not entry.is_dir():
            continue  # staging directories (".new") and anything else
        job_dir = Path(entry.path)
        try:
            status = supervisor.read_status(job_dir)
            if status is not None and status.finished:
                continue
            spec = LaunchSpec.from_json((job_dir / "launch.json").read_bytes())
        except (OSError, ValueError):
            continue  # no launch here, or the directory went away (acknowledged) as we read it
        found.append(JobOnNode(spec.job_id, spec.attempt, spec.user, tuple(sorted(set(spec.gpus)))))
    return found


def _optional(call: object, *args: object) -> object | None:
    """One NVML query, or None when the GPU does not support it."""
    try:
        return call(*args)  # type: ignore[operator]
    except pynvml.NVMLError_NotSupported:
        return None


class NodeCollector(Collector):
    """GPU and job gauges for one node. NVML stays initialised for the collector's life."""

    def __init__(self, node_name: str, jobs_dir: Path) -> None:
        self.node_name = node_name
        self.jobs_dir = jobs_dir
        self.nvml_errors = 0
        try:
            pynvml.nvmlInit()
            self.nvml_ready = True
        except pynvml.NVMLError as exc:
            log.warning("metrics: NVML unavailable (%s); no GPU metrics on %s", exc, node_name)
            self.nvml_ready = False

    def close(self) -> None:
        if self.nvml_ready:
            self.nvml_ready = False
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass

    def read_gpus(self) -> list[GpuReading]:
        if not self.nvml_ready:
            return []
        readings: list[GpuReading] = []
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError:
            self.nvml_errors += 1
            return readings
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = str(pynvml.nvmlDeviceGetUUID(handle))
                name = str(pynvml.nvmlDeviceGetName(handle))
                rates = _optional(pynvml.nvmlDeviceGetUtilizationRates, handle)
                memory = _optional(pynvml.nvmlDeviceGetMemoryInfo, handle)
            except pynvml.NVMLError as exc:
                # One GPU that stopped answering (fallen off the bus, Xid) must not hide the others.
                self.nvml_errors += 1
                log.warning("metrics: NVML query of GPU %d failed: %s", index, exc)
                continue
            readings.append(
                GpuReading(
                    index=index,
                    uuid=uuid,
                    name=name,
                    gpu_percent=float(rates.gpu) if rates is not None else None,  # type: ignore[attr-defined]
                    memory_percent=float(rates.memory) if rates is not None else None,  # type: ignore[attr-defined]
                    memory_used_bytes=int(memory.used) if memory is not None else None,  # type: ignore[attr-defined]
                    memory_total_bytes=int(memory.total) if memory is not None else None,  # type: ignore[attr-defined]
                )
            )
        return readings

    def collect(self) -> Iterator[Metric]:
        gpus = self.read_gpus()
        jobs = running_jobs(self.jobs_dir)
        yield from node_metrics(self.node_name, gpus, jobs, self.nvml_ready, self.nvml_errors)

    def describe(self) -> Iterator[Metric]:
        return iter(())  # families depend on the node; registering must not query NVML


def node_metrics(
    node: str, gpus: list[GpuReading], jobs: list[JobOnNode], nvml_ready: bool, nvml_errors: int
) -> list[Metric]:
    gpu_labels = ["node", "gpu", "uuid", "name"]
    utilization = GaugeMetricFamily("garrison_gpu_utilization_percent",
                                    "Percent of time a kernel ran on the GPU over the last sample period (NVML).",
                                    labels=gpu_labels)
    memory_activity = GaugeMetricFamily("garrison_gpu_memory_utilization_percent",
                                        "Percent of time GPU memory was read or written (NVML).", labels=gpu_labels)
    memory_used = GaugeMetricFamily("garrison_gpu_memory_used_bytes", "GPU memory in use.", labels=gpu_labels)
    memory_total = GaugeMetricFamily("garrison_gpu_memory_total_bytes", "GPU memory.", labels=gpu_labels)
    by_index: dict[int, GpuReading] = {}
    for reading in gpus:
        by_index[reading.index] = reading
        labels = [node, str(reading.index), reading.uuid, reading.name]
        if reading.gpu_percent is not None:
            utilization.add_metric(labels, reading.gpu_percent)
        if reading.memory_percent is not None:
            memory_activity.add_metric(labels, reading.memory_percent)
        if reading.memory_used_bytes is not None:
            memory_used.add_metric(labels, reading.memory_used_bytes)
        if reading.memory_total_bytes is not None:
            memory_total.add_metric(labels, reading.memory_total_bytes)

    job_labels = ["node", "job", "attempt", "user"]
    job_gpus = GaugeMetricFamily("garrison_job_gpus", "GPUs a running job attempt holds on this node.",
                                 labels=job_labels)
    job_utilization = GaugeMetricFamily("garrison_job_gpu_utilization_percent",
                                        "Utilisation of each GPU of a running job attempt.", labels=[*job_labels, "gpu"])
    job_memory = GaugeMetricFamily("garrison_job_gpu_memory_used_bytes",
                                   "GPU memory in use on each GPU of a running job attempt.", labels=[*job_labels, "gpu"])
    for job in jobs:
        labels = [node, str(job.job_id), str(job.attempt), job.user]
        job_gpus.add_metric(labels, len(job.gpus))
        for index in job.gpus:
            found = by_index.get(index)
            if found is None:
                continue
            if found.gpu_percent is not None:
                job_utilization.add_metric([*labels, str(index)], found.gpu_percent)
            if found.memory_used_bytes is not None:
                job_memory.add_metric([*labels, str(index)], found.memory_used_bytes)
    running = GaugeMetricFamily("garrison_node_jobs_running", "Job attempts running on this node.",
                                labels=["node"])
    running.add_metric([node], len(jobs))
    nvml_up = GaugeMetricFamily("garrison_nvml_up", "1 if NVML answers on this node.", labels=["node"])
    nvml_up.add_metric([node], 1.0 if nvml_ready else 0.0)
    errors = CounterMetricFamily("garrison_nvml_errors", "NVML queries that failed.", labels=["node"])
    errors.add_metric([node], nvml_errors)
    return [utilization, memory_activity, memory_used, memory_total, job_gpus, job_utilization, job_memory,
            running, nvml_up, errors]


def node_registry(node_name: str, jobs_dir: Path) -> CollectorRegistry:
    """A registry with the node's collector and the process and Python collectors, for serve_metrics."""
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    registry.register(NodeCollector(node_name, jobs_dir))
    return registry
