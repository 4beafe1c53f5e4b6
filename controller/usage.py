"""The usage ledger: GPU-seconds per (account, user), decayed for fair share and raw for quotas.

The controller charges it on its timer (``charge``) with the GPUs each running job holds; between charges
every record decays by 2**(-elapsed/half_life) and gains exactly what a constant rate would have added
(fairshare.accrued), so the result does not depend on how often it is charged. The raw count since the start
of the current quota period feeds GPU-hour quotas; periods are fixed windows of ``period_s`` counted from
the Unix epoch. No I/O here: the controller saves ``state()`` to the store every few seconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from garrison.controller.sched.fairshare import accrued
from garrison.controller.sched.snapshot import UsageView
from garrison.model.accounts import UsageRecord, UsageState

Association = tuple[str, str]


@dataclass(slots=True)
class _Entry:
    decayed: float = 0.0
    period: float = 0.0
    total: float = 0.0


class UsageLedger:
    def __init__(self, state: UsageState, half_life_s: float, period_s: float, now: float) -> None:
        if half_life_s <= 0 or period_s <= 0:
            raise ValueError("usage half-life and quota period must be positive")
        self.half_life_s = half_life_s
        self.period_s = period_s
        self.entries: dict[Association, _Entry] = {
            (r.account, r.user): _Entry(r.decayed_gpu_s, r.period_gpu_s, r.total_gpu_s) for r in state.records
        }
        self.updated_at = state.updated_at or now
        self.period_start = state.period_start or self.period_of(now)
        self._view: dict[Association, UsageView] | None = None
        self.charge(now, ())  # decay what was saved across the time the controller was down

    def period_of(self, when: float) -> float:
        return math.floor(when / self.period_s) * self.period_s

    def charge(self, now: float, holders: Iterable[tuple[str, str, int]]) -> None:
        """Decay everything to ``now`` and charge each (account, user, GPUs) held since the last charge."""
        elapsed = now - self.updated_at
        if elapsed < 0:
            return  # a clock step backwards: charge from the new time on
        period = self.period_of(now)
        if period > self.period_start:
            for entry in self.entries.values():
                entry.period = 0.0
            self.period_start = period
        if elapsed > 0:
            factor = 0.5 ** (elapsed / self.half_life_s)
            for entry in self.entries.values():
                entry.decayed *= factor
            for account, user, gpus in holders:
                charged = self.entries.get((account, user))
                if charged is None:
                    charged = self.entries[(account, user)] = _Entry()
                charged.decayed += accrued(gpus, elapsed, self.half_life_s)
                charged.period += gpus * elapsed
                charged.total += gpus * elapsed
        self.updated_at = now
        self._view = None

    def view(self) -> Mapping[Association, UsageView]:
        """The scheduling core's copy (immutable values; rebuilt only after a charge)."""
        if self._view is None:
            self._view = {key: UsageView(e.decayed, e.period) for key, e in self.entries.items()}
        return self._view

    def state(self) -> UsageState:
        return UsageState(
            records=tuple(
                UsageRecord(account, user, e.decayed, e.period, e.total)
                for (account, user), e in sorted(self.entries.items())
            ),
            updated_at=self.updated_at,
            period_start=self.period_start,
        )
