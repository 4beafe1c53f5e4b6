"""How does a test wait for something another process or thread will make true?

By polling a condition under a deadline, never by sleeping a fixed time: ``wait_until`` returns as soon as
the predicate holds and fails, naming what it waited for and the last value it saw, once the deadline
passes. The pause between polls starts short (most conditions hold within milliseconds) and backs off, so a
slow condition on a loaded machine does not turn into a busy loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_INTERVAL_S = 0.01
DEFAULT_MAX_INTERVAL_S = 0.3
BACKOFF = 1.5


class WaitTimeout(AssertionError):
    """The condition did not hold before the deadline; an AssertionError so pytest reports a failure."""

    def __init__(self, what: str, timeout_s: float, last_value: object) -> None:
        super().__init__(f"timed out after {timeout_s}s waiting for {what}; the last value seen was {last_value!r}")
        self.what = what
        self.timeout_s = timeout_s
        self.last_value = last_value


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float,
    *,
    what: str,
    interval_s: float = DEFAULT_INTERVAL_S,
    max_interval_s: float = DEFAULT_MAX_INTERVAL_S,
) -> T:
    """Call ``predicate`` until it returns a truthy value and return that value.

    The predicate is called at least once, and once more at the deadline, so a condition that became true
    during the last pause still counts. Between calls the pause grows from ``interval_s`` by half each time
    up to ``max_interval_s``. Exceptions from the predicate propagate: a predicate that can fail while the
    condition is not yet true must catch that itself and return something falsy.
    """
    deadline = time.monotonic() + timeout_s
    pause_s = interval_s
    while True:
        value = predicate()
        if value:
            return value
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            raise WaitTimeout(what, timeout_s, value)
        time.sleep(min(pause_s, remaining_s))  # the poll interval, bounded by the deadline
        pause_s = min(pause_s * BACKOFF, max_interval_s)
