"""The pending queue in priority order, kept from one cycle to the next instead of priced and sorted anew.

A deep queue is mostly the same from one cycle to the next: a submission adds a job, a start removes one.
Pricing 50,000 jobs and sorting them cost most of a cycle, so the queue is ranked as of a PriorityContext
(priority.py: a moment, the usage then, the fair-share factors), which a cycle may reuse (cycle.py,
``SchedulerConfig.priority_interval_s``). While the context is the same object, an unchanged job's
priority and place in the order are too, and a cycle prices and places only the job views that are new or
changed since the last one, and drops those gone. A pending job's view is the same object from one
snapshot to the next until the job changes (controller/snapshots.py, gsim's SnapshotBuilder), so "changed"
is an identity test.

It also keeps, per job, the *shape* the bounded tail of a cycle reads (cycle.py ``_bounded_tail``): what
the gates read of a job, so that the reasons of tens of thousands of jobs behind the cycle's bounded work
are one gate check per shape and a dict lookup per job, in C.

A memo of pure functions, like the others of the core: what ``rank`` returns is what pricing every job
with the context and sorting by QUEUE_ORDER would give (tests/unit/test_sched_queue.py compares them over
random changes), whatever the queue saw before. Nothing outside the core sees it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Hashable, Sequence
from itertools import compress, filterfalse
from operator import attrgetter, is_not, itemgetter

from garrison.controller.sched.framework import QueueOrder
from garrison.controller.sched.priority import PriorityContext
from garrison.controller.sched.snapshot import PendingJob
from garrison.model.accounts import Accounting

Shape = Hashable
ShapeOf = Callable[[PendingJob], Shape]

_JOB_ID = attrgetter("job_id")
_SUBMIT_TIME = attrgetter("submit_time")
_LAST = itemgetter(-1)  # a queue key ends with the job id (QueueOrder.key)
# Up to this many jobs in and out, the order is patched in place (a bisection and a move of pointers each);
# beyond, it is filtered and sorted again, which Timsort does in a pass over the sorted runs.
PATCH_LIMIT = 256
# Queues remembered: the last one only. Each costs ~250 bytes a pending job, and a daemon's cycles all use
# the latest context (a new context is ranked starting from the last queue's order, then that queue goes).
_MAX_QUEUES = 1


class RankedQueue:
    """Every pending job of the last cycle: views, priorities as of ``pricing``, order and shapes."""

    def __init__(self, order: QueueOrder) -> None:
        self.pricing: PriorityContext | None = None  # priced as of nothing yet: the first update prices all
        self.order = order
        self.views: dict[int, PendingJob] = {}
        self.priorities: dict[int, int] = {}
        self.ids: list[int] = []  # job ids in QUEUE_ORDER (by ``_key_of``)
        self.priced_since = 0  # job views priced on their own since the last full repricing
        # Shapes (see the module docstring) for the accounting and shape function they were computed with.
        self.shape_basis: tuple[Accounting, Hashable] | None = None
        self.shape_of: dict[int, Shape] = {}
        self.members: dict[Shape, dict[int, None]] = {}  # shape -> its jobs (an ordered set)
        # One tuple per shape for all its jobs, not one per job (~90 bytes a pending job; issue 23's 2 KB).
        self.shape_objects: dict[Shape, Shape] = {}
        self.unshaped: list[int] = []  # jobs whose shape is still to be computed
        # The last cycle's reason per shape, and so per job: kept up to date job by job as they come and go,
        # and shape by shape as a shape's reason changes, so that a cycle copies them instead of writing
        # a reason for each of tens of thousands of jobs.
        self.reason_of: dict[Shape, str] = {}
        self.reasons: dict[int, str] = {}

    # -- ranking ---------------------------------------------------------------------------------------

    def update(self, pending: Sequence[PendingJob], pricing: PriorityContext) -> None:
        """Bring the queue to ``pending`` priced as of ``pricing``: with the queue's own context, price and
        place only the new and changed views and drop the others; with another, price every job again and
        sort them starting from the present order (prices move little between contexts: long sorted runs)."""
        views = self.views
        # The views that are not the queue's (new jobs, changed views), found in C: the same list as
        # ``[job for job in pending if views.get(job.job_id) is not job]``, without a bytecode loop per job.
        incoming = list(compress(pending, map(is_not, map(views.get, map(_JOB_ID, pending)), pending)))
        outgoing = [job.job_id for job in incoming if job.job_id in views]
        if len(pending) - len(incoming) + len(outgoing) < len(views):
            present = set(map(_JOB_ID, pending))
            outgoing += filterfalse(present.__contains__, views)
        if pricing is not self.pricing and pricing.prices_like(self.pricing) and self.priced_since <= len(views) + 1024:
            # Another context with the same prices (weights that read neither the clock nor usage: fifo,
            # fifo-easy): the queue is ranked as of it already. A full repricing now and then all the same,
            # which lets the priorities' memo forget the jobs gone (PriorityContext.priorities).
            self.pricing = pricing
        if pricing is not self.pricing:
            self.priced_since = 0
            self._forget(outgoing)
            self._admit(incoming)
            self._reprice(pricing)
            return
        if not incoming and not outgoing:
            return
        fresh = pricing.priorities(incoming, whole_queue=False)
        self.priced_since += len(incoming)
        ids, key_of = self.ids, self._key_of
        if len(incoming) + len(outgoing) <= PATCH_LIMIT:
            for job_id in outgoing:  # found by their old views and prices, before those go
                del ids[bisect_left(ids, key_of(job_id), key=key_of)]
            self._forget(outgoing)
            self._admit(incoming)
            self.priorities.update(fresh)
            for job in incoming:
                ids.insert(bisect_left(ids, key_of(job.job_id), key=key_of), job.job_id)
        else:
            self._forget(outgoing)
            self._admit(incoming)
            self.priorities.update(fresh)
            leaving = set(outgoing)
            kept = [i for i in ids if i not in leaving]
            kept += map(_JOB_ID, incoming)
            self.ids = self._sorted(kept)

    def _forget(self, outgoing: list[int]) -> None:
        views, priorities = self.views, self.priorities
        for job_id in outgoing:
            del views[job_id]
            priorities.pop(job_id, None)
            self._forget_shape(job_id)

    def _admit(self, incoming: list[PendingJob]) -> None:
        self.views.update(zip(map(_JOB_ID, incoming), incoming, strict=True))
        self.unshaped += map(_JOB_ID, incoming)

    def _key_of(self, job_id: int) -> tuple[float, ...]:
        """A job's place in the order: its QUEUE_ORDER key, from its view and price (kept, not stored: a
        bisection computes ~17 of them, and 50,000 stored keys would cost ~100 bytes a job)."""
        return self.order.key(job_id, self.views[job_id].submit_time, self.priorities[job_id])

    def _sorted(self, ids: list[int]) -> list[int]:
        views = self.views
        keys = self.order.keys(ids, (views[i].submit_time for i in ids), map(self.priorities.__getitem__, ids))
        keys.sort()
        return list(map(_LAST, keys))

    def _reprice(self, pricing: PriorityContext) -> None:
        """Price every job as of ``pricing`` and sort them. In the order the views came (about the order they
        were made in, so the memory they are in), not the queue's: on the project's machines a pass over
        50,000 views in queue order took several times as long as one in this order, sorting included."""
        self.pricing = pricing
        ordered = list(self.views.values())
        priorities = pricing.priorities(ordered)  # in the order of ``ordered``
        keys = self.order.keys(priorities.keys(), map(_SUBMIT_TIME, ordered), priorities.values())
        if self.ids:
            # Sorted starting from the last order: prices move little from one context to the next (among
            # jobs alike in all but their submit time, the order never changes: their priorities only grow
            # with their wait), so the sort finds long runs. The keys, small tuples made together, are cheap
            # to visit in that order where the views are not. ~2x faster than sorting them as they come.
            by_id = dict(zip(priorities.keys(), keys, strict=True))
            # Without the jobs gone (None: a key is a non-empty tuple, so filter(None) drops only those), in C.
            arranged = list(filter(None, map(by_id.get, self.ids)))
            if len(arranged) < len(keys):
                placed = set(self.ids)
                arranged += [key for key in keys if key[-1] not in placed]
            keys = arranged
        keys.sort()
        self.priorities = priorities
        self.ids = list(map(_LAST, keys))

    # -- shapes ----------------------------------------------------------------------------------------

    def reasons_by_shape(
        self, accounting: Accounting, basis: Hashable, shape_of: ShapeOf, reason_for: Callable[[PendingJob], str]
    ) -> dict[int, str]:
        """Every job's reason, ``reason_for`` one job of its shape, asked once per shape. A job's shape is
        ``shape_of(view)``, which must depend only on the view, ``accounting`` and ``basis``, and
        ``reason_for`` must answer alike for jobs of one shape. The mapping returned is the queue's own:
        the caller copies it."""
        if self.shape_basis is None or self.shape_basis[0] is not accounting or self.shape_basis[1] != basis:
            self.shape_basis = (accounting, basis)
            self.shape_of, self.members, self.shape_objects, self.unshaped = {}, {}, {}, list(self.views)
            self.reason_of, self.reasons = {}, {}
        known, members, views, objects = self.shape_of, self.members, self.views, self.shape_objects
        newly = []
        for job_id in self.unshaped:
            job = views.get(job_id)
            if job is not None and job_id not in known:
                shape = shape_of(job)
                shape = known[job_id] = objects.setdefault(shape, shape)
                members.setdefault(shape, {})[job_id] = None
                newly.append(job_id)
        self.unshaped = []
        before, reasons = self.reason_of, self.reasons
        now = {shape: reason_for(views[next(iter(jobs))]) for shape, jobs in members.items()}
        for shape, reason in now.items():
            if before.get(shape) != reason:
                reasons.update(dict.fromkeys(members[shape], reason))
        reasons.update(zip(newly, map(now.__getitem__, map(known.__getitem__, newly)), strict=True))
        self.reason_of = now
        return reasons

    def _forget_shape(self, job_id: int) -> None:
        shape = self.shape_of.pop(job_id, None)
        if shape is None:
            return
        self.reasons.pop(job_id, None)
        members = self.members[shape]
        del members[job_id]
        if not members:
            del self.members[shape]
            del self.shape_objects[shape]


# The queues of the last few contexts, most recently used last.
_QUEUES: list[RankedQueue] = []


def rank(pending: Sequence[PendingJob], pricing: PriorityContext, order: QueueOrder) -> RankedQueue:
    """The queue of ``pending`` priced as of ``pricing``, in ``order``: the last cycle's, brought up to date
    (only the changed jobs priced and placed while the context is the same), else priced and sorted."""
    for at, queue in enumerate(_QUEUES):
        if queue.order is order:
            del _QUEUES[at]
            break
    else:
        queue = RankedQueue(order)
        while len(_QUEUES) >= _MAX_QUEUES:
            del _QUEUES[0]
    queue.update(pending, pricing)
    _QUEUES.append(queue)
    return queue
