#!/usr/bin/env python3
"""How long one command takes as a user runs it: wall and CPU time of fresh processes. Prints `key: value`.

    python tests/benchmarks/cli_latency.py NAME CALLS -- COMMAND [ARGS...]

Runs COMMAND CALLS times, one after the other, in this environment (compare_slurm.sh runs it for sbatch,
scontrol and squeue with Slurm's environment, and for gsub, gjob and gqueue with Garrison's, so both sides
are timed by the same code), and prints NAME_wall_ms_median, NAME_wall_ms_min, NAME_wall_ms_max and
NAME_cpu_ms_median (user + system time of the process and everything it waited for, from wait4).
"""

from __future__ import annotations

import os
import statistics
import sys
import time


def run_once(argv: list[str]) -> tuple[float, float]:
    """One run's wall and CPU seconds; its output goes to /dev/null. Exits if the command fails."""
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: the command, nothing of Python's subprocess machinery in between
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        try:
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)}: exit status {os.waitstatus_to_exitcode(status)}")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> int:
    if len(sys.argv) < 5 or sys.argv[3] != "--":
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    name, calls, argv = sys.argv[1], int(sys.argv[2]), sys.argv[4:]
    run_once(argv)  # a warm-up: the first call fills caches (the page cache, the CLI's endpoint cache)
    walls, cpus = zip(*(run_once(argv) for _ in range(calls)), strict=True)
    print(f"{name}_wall_ms_median: {statistics.median(walls) * 1000:.1f}")
    print(f"{name}_wall_ms_min: {min(walls) * 1000:.1f}")
    print(f"{name}_wall_ms_max: {max(walls) * 1000:.1f}")
    print(f"{name}_cpu_ms_median: {statistics.median(cpus) * 1000:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
