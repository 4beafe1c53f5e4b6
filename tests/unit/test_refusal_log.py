"""RefusalLog (controller/ratelimit.py): refused requests are logged at most a burst per client and kind per
period, and the rest are counted in one line, so a client past its limit cannot write the log as fast as it
sends (issue 20: 9.6 MiB of log in 10 s)."""

from __future__ import annotations

from garrison.controller.ratelimit import RefusalLog


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_then_a_count_when_the_period_is_over() -> None:
    clock, lines = Clock(), []
    refusals = RefusalLog(lines.append, burst=3, period_s=10.0, clock=clock)
    for i in range(1000):
        refusals.refused(("RESOURCE_EXHAUSTED", "from", "uid 1000"), f"refused ListJobs #{i}")
    assert lines == ["refused ListJobs #0", "refused ListJobs #1", "refused ListJobs #2"]
    clock.now = 10.5
    refusals.refused(("RESOURCE_EXHAUSTED", "from", "uid 1000"), "refused ListJobs again")
    assert lines[3:] == [
        "997 more refusals of RESOURCE_EXHAUSTED from uid 1000 in 10s were not logged (at most 3 lines per 10s)",
        "refused ListJobs again",
    ]


def test_each_client_and_kind_has_its_own_burst() -> None:
    clock, lines = Clock(), []
    refusals = RefusalLog(lines.append, burst=1, period_s=10.0, clock=clock)
    for who in ("uid 1", "uid 2"):
        for kind in ("PERMISSION_DENIED", "RESOURCE_EXHAUSTED"):
            refusals.refused((kind, "from", who), f"{kind} {who}")
            refusals.refused((kind, "from", who), f"{kind} {who} again")
    assert len(lines) == 4 and not any("again" in line for line in lines)


def test_a_quiet_client_gets_its_count_at_the_next_sweep_or_at_flush() -> None:
    clock, lines = Clock(), []
    refusals = RefusalLog(lines.append, burst=1, period_s=10.0, clock=clock)
    refusals.refused("uid 7", "first")
    refusals.refused("uid 7", "second")
    clock.now = 11.0
    refusals.refused("uid 8", "other")  # any refusal after a period sweeps the expired ones
    assert lines == ["first", "1 more refusals of uid 7 in 10s were not logged (at most 1 lines per 10s)", "other"]
    refusals.refused("uid 8", "other again")
    refusals.flush()
    assert lines[-1].startswith("1 more refusals of uid 8")


def test_the_table_is_bounded() -> None:
    clock, lines = Clock(), []
    refusals = RefusalLog(lines.append, burst=1, period_s=10.0, clock=clock)
    refusals.MAX_TRACKED = 100
    for i in range(1000):
        refusals.refused(f"host {i}", f"refused {i}")
    assert len(refusals._windows) <= 101
    assert len([line for line in lines if line.startswith("refused")]) == 1000
