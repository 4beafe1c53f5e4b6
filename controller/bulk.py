"""Large submissions and cancellations without stalling the controller for everyone else (issue 20).

One user's 100,000-task array used to be written in one transaction on the event loop (30 s during which
every other user's gqueue hung) and cancelled the same way (9 s). Here both are cut into chunks:

- **Submission**: the store first records the submission as unfinished (``begin_submission``), then takes
  the tasks in chunks written on a thread of their own (the event loop keeps answering between and during
  them), then marks the submission finished; only then do the tasks enter memory, a chunk per turn of the
  event loop. A controller killed midway restarts without the partial array (``load`` discards unfinished
  submissions): the client never got the job id, so nothing was promised. The jobs are new, so no other
  operation can touch them while they are written.
- **Cancellation** of pending jobs: a chunk at a time on the event loop (store, then memory, as every other
  job change), yielding between chunks, so that no other operation waits behind more than one chunk. Done
  on the loop rather than on a thread because these jobs are in memory: a scheduling cycle or an update
  between a chunk's write and its memory change would otherwise be lost.

Small submissions and cancellations (up to CHUNK_JOBS jobs) take the ordinary one-transaction path.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from garrison.model.domain import Job, JobState

if TYPE_CHECKING:
    from garrison.controller.state import ClusterState

log = logging.getLogger("garrison.controller.bulk")

# Jobs per store transaction and per turn of the event loop. 1,000 rows are a few tens of milliseconds to
# write on a small machine: what another user's request may have to wait behind, at most.
CHUNK_JOBS = 1000
# Work on the event loop is cut into chunks of about this long (see Pacer), and the longest pause after one.
CHUNK_TARGET_S = 0.01
MAX_PAUSE_S = 0.05
# At least this many per chunk: on PostgreSQL a chunk's time is mostly its commit's round trip, and chunks
# of ten made a 100,000-task cancel take five minutes on a loaded machine.
MIN_CHUNK_JOBS = 100


class Pacer:
    """Shares the event loop between a long piece of work done in chunks and everything else.

    Yielding with ``sleep(0)`` between chunks is not enough: another user's request takes several turns of
    the loop (accept, look the peer up on a thread, read, answer), and each turn would wait for a whole
    chunk. So after each chunk the work pauses for as long as the chunk took (at most MAX_PAUSE_S): the rest
    of the controller gets at least half of the loop while it runs. And the chunks are sized by time, not by
    count (``size``, adjusted after each chunk to take about CHUNK_TARGET_S), since what 1,000 jobs cost
    varies tenfold with the machine's load.
    """

    def __init__(self, size: int = 100) -> None:
        self.size = size
        self._since = time.perf_counter()

    async def pause(self, done: int) -> None:
        """``done`` jobs (or items) were handled since the last pause."""
        elapsed = time.perf_counter() - self._since
        if done > 0 and elapsed > 0:
            self.size = max(MIN_CHUNK_JOBS, min(CHUNK_JOBS, int(done * CHUNK_TARGET_S / elapsed)))
        await asyncio.sleep(min(elapsed, MAX_PAUSE_S))
        self._since = time.perf_counter()


@dataclass(frozen=True)
class NewJobs:
    """A submission's jobs before they exist: ``count`` jobs with ids from ``first``, ``make(i)`` the i-th.

    Made on demand because making 100,000 Job values takes a second of CPU: a large array's are made a
    chunk at a time on the store's thread, not on the event loop.
    """

    first: int
    count: int
    make: Callable[[int], Job]
    # Whether the transaction that stores the jobs also takes their ids from the store's counter
    # (StoreChanges.job_ids); False: they were reserved already (allocate_job_ids).
    take_ids: bool = False

    @property
    def job_ids(self) -> tuple[int, int] | None:
        """What the storing transaction takes from the counter (PendingWrites.job_ids)."""
        return (self.first, self.first + self.count) if self.take_ids else None

    def build(self, start: int = 0, stop: int | None = None) -> list[Job]:
        return [self.make(i) for i in range(start, self.count if stop is None else min(stop, self.count))]


class BulkWriter:
    """Submits and cancels many jobs at once in chunks (see the module's docstring)."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        # One thread: two large submissions queue behind each other rather than share the store's lock.
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="bulk-store")

    def close(self) -> None:
        self._pool.shutdown(wait=False)

    async def add_jobs(self, new: NewJobs, hold: bool = False) -> None:
        """Make and store a submission's jobs (held by their user with ``hold``), then put them in memory."""
        if new.count <= CHUNK_JOBS:
            with self.state.atomically() as pending:  # the ids, the jobs and their hold, in one transaction
                pending.job_ids = new.job_ids
                self.state.add_jobs(new.build())
                if hold:
                    self.state.hold(range(new.first, new.first + new.count), by_admin=False)
            return
        loop = asyncio.get_running_loop()
        made = await loop.run_in_executor(self._pool, self._store_in_chunks, new, hold)
        # Durable now: into memory, a chunk at a time.
        pacer = Pacer()
        jobs = [job for chunk in made for job in chunk]
        start = 0
        while start < len(jobs):
            chunk = jobs[start : start + pacer.size]
            self.state.remember_stored(chunk)
            if hold:
                self.state.held.update(job.job_id for job in chunk)
            start += len(chunk)
            await pacer.pause(len(chunk))

    def _store_in_chunks(self, new: NewJobs, hold: bool) -> list[list[Job]]:
        """On the store's thread: the submission marked unfinished, its jobs made and saved a chunk per
        transaction, then marked finished (see the module's docstring)."""
        assert not new.take_ids, "a submission in chunks reserves its ids first (allocate_job_ids)"
        store = self.state.store
        store.begin_submission(new.first, new.count)
        made = []
        for start in range(0, new.count, CHUNK_JOBS):
            chunk = new.build(start, start + CHUNK_JOBS)
            store.save_jobs(chunk)
            if hold:
                store.set_holds([job.job_id for job in chunk], by_admin=False)
            made.append(chunk)
        store.end_submission(new.first)
        return made

    async def cancel(self, job_ids: Sequence[int], now: float) -> list[int]:
        """Cancel the pending ones of ``job_ids`` a chunk at a time; the others are the caller's. Returns the
        jobs cancelled. A job that left PENDING meanwhile (started by a cycle between two chunks) is left to
        the caller too: ``state.cancel`` stops it like any running job."""
        cancelled: list[int] = []
        pacer = Pacer()
        start = 0
        while start < len(job_ids):
            selected = job_ids[start : start + pacer.size]
            start += len(selected)
            batch = [
                job_id for job_id in selected
                if (job := self.state.jobs.get(job_id)) is not None and job.state == JobState.PENDING
            ]
            done, _ = self.state.cancel(batch, now)  # pending jobs only: no instructions
            cancelled += done
            await pacer.pause(len(selected))
        return cancelled
