"""Building the scheduling core's Snapshot from ClusterState's memory, cheaply, every cycle.

Pending jobs' views are kept up to date as jobs change: ClusterState reports every job change it writes
through to the store to its job observers, and this cache is one of them, so a cycle over 10,000 pending
jobs copies a dict instead of visiting every job. (The engine's in-memory-only update of a pending job's
reason is not reported, and needs not be: the reason is not part of the view.) Node and running-job views
are cached against the objects they came from and rebuilt only when those change. Nothing here reads the
store.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from functools import lru_cache
from itertools import islice
from typing import TYPE_CHECKING

from garrison.controller.dependency import AFTERCORR, DependencyList, parse_dependency, typed_dependencies
from garrison.controller.sched.attained import Service
from garrison.controller.sched.dependencies import JobDependencies
from garrison.controller.sched.snapshot import (
    EMPTY_ACCOUNTING,
    NodeView,
    PendingJob,
    RunningJob,
    Snapshot,
    UsageView,
    parse_cpu_list,
)
from garrison.controller.signals import parse_signal_request
from garrison.model.accounts import Accounting
from garrison.model.construct import constructor_without_init
from garrison.model.domain import Attempt, Job, JobState, Node, NodeState
from garrison.model.jobrefs import JobLookup, parse_job_ref
from garrison.model.partitions import SEPARATOR, partition_names

if TYPE_CHECKING:
    from garrison.controller.ledger import LiveAttempt
    from garrison.controller.state import ClusterState


# The first cycle after a restart builds a view of every pending job (50,000: ~0.15 s of the event loop's time
# through PendingJob's frozen __init__, half that without it).
_new_pending = constructor_without_init(PendingJob)


def pending_view(job: Job) -> PendingJob:
    """What the scheduling core sees of a pending job."""
    partition = job.partition
    others: tuple[str, ...] = ()
    if SEPARATOR in partition:  # -p a,b: tried in a, then b
        partition, *rest = partition_names(partition)
        others = tuple(rest)
    return _new_pending(
        job_id=job.job_id,
        spec=job.spec,
        partition=partition,
        other_partitions=others,
        submit_time=job.submit_time,
        priority=job.priority,
        array_job_id=job.array_job_id,
        user=job.user,
        account=job.account,
        qos=job.spec.qos or "",
        time_limit_s=job.time_limit_s,
        service=attempt_service(job.attempts) if job.attempts else (),
    )


def attempt_service(attempts: Sequence[Attempt]) -> Service:
    """(start, end, GPUs) of each attempt that has ended, for attained service (sched/attained.py)."""
    return tuple((a.start_time, a.end_time, a.allocation.gpu_count()) for a in attempts if a.end_time is not None)


def _warning_lead_s(job: Job) -> int | None:
    """The job's --signal lead time (validated at submission), which the core weighs in preemption grace."""
    return parse_signal_request(job.spec.signal).seconds if job.spec.signal else None


# What a pending job's typed dependencies are made of: its -d text, its (user, name) for a singleton, and its
# array index for aftercorr (None otherwise, so that an array's tasks share one typing).
DependencyKey = tuple[str, str, str, int | None]


@lru_cache(maxsize=4096)
def _parsed_dependency(text: str) -> DependencyList:
    """parse_dependency, once per distinct -d text (validated at submission; the result is immutable)."""
    return parse_dependency(text)


class SnapshotCache:
    def __init__(self) -> None:
        self._pending: dict[int, PendingJob] | None = None  # None until the first build reads every job
        # The job ids whose first views are still to be made (make_first_views): jobs of the state as it was
        # loaded, viewed a chunk at a time while the controller already serves; the next build makes the rest.
        self._unviewed: Iterator[int] = iter(())
        # Pending jobs with a -d dependency, by what their typed dependencies are made of: the -d text and the
        # (user, name) of a singleton. Every task of an array shares one, so a build types each once.
        self._dependency_key: dict[int, DependencyKey] = {}
        self._by_dependency: dict[DependencyKey, set[int]] = {}
        self._key_objects: dict[DependencyKey, DependencyKey] = {}  # one tuple per key, not one per job (64 bytes)
        self._typed: dict[DependencyKey, JobDependencies] = {}  # as the last build typed them
        # Each job's view carries its hold and its typed dependencies itself, patched in place (_repatch) where
        # something changed: one view per pending job, not a second, patched one beside it (the 2 KB a pending
        # job may cost, issue 23), and a cycle over 50,000 held or dependent jobs does not make 50,000 views
        # again (it did, ~50 ms of the controller's CPU for every submission that triggered a cycle).
        self._unpatched: set[int] = set()  # pending jobs whose view changed since the last build
        self._held_before: set[int] = set()  # state.held as the last build saw it
        self._nodes: dict[str, tuple[tuple[object, ...], NodeView]] = {}
        self._gpu_cpus: dict[str, tuple[object, tuple[frozenset[int], ...]]] = {}
        self._running: dict[tuple[int, int], tuple[tuple[object, ...], RunningJob]] = {}

    def build(
        self,
        state: ClusterState,
        accounting: Accounting = EMPTY_ACCOUNTING,
        usage: Mapping[tuple[str, str], UsageView] | None = None,
        switches: Mapping[str, tuple[str, ...]] | None = None,
    ) -> Snapshot:
        running = self._running_jobs(state)
        used_cpus, used_memory = state.held_cpus_and_memory()
        # Which nodes some attempt holds, and which an --exclusive one holds (even a job asking for no GPU,
        # CPU or memory occupies its nodes for --exclusive).
        busy: set[str] = set()
        exclusive: set[str] = set()
        for run in running:
            busy.update(run.allocation.node_names)
            job = state.jobs.get(run.job_id)
            if job is not None and job.spec.exclusive:
                exclusive.update(run.allocation.node_names)
        nodes = tuple(
            self._node_view(state, node, frozenset(used_cpus.get(node.name, ())), used_memory.get(node.name, 0),
                            (switches or {}).get(node.name, ()), node.name not in busy, node.name in exclusive)
            for node in state.nodes.values()
        )
        if self._pending is None:
            self._pending = {}
            for job in state.jobs.values():
                self.job_changed(None, job)
        else:
            self._view_jobs(state, self._unviewed)
        changed_dependencies = self._type_dependencies(state)
        self._repatch(state.held, changed_dependencies)
        pending = list(self._pending.values())
        singletons = any(d.singleton_key is not None for d in self._typed.values())
        return Snapshot(
            nodes=nodes,
            pending=tuple(pending),
            running=running,
            accounting=accounting,
            usage=usage if usage is not None else {},
            running_names=frozenset((j.user, j.spec.name) for j in state.jobs.values() if j.state.holds_resources)
            if singletons else frozenset(),
        )

    def _repatch(self, held: set[int], changed_dependencies: list[DependencyKey]) -> None:
        """Bring the views up to date: each pending job's view held and with its typed dependencies where it
        has them. Only the jobs that may differ from the last build are looked at: those whose view changed,
        those held or released since (a set difference, in C), and those whose typed dependencies changed."""
        views = self._pending
        assert views is not None
        changed_holds = held ^ self._held_before
        if changed_holds:
            self._held_before = set(held)
        # (A job whose dependency was removed was changed, so it is in _unpatched.)
        suspects = self._unpatched | changed_holds
        for key in changed_dependencies:
            suspects.update(self._by_dependency.get(key, ()))
        self._unpatched = set()
        typed_by_key, dependency_key = self._typed, self._dependency_key
        for job_id in suspects:
            view = views.get(job_id)
            if view is None:  # no longer pending (job_changed has dropped its view)
                continue
            is_held = job_id in held
            dependency = dependency_key.get(job_id)
            typed = None if dependency is None else typed_by_key[dependency]
            # The same view object as last cycle while nothing about it changed: the core keeps its place in the
            # ranked queue by identity (sched/queue.py). (_type_dependencies keeps a typing equal to the last.)
            if view.held != is_held or view.dependencies is not typed:
                views[job_id] = replace(view, held=is_held, dependencies=typed)

    def make_first_views(self, state: ClusterState, count: int) -> bool:
        """Make up to ``count`` more of the views the first build would make of every pending job; whether some
        are left to make. A restarted controller makes them a chunk at a time between the first requests it
        serves (50,000 pending jobs: ~0.1 s of the event loop's time in one piece otherwise, which the first
        requests waited for). The views are the same as the first build's: from the first call on, job
        changes keep the views made so far in step (job_changed), and each job still to be viewed is viewed
        as it is when its turn comes, or by the next build, which makes all that are left."""
        if self._pending is None:
            self._pending = {}
            self._unviewed = iter(list(state.jobs))
        return self._view_jobs(state, islice(self._unviewed, count)) == count

    def _view_jobs(self, state: ClusterState, job_ids: Iterator[int]) -> int:
        """View the jobs of ``job_ids`` that are still in the state, as they are now; how many ids there were."""
        jobs, seen = state.jobs, 0
        for job_id in job_ids:
            seen += 1
            job = jobs.get(job_id)
            if job is not None:
                self.job_changed(None, job)
        return seen

    def _type_dependencies(self, state: ClusterState) -> list[DependencyKey]:
        """Type every pending job's -d list anew, for the core to decide on: the states of the jobs each
        reference stands for now, and the (user, name) of a singleton. Once per distinct list (an array's tasks
        share theirs), each reference looked up once; a typing equal to the last build's keeps its object.
        Returns the keys whose typing changed (their jobs' views are patched again)."""
        lookup = JobLookup(state.jobs)
        found: dict[str, list[Job]] = {}

        def jobs_for(ref: str) -> list[Job]:
            jobs = found.get(ref)
            if jobs is None:
                jobs = found[ref] = lookup.find(*parse_job_ref(ref))
            return jobs

        before, self._typed = self._typed, {}
        changed: list[DependencyKey] = []
        for key in self._by_dependency:
            text, user, name, array_task = key
            typed = typed_dependencies(_parsed_dependency(text), jobs_for, (user, name), array_task)
            old = before.get(key)
            if old is not None and old == typed:
                typed = old
            else:
                changed.append(key)
            self._typed[key] = typed
        return changed

    def _index_dependency(self, job: Job | None, job_id: int) -> None:
        """Keep _dependency_key and _by_dependency in step with pending job ``job`` (None: no longer pending)."""
        dependency = None if job is None else job.spec.dependency
        key = None if job is None or dependency is None else (
            dependency, job.user, job.spec.name, job.array_task_id if AFTERCORR in dependency else None)
        old = self._dependency_key.get(job_id)
        if old == key:
            return
        if old is not None:
            members = self._by_dependency[old]
            members.discard(job_id)
            if not members:
                del self._by_dependency[old]
                del self._key_objects[old]
        if key is None:
            del self._dependency_key[job_id]
        else:
            key = self._dependency_key[job_id] = self._key_objects.setdefault(key, key)
            self._by_dependency.setdefault(key, set()).add(job_id)

    def job_changed(self, before: Job | None, job: Job) -> None:
        """ClusterState's job observer: keep the pending views in step with the jobs."""
        if self._pending is None:
            return  # the first build reads every job
        if job.state != JobState.PENDING:
            self._pending.pop(job.job_id, None)
            self._index_dependency(None, job.job_id)
            return
        self._index_dependency(job, job.job_id)
        # Unpatched until the next build looks at it (_repatch).
        self._pending[job.job_id] = pending_view(job)
        self._unpatched.add(job.job_id)

    def _node_view(
        self, state: ClusterState, node: Node, used_cpus: frozenset[int], used_memory: int, switches: tuple[str, ...],
        idle: bool = True, held_exclusively: bool = False,
    ) -> NodeView:
        owned = frozenset(state.gpu_owner.get(node.name, ()))
        connected = node.name in state.connected
        partitions = state.node_partitions.get(node.name, frozenset())
        key = (node, connected, partitions, owned, used_cpus, used_memory, switches, idle, held_exclusively)
        found = self._nodes.get(node.name)
        if found is not None and found[0][0] is node and found[0][1:] == key[1:]:
            return found[1]
        inventory = node.inventory
        free = frozenset(g.index for g in inventory.gpus) - owned
        cpus_cached = self._gpu_cpus.get(node.name)
        if cpus_cached is None or cpus_cached[0] is not inventory:
            cpus_cached = (inventory, tuple(parse_cpu_list(g.cpu_affinity) for g in inventory.gpus))
            self._gpu_cpus[node.name] = cpus_cached
        view = NodeView(
            name=node.name,
            schedulable=node.state == NodeState.UP and connected,
            gpu_names=tuple(g.name for g in inventory.gpus),
            free_gpus=free,
            nvlink=inventory.nvlink,
            partitions=partitions,
            drained=node.state == NodeState.DRAIN,
            topo=inventory.topo,
            gpu_memory_mib=tuple(g.memory_mib for g in inventory.gpus),
            gpu_cpus=cpus_cached[1],
            cpus=inventory.cpus,
            free_cpus=frozenset(range(inventory.cpus)) - used_cpus,
            memory_mb=inventory.memory_mb,
            free_memory_mb=max(0, inventory.memory_mb - used_memory),
            switches=switches,
            features=frozenset(node.features),
            idle=idle,
            held_exclusively=held_exclusively,
        )
        self._nodes[node.name] = (key, view)
        return view

    def _running_jobs(self, state: ClusterState) -> tuple[RunningJob, ...]:
        out: list[RunningJob] = []
        seen: set[tuple[int, int]] = set()
        for key, live in state.live.items():
            job = state.jobs.get(live.job_id)
            if job is None or live.attempt >= len(job.attempts):
                continue
            seen.add(key)
            out.append(self._running_view(job, live))
        for key in [k for k in self._running if k not in seen]:
            del self._running[key]
        return tuple(out)

    def _running_view(self, job: Job, live: LiveAttempt) -> RunningJob:
        stopping = live.stale or live.outcome is not None
        checkpoint = getattr(live, "last_checkpoint", None)
        key = (job, stopping, checkpoint)
        found = self._running.get((live.job_id, live.attempt))
        if found is not None and found[0][0] is job and found[0][1:] == key[1:]:
            return found[1]
        attempt = job.attempts[live.attempt]
        view = RunningJob(
            job_id=job.job_id,
            attempt=live.attempt,
            allocation=live.allocation,
            start_time=attempt.start_time,
            time_limit_s=job.time_limit_s,
            user=job.user,
            account=job.account,
            qos=job.spec.qos or "",
            partition=job.partition,
            array_job_id=job.array_job_id if not live.stale else None,
            checkpoint_time=checkpoint,
            stopping=stopping,
            warning_lead_s=_warning_lead_s(job),
            service=attempt_service(job.attempts[:live.attempt]) if live.attempt else (),
        )
        self._running[(live.job_id, live.attempt)] = (key, view)
        return view
