"""Builders for the scheduling core's tests: node views from real machine descriptions, jobs, snapshots."""

from __future__ import annotations

from dataclasses import replace

from garrison.controller.sched.snapshot import NodeView, PendingJob, RunningJob, node_view
from garrison.machines.description import load_description, resolve_topology
from garrison.model.domain import Allocation, JobSpec, NodeAllocation, NodeInventory
from garrison.nodeagent.gpu.discovery import discover
from garrison.nodeagent.gpu.fake_nvml import install_fake_nvml, uninstall_fake_nvml

NOW = 1_000_000.0


def machine(topology: str, name: str = "n") -> NodeInventory:
    """The inventory an agent discovers on a machine description (dgx1v, dgx-a100, pcie4, pcie8)."""
    install_fake_nvml(load_description(resolve_topology(topology)), name)
    try:
        return discover(name)
    finally:
        uninstall_fake_nvml()


def view_of(inventory: NodeInventory, name: str, free: set[int] | None = None, partitions: frozenset[str] = frozenset({"main"}),
            switches: tuple[str, ...] = (), drained: bool = False, schedulable: bool = True) -> NodeView:
    gpus = frozenset(range(len(inventory.gpus))) if free is None else frozenset(free)
    return node_view(inventory, name, schedulable=schedulable, free_gpus=gpus, partitions=partitions,
                     drained=drained, switches=switches)


def node(name: str, gpus: int = 8, free: set[int] | None = None, gpu_name: str = "NVIDIA A100",
         switches: tuple[str, ...] = (), partitions: frozenset[str] = frozenset({"main"}), drained: bool = False,
         schedulable: bool = True, cpus: int = 0, memory_mb: int = 0) -> NodeView:
    """A plain node: NVSwitch-like (every pair equally connected), no CPU or memory accounting unless given."""
    return NodeView(
        name=name,
        schedulable=schedulable,
        gpu_names=(gpu_name,) * gpus,
        free_gpus=frozenset(range(gpus) if free is None else free),
        nvlink=tuple(tuple(0 if i == j else 12 for j in range(gpus)) for i in range(gpus)),
        partitions=partitions,
        drained=drained,
        cpus=cpus,
        free_cpus=frozenset(range(cpus)),
        memory_mb=memory_mb,
        free_memory_mb=memory_mb,
        switches=switches,
    )


def pending(job_id: int, *, submit: float | None = None, account: str = "default", user: str = "u",
            qos: str = "", limit: int | None = 3600, partition: str = "main", priority: int = 0, held: bool = False,
            array_job_id: int | None = None, **spec: object) -> PendingJob:
    return PendingJob(
        job_id=job_id,
        spec=JobSpec(name="j", command=("true",), **spec),  # type: ignore[arg-type]
        partition=partition,
        submit_time=float(job_id) if submit is None else submit,
        priority=priority,
        array_job_id=array_job_id,
        held=held,
        user=user,
        account=account,
        qos=qos,
        time_limit_s=limit,
    )


def running(job_id: int, placement: dict[str, tuple[int, ...]], *, start: float = NOW - 100, limit: int = 3600,
            account: str = "default", user: str = "u", qos: str = "", checkpoint: float | None = None,
            stopping: bool = False, array_job_id: int | None = None) -> RunningJob:
    allocation = Allocation(tuple(NodeAllocation(n, gpus) for n, gpus in placement.items()))
    return RunningJob(job_id=job_id, attempt=0, allocation=allocation, start_time=start, time_limit_s=limit,
                      user=user, account=account, qos=qos, checkpoint_time=checkpoint, stopping=stopping,
                      array_job_id=array_job_id)


def busy(view: NodeView, *jobs: RunningJob) -> NodeView:
    """``view`` with the GPUs of ``jobs`` on it taken."""
    taken = {g for job in jobs for g in job.allocation.gpus_on(view.name)}
    return replace(view, free_gpus=view.free_gpus - taken)
