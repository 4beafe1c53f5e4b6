"""Accounting's questions (gacct): which job records match, and how much GPU time who used in a period.

The store keeps every job and attempt the controller ever wrote, while the controller's memory holds only
recent ones, so these answers are read from the database. Those reads can be long (months of jobs), so
they run on a small thread pool of their own, never on the event loop that serves submissions and agents,
and never on the pool the scheduler uses. The engine owns this service; the RPC layer
(controller/rpc/accounting.py) asks it and never touches the store itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from garrison.controller.store.interface import JobQuery, Store, UsageRow
from garrison.model.domain import Job

__all__ = ["QUERY_THREADS", "AccountingQuery", "JobQuery", "UsageQuery", "UsageRow"]

# At most this many accounting queries run at once; more wait their turn instead of taking database
# connections (and CPU) from the controller's own writes.
QUERY_THREADS = 2

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class UsageQuery:
    """GPU time per (account, user) in [start, end]; empty filters match everyone."""

    start: float
    end: float
    users: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()


class AccountingQuery:
    """The read side of the store that accounting may use, and the pool its reads run on."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=QUERY_THREADS, thread_name_prefix="accounting"
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def run(self, answer: Callable[..., R], *args: object) -> R:
        """``answer(*args)`` on the accounting pool: a handler that reads (and shapes its answer from) the
        queries below, so neither the read nor the shaping of months of records blocks the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, answer, *args)

    def job_records(self, query: JobQuery) -> list[Job]:
        """Jobs matching ``query`` with all their attempts, ordered by id, finished ones included. Blocking:
        call it from ``run``."""
        return self._store.query_jobs(query)

    def usage(self, query: UsageQuery, now: float) -> list[UsageRow]:
        """GPU time per (account, user) in the period; an attempt still running counts up to ``now``.
        Blocking: call it from ``run``."""
        return self._store.usage(query.start, query.end, now, users=list(query.users), accounts=list(query.accounts))
