"""The immutable input of one scheduling cycle.

A snapshot is built from the controller's in-memory state (never by re-reading the database) and handed
to ``schedule``; the same types are built by the tests and by the simulator with a virtual clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from garrison.controller.domain import JobSpec


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    schedulable: bool  # UP and connected
    gpu_names: tuple[str, ...]  # by GPU index
    free_gpus: frozenset[int]
    nvlink: tuple[tuple[int, ...], ...]  # lanes between GPU pairs, by index
    partitions: frozenset[str]
    drained: bool = False

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_names)


@dataclass(frozen=True, slots=True)
class PendingJob:
    job_id: int
    spec: JobSpec
    partition: str
    submit_time: float
    priority: int = 0
    array_job_id: int | None = None
    held: bool = False


@dataclass(frozen=True, slots=True)
class Snapshot:
    nodes: tuple[NodeView, ...]
    pending: tuple[PendingJob, ...]
    # running (or starting) tasks per array job id, for --array=...%N limits
    running_array_tasks: tuple[tuple[int, int], ...] = ()
