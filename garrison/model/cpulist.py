"""Linux CPU lists ("0-19,40-59"), both ways: what NVML and /proc give, and what gjob shows."""

from __future__ import annotations

from collections.abc import Iterable


def parse_cpu_list(text: str) -> frozenset[int]:
    """"0-19,40-59" -> {0..19, 40..59}; anything unreadable (an "N/A") is no CPUs."""
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low, sep, high = part.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            return frozenset()
        cpus.update(range(int(low), int(high if sep else low) + 1))
    return frozenset(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """CPU numbers as a Linux cpu list: [0, 1, 2, 5, 7, 8] -> "0-2,5,7-8"."""
    ranges: list[str] = []
    ordered = sorted(set(cpus))
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        first, last = ordered[start], ordered[end]
        ranges.append(str(first) if first == last else f"{first}-{last}")
        start = end + 1
    return ",".join(ranges)
