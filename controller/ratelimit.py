"""Request rate limits for the controller's client RPCs (gRPC RESOURCE_EXHAUSTED when exceeded): per user,
and per client host for failed authentications. Both are token buckets (TokenBuckets)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from garrison.model.domain import Principal

K = TypeVar("K", bound=Hashable)


class RateLimited(Exception):
    """Too many requests from one user (gRPC RESOURCE_EXHAUSTED)."""


class TokenBuckets(Generic[K]):
    """A token bucket per key: ``rate_per_s`` tokens a second, at most ``burst``; a new key starts full.

    The table is bounded: past MAX_TRACKED keys the full (idle) buckets go first, then the oldest. Callers
    hold ``lock`` around ``tokens`` and ``set``.
    """

    MAX_TRACKED = 10_000

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float]) -> None:
        self.rate_per_s = rate_per_s
        self.burst = max(1, burst)
        self.clock = clock
        self.lock = threading.Lock()
        self._buckets: dict[K, tuple[float, float]] = {}  # key -> (tokens, when)

    @property
    def enabled(self) -> bool:
        return self.rate_per_s > 0

    def tokens(self, key: K, now: float) -> float:
        tokens, when = self._buckets.get(key, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - when) * self.rate_per_s)

    def set(self, key: K, tokens: float, now: float) -> None:
        self._buckets[key] = (tokens, now)
        if len(self._buckets) > self.MAX_TRACKED:
            refill_s = self.burst / self.rate_per_s
            self._buckets = {k: b for k, b in self._buckets.items() if now - b[1] < refill_s}
        if len(self._buckets) > self.MAX_TRACKED:  # all busy: keep the most recent half
            recent = sorted(self._buckets.items(), key=lambda item: item[1][1])[-self.MAX_TRACKED // 2:]
            self._buckets = dict(recent)

    def wait_s(self, tokens: float) -> float:
        """How long until a bucket holding ``tokens`` has one again."""
        return (1.0 - tokens) / self.rate_per_s

    def __contains__(self, key: K) -> bool:
        return key in self._buckets


class RateLimiter:
    """A token bucket per user: ``rate_per_s`` requests a second sustained, ``burst`` at once.

    Keyed by uid, which only authenticated requests have, so the table grows with the number of real
    users, not with what an attacker sends.
    """

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._buckets: TokenBuckets[int] = TokenBuckets(rate_per_s, burst, clock)

    @property
    def enabled(self) -> bool:
        return self._buckets.enabled

    def check(self, principal: Principal) -> None:
        buckets = self._buckets
        if not buckets.enabled:
            return
        now = buckets.clock()
        with buckets.lock:
            tokens = buckets.tokens(principal.uid, now)
            if tokens < 1.0:
                buckets.set(principal.uid, tokens, now)
                raise RateLimited(
                    f"too many requests from {principal.user}: the limit is {buckets.rate_per_s:g}/s "
                    f"(bursts of {buckets.burst}); retry in {buckets.wait_s(tokens):.1f}s"
                )
            buckets.set(principal.uid, tokens - 1.0, now)


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
    controls the number of, which is why TokenBuckets bounds its table.
    """

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic,
                 warn: Callable[[str], None] | None = None) -> None:
        self._buckets: TokenBuckets[str] = TokenBuckets(rate_per_s, burst, clock)
        self._warn = warn
        self._warned: dict[str, float] = {}  # host -> when its current refusal period was logged

    @property
    def enabled(self) -> bool:
        return self._buckets.enabled

    def admit(self, host: str) -> None:
        """Raise AuthFailuresLimited if ``host`` has used up its failed authentications."""
        buckets = self._buckets
        if not buckets.enabled:
            return
        now = buckets.clock()
        with buckets.lock:
            tokens = buckets.tokens(host, now)
            if tokens >= 1.0:
                return
            period_s = buckets.burst / buckets.rate_per_s
            if self._warn is not None and now - self._warned.get(host, -1e18) > period_s:
                self._warned = {h: w for h, w in self._warned.items() if h in buckets}
                self._warned[host] = now
                self._warn(f"refusing requests from {host} for a while: more than {buckets.burst} failed "
                           f"authentications at over {buckets.rate_per_s:g}/s")
        raise AuthFailuresLimited(
            f"too many failed authentications from {host}: the limit is {buckets.rate_per_s:g}/s "
            f"(bursts of {buckets.burst}); retry in {buckets.wait_s(tokens):.1f}s"
        )

    def failed(self, host: str) -> None:
        buckets = self._buckets
        if not buckets.enabled:
            return
        now = buckets.clock()
        with buckets.lock:
            buckets.set(host, max(0.0, buckets.tokens(host, now) - 1.0), now)


class RefusalLog:
    """Log lines for refused requests, at most ``burst`` per key (who, and which refusal) per ``period_s``.

    Each refused request used to log a line, so a client past its rate limit wrote the log as fast as it
    could send (9.6 MiB in 10 s). Past the burst, refusals are counted, and the count is logged in one line
    when the key's period is over (at its next refusal, or at the next sweep of expired periods). The
    table is bounded like TokenBuckets': the keys are what a client controls the number of.
    """

    MAX_TRACKED = 10_000

    def __init__(self, emit: Callable[[str], None], burst: int = 20, period_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.emit = emit
        self.burst = max(1, burst)
        self.period_s = period_s
        self.clock = clock
        self.lock = threading.Lock()
        self._windows: dict[Hashable, list[float]] = {}  # key -> [period start, lines logged, refusals not logged]
        self._swept = clock()

    def refused(self, key: Hashable, line: str) -> None:
        now = self.clock()
        out: list[str] = []
        with self.lock:
            if now - self._swept >= self.period_s or len(self._windows) > self.MAX_TRACKED:
                self._sweep(now, out)
            window = self._windows.get(key)
            if window is not None and now - window[0] >= self.period_s:
                self._close(key, window, out)
                window = None
            if window is None:
                window = self._windows[key] = [now, 0, 0]
            if window[1] < self.burst:
                window[1] += 1
                out.append(line)
            else:
                window[2] += 1
        for text in out:
            self.emit(text)

    def _close(self, key: Hashable, window: list[float], out: list[str]) -> None:
        if window[2]:
            out.append(f"{int(window[2])} more refusals of {_describe(key)} in {self.period_s:g}s were not logged "
                       f"(at most {self.burst} lines per {self.period_s:g}s)")
        del self._windows[key]

    def _sweep(self, now: float, out: list[str]) -> None:
        self._swept = now
        for key, window in list(self._windows.items()):
            if now - window[0] >= self.period_s:
                self._close(key, window, out)
        if len(self._windows) > self.MAX_TRACKED:  # all current: forget the oldest half, counts and all
            oldest = sorted(self._windows.items(), key=lambda item: item[1][0])[: len(self._windows) // 2]
            for key, window in oldest:
                self._close(key, window, out)

    def flush(self) -> None:
        """Log the counts of every period still open (at shutdown, and in tests)."""
        out: list[str] = []
        with self.lock:
            for key, window in list(self._windows.items()):
                self._close(key, window, out)
        for text in out:
            self.emit(text)


def _describe(key: Hashable) -> str:
    if isinstance(key, tuple):
        return " ".join(str(part) for part in key)
    return str(key)
