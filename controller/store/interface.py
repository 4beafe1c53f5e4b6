"""What the controller needs from its durable store, independent of the database behind it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..domain import Job, Node


@dataclass(frozen=True)
class LoadedState:
    """Everything the controller rebuilds its in-memory state from at start-up."""

    jobs: list[Job]  # every job with its attempts (in attempt order), ordered by job_id
    nodes: list[Node]  # ordered by name
    next_job_id: int  # the first id allocate_job_ids has not handed out yet


class Store(Protocol):
    """The controller's durable copy of its state.

    The controller's memory is authoritative while it runs; it writes every change through to the store
    before acting on it (a submit is persisted before the client sees its job id), and reads everything back
    with ``load`` at start-up. Every method commits before it returns, so a change a method has returned from
    survives the controller being killed. Methods may be called from several threads.
    """

    def load(self) -> LoadedState: ...

    def allocate_job_ids(self, count: int) -> int:
        """Durably reserve ``count`` consecutive job ids and return the first; ids start at 1 and are never
        handed out twice, even if the controller crashes before it uses them."""
        ...

    def save_jobs(self, jobs: Sequence[Job]) -> None:
        """Insert or update each job and all of its attempts, in one transaction."""
        ...

    def save_node(self, node: Node) -> None:
        """Insert or update a node and its GPUs."""
        ...

    def delete_jobs(self, job_ids: Sequence[int]) -> None:
        """Remove jobs and their attempts (retention of finished jobs); unknown ids are ignored."""
        ...

    def close(self) -> None: ...
