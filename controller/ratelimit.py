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


def peer_host(peer: str) -> str:
    """The host part of a gRPC peer string: ``ipv4:10.0.0.5:51234`` -> ``10.0.0.5``, ``ipv6:[::1]:5`` ->
    ``::1``; anything else (a Unix socket) is its own key."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or rest
    if kind == "ipv6":
        host = rest.rpartition(":")[0] or rest
        return host.strip("[]")
    return peer


class AuthFailuresLimited(RateLimited):
    """A host whose requests keep failing authentication is refused before its next one is even checked.
    Logged once per refusal period by the limiter rather than once per request (``quiet``)."""

    quiet = True


class AuthFailureLimiter:
    """A token bucket per peer host that only failed authentications drain.

    Verifying a forged token or credential costs a signature check and a log line; without a bound, anyone
    who can reach the port can make the controller spend both without limit. Hosts are what an attacker
    controls the number of, so the table is bounded: idle entries go first, then the oldest.
    """

    MAX_TRACKED = 10_000

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic,
                 warn: Callable[[str], None] | None = None) -> None:
        self.rate_per_s = rate_per_s
        self.burst = max(1, burst)
        self._clock = clock
        self._warn = warn
        self._buckets: dict[str, tuple[float, float]] = {}  # host -> (tokens, when)
        self._warned: dict[str, float] = {}  # host -> when its current refusal period was logged
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.rate_per_s > 0

    def _tokens(self, host: str, now: float) -> float:
        tokens, when = self._buckets.get(host, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - when) * self.rate_per_s)

    def admit(self, host: str) -> None:
        """Raise AuthFailuresLimited if ``host`` has used up its failed authentications."""
        if not self.enabled:
            return
        now = self._clock()
        with self._lock:
            tokens = self._tokens(host, now)
            if tokens >= 1.0:
                return
            wait = (1.0 - tokens) / self.rate_per_s
            if self._warn is not None and now - self._warned.get(host, -1e18) > self.burst / self.rate_per_s:
                self._warned[host] = now
                self._warn(f"refusing requests from {host} for a while: more than {self.burst} failed "
                           f"authentications at over {self.rate_per_s:g}/s")
        raise AuthFailuresLimited(
            f"too many failed authentications from {host}: the limit is {self.rate_per_s:g}/s "
            f"(bursts of {self.burst}); retry in {wait:.1f}s"
        )

    def failed(self, host: str) -> None:
        if not self.enabled:
            return
        now = self._clock()
        with self._lock:
            self._buckets[host] = (max(0.0, self._tokens(host, now) - 1.0), now)
            if len(self._buckets) > self.MAX_TRACKED:
                self._forget(now)

    def _forget(self, now: float) -> None:
        refill_s = self.burst / self.rate_per_s
        self._buckets = {h: b for h, b in self._buckets.items() if now - b[1] < refill_s}
        if len(self._buckets) > self.MAX_TRACKED:  # all busy: keep the most recent half
            recent = sorted(self._buckets.items(), key=lambda item: item[1][1])[-self.MAX_TRACKED // 2:]
            self._buckets = dict(recent)
        self._warned = {h: w for h, w in self._warned.items() if h in self._buckets}
