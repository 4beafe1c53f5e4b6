"""Agents' reports that could not be made durable yet, kept in order per node and retried with backoff.

An agent's report (a registration's reconciliation, an attempt started or finished) changes jobs, and a
change is kept only once the store has committed it (controller/transaction.py). While the database is
unavailable such a report is refused by the store, memory is left as it was, and the report waits here:
it is applied again, in the order the agent sent it, as soon as the store takes writes again. The agent's
stream stays open meanwhile, and its result is acknowledged only once it is durable, so the agent keeps it
on disk until then. Reports are idempotent (a result applied twice is acknowledged twice and counted
once), so retrying one is always safe.

A node's backlog that could not be written for ``retry_for_s`` (the controller's ``store_retry_s``) is
dropped, and the caller closes that agent's stream: the agent reconnects and reports everything it has
not had acknowledged again.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from garrison.controller.store.errors import StoreUnavailable

log = logging.getLogger("garrison.controller")

FIRST_RETRY_S = 0.1
MAX_RETRY_S = 5.0


@dataclass
class _Report:
    apply: Callable[[], None]  # raises StoreUnavailable when the store refused it (memory then unchanged)
    since: float  # when it was first refused


class AgentBacklog:
    def __init__(self, retry_for_s: float) -> None:
        self.retry_for_s = retry_for_s
        self._queues: dict[str, deque[_Report]] = {}
        self._delay = FIRST_RETRY_S
        self._next_try = 0.0

    def __len__(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    def waiting(self, node: str) -> bool:
        return node in self._queues

    def deliver(self, node: str, apply: Callable[[], None], now: float) -> bool:
        """Apply a report from ``node`` now, or queue it behind the node's earlier ones, or (refused by the
        store) queue it for a retry. True when it was applied."""
        queue = self._queues.get(node)
        if queue is not None:
            queue.append(_Report(apply, now))
            return False
        try:
            apply()
        except StoreUnavailable as error:
            log.warning("node %s: report waits for the database (%s)", node, error.cause)
            self._queues[node] = deque([_Report(apply, now)])
            self._next_try = now + self._delay
            return False
        return True

    def drop(self, node: str) -> int:
        """Forget a node's queued reports (its stream has closed: it reports them again when it returns)."""
        return len(self._queues.pop(node, ()))

    def retry(self, now: float) -> list[str]:
        """Apply the queued reports that the store now takes, oldest first per node, when the backoff allows.
        Returns the nodes whose reports have waited past ``retry_for_s``, which were dropped."""
        if not self._queues or now < self._next_try:
            return []
        gave_up: list[str] = []
        refused = False
        for node, queue in list(self._queues.items()):
            while queue:
                try:
                    queue[0].apply()
                except StoreUnavailable:
                    refused = True
                    break
                queue.popleft()
            if not queue:
                del self._queues[node]
                log.info("node %s: queued reports written", node)
            elif now - queue[0].since >= self.retry_for_s:
                del self._queues[node]
                gave_up.append(node)
                log.error("node %s: %d report(s) could not be written for %.0fs; the agent will report them again",
                          node, len(queue), now - queue[0].since)
        # Exponential backoff while the store refuses; at once again after it has taken a write.
        self._delay = min(self._delay * 2, MAX_RETRY_S) if refused else FIRST_RETRY_S
        self._next_try = now + self._delay
        return gave_up
