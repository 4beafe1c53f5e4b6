"""Per-user request rate limits for the controller's client RPCs (gRPC RESOURCE_EXHAUSTED when exceeded)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from garrison.controller.domain import Principal


class RateLimited(Exception):
    """Too many requests from one user (gRPC RESOURCE_EXHAUSTED)."""


class RateLimiter:
    """A token bucket per user: ``rate_per_s`` requests a second sustained, ``burst`` at once.

    Keyed by uid, which only authenticated requests have, so the table grows with the number of real
    users, not with what an attacker sends; full buckets are dropped when it gets large anyway.
    """

    MAX_TRACKED = 10_000

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate_per_s = rate_per_s
        self.burst = max(1, burst)
        self._clock = clock
        self._buckets: dict[int, tuple[float, float]] = {}  # uid -> (tokens, when)
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.rate_per_s > 0

    def check(self, principal: Principal) -> None:
        if not self.enabled:
            return
        now = self._clock()
        with self._lock:
            tokens, when = self._buckets.get(principal.uid, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - when) * self.rate_per_s)
            if tokens < 1.0:
                self._buckets[principal.uid] = (tokens, now)
                wait = (1.0 - tokens) / self.rate_per_s
                raise RateLimited(
                    f"too many requests from {principal.user}: the limit is {self.rate_per_s:g}/s "
                    f"(bursts of {self.burst}); retry in {wait:.1f}s"
                )
            self._buckets[principal.uid] = (tokens - 1.0, now)
            if len(self._buckets) > self.MAX_TRACKED:
                self._forget_idle(now)

    def _forget_idle(self, now: float) -> None:
        refill_s = self.burst / self.rate_per_s
        self._buckets = {uid: b for uid, b in self._buckets.items() if now - b[1] < refill_s}
