"""One controller operation, all or nothing: the store commits first, and memory keeps a change only then.

An operation (a cancel, an agent's report, a plan's starts, a timer's expiry...) runs inside
``JobLifecycle.atomically()``. While it runs it changes memory as it always has, so its later steps see its
earlier ones, but every job, hold, node and attempt-stop it writes is buffered in ``PendingWrites``
instead of going to the store; and a ``MemoryCheckpoint`` taken when it began remembers what memory was.
At the end the buffered writes go to the store in one transaction (``Store.write``). If that fails
(``StoreUnavailable``: the database is down, its disk full...) or the operation itself raises, memory is
put back exactly as the checkpoint found it: no attempt closed, no GPU freed or taken, no job moved on.
The job observers (metrics, snapshot views) hear of a change only once it is durable.

The checkpoint copies the small collections whole (nodes, connections, which attempts are live, the GPUs
they own), and journals the rest on first change: a live attempt's fields (``live_changing``: the lifecycle
calls it before it changes one) and what is sized by the queue (jobs, the startable queue, holds, wait
reasons: ``job_changing``), which can hold 100,000 entries. An operation costs what it touches.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from garrison.controller.store.interface import AttemptStop, StoreChanges
from garrison.model.domain import Job, Node

if TYPE_CHECKING:
    from garrison.controller.ledger import LiveAttempt
    from garrison.controller.lifecycle import JobLifecycle

_MISSING = object()


def _copied(value: Any) -> Any:
    """A copy of a LiveAttempt field's value deep enough that changing the field's container in place
    (``pending_nodes.discard``) does not change it."""
    if isinstance(value, set):
        return set(value)
    if isinstance(value, dict):
        return dict(value)
    return value


class MemoryCheckpoint:
    """What the lifecycle's memory was when an operation began, to put back if it fails."""

    def __init__(self, state: JobLifecycle) -> None:
        self._state = state
        ledger = state.ledger
        # Containers are restored in place: the ledger, lifecycle and reconciliation share them by reference.
        dicts: tuple[dict[Any, Any], ...] = (ledger.live, ledger.nodes, *self._extra_dicts())
        sets: tuple[set[Any], ...] = (ledger.connected, *self._extra_sets())
        self._dicts = [(d, dict(d)) for d in dicts]
        self._sets = [(s, set(s)) for s in sets]
        self._gpu_owner = {node: dict(owners) for node, owners in ledger.gpu_owner.items()}
        self._lives: dict[int, tuple[LiveAttempt, tuple[Any, ...]]] = {}  # id -> (attempt, its fields as they were)
        # Per job changed: (the job, its queue entry, its wait reason, held, held by an admin), as they were.
        self._jobs: dict[int, tuple[Any, Any, Any, bool, bool]] = {}

    def _extra_dicts(self) -> tuple[dict[Any, Any], ...]:
        partitions = getattr(self._state, "node_partitions", None)
        return (partitions,) if isinstance(partitions, dict) else ()

    def _extra_sets(self) -> tuple[set[Any], ...]:
        names = ("silent_drained", "unsaved_nodes")
        return tuple(value for name in names if isinstance(value := getattr(self._state, name, None), set))

    def job_changing(self, job_id: int) -> None:
        """A job (or its queue entry, hold or wait reason) is about to change in memory: remember how it was
        before the operation, once."""
        if job_id not in self._jobs:
            state = self._state
            self._jobs[job_id] = (
                state.jobs.get(job_id, _MISSING),
                state.ledger.queued.get(job_id, _MISSING),
                state.wait_reasons.get(job_id, _MISSING),
                job_id in state.ledger.held,
                job_id in state.admin_held,
            )

    def live_changing(self, live: LiveAttempt) -> None:
        """A live attempt's fields are about to change: remember them as they were, once."""
        if id(live) not in self._lives:
            self._lives[id(live)] = (live, tuple(_copied(getattr(live, name)) for name in _live_field_names()))

    def restore(self) -> None:
        names = _live_field_names()
        for live, values in self._lives.values():
            for name, value in zip(names, values, strict=True):
                setattr(live, name, value)
        for current, saved in self._dicts:
            current.clear()
            current.update(saved)
        for current_set, saved_set in self._sets:
            current_set.clear()
            current_set.update(saved_set)
        owners = self._state.ledger.gpu_owner
        owners.clear()
        owners.update({node: dict(saved) for node, saved in self._gpu_owner.items()})
        state = self._state
        for job_id, (job, queued, reason, held, admin_held) in self._jobs.items():
            _put_back(state.jobs, job_id, job)
            _put_back(state.ledger.queued, job_id, queued)
            _put_back(state.wait_reasons, job_id, reason)
            (state.ledger.held.add if held else state.ledger.held.discard)(job_id)
            (state.admin_held.add if admin_held else state.admin_held.discard)(job_id)


def _put_back(mapping: dict[int, Any], key: int, value: Any) -> None:
    if value is _MISSING:
        mapping.pop(key, None)
    else:
        mapping[key] = value


@functools.cache
def _live_field_names() -> tuple[str, ...]:
    from garrison.controller.ledger import LiveAttempt

    return tuple(f.name for f in dataclasses.fields(LiveAttempt))


@dataclasses.dataclass
class PendingWrites:
    """What an operation has changed so far, to be written in one transaction when it ends."""

    checkpoint: MemoryCheckpoint
    jobs: dict[int, Job] = dataclasses.field(default_factory=dict)
    holds: dict[int, bool | None] = dataclasses.field(default_factory=dict)
    nodes: dict[str, Node] = dataclasses.field(default_factory=dict)
    stops: dict[tuple[int, int], AttemptStop] = dataclasses.field(default_factory=dict)
    observed: list[tuple[Job | None, Job]] = dataclasses.field(default_factory=list)  # for the job observers
    job_ids: tuple[int, int] | None = None  # a submission's ids, taken from the counter (StoreChanges.job_ids)

    def changes(self) -> StoreChanges:
        return StoreChanges(jobs=list(self.jobs.values()), holds=dict(self.holds), nodes=list(self.nodes.values()),
                            stops=list(self.stops.values()), job_ids=self.job_ids)


P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S", bound="JobLifecycle")


def atomic(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """Run a lifecycle operation all or nothing (see the module's docstring); an operation it calls joins the
    outer one's transaction."""

    @functools.wraps(method)
    def wrapper(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
        with self.atomically():
            return method(self, *args, **kwargs)

    return wrapper
