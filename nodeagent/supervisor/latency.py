"""Measure how long it takes from client.spawn() to the first rank's program running.

    python -m garrison.nodeagent.supervisor.latency [--runs N] [--forkserver]

The rank is ``/bin/date +%s%N`` writing its own start time to its stdout file, so the
figure is an upper bound: it includes date's own start-up (well under a millisecond).
Each run waits for the supervisor's notify datagram before starting the next one.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

from . import client
from .forkserver import start_forkserver
from .spec import LaunchSpec, RankSpec


def measure(runs: int, use_forkserver: bool) -> tuple[list[float], list[float]]:
    """(spawn() call durations, spawn-to-first-exec latencies), in milliseconds."""
    spawn_ms: list[float] = []
    exec_ms: list[float] = []
    with tempfile.TemporaryDirectory(prefix="garrison-latency-") as scratch_name:
        scratch = Path(scratch_name)
        server = start_forkserver(scratch / "forkserver.sock") if use_forkserver else None
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notifications:
                notifications.bind(str(scratch / "notify.sock"))
                notifications.settimeout(30)
                for run in range(runs):
                    job_dir = scratch / f"job{run}"
                    stamp = scratch / f"stamp{run}"
                    spec = LaunchSpec(
                        job_id=run,
                        attempt=0,
                        uid=os.getuid(),
                        gid=os.getgid(),
                        groups=[],
                        user="latency",
                        ranks=[
                            RankSpec(
                                rank=0,
                                argv=["/bin/date", "+%s%N"],
                                env={},
                                cwd=str(scratch),
                                stdout=str(stamp),
                                stderr=str(stamp),
                            )
                        ],
                        kill_wait_s=1.0,
                        notify_socket=str(scratch / "notify.sock"),
                    )
                    started_ns = time.time_ns()
                    client.spawn(
                        job_dir, spec, forkserver=None if server is None else scratch / "forkserver.sock"
                    )
                    spawned_ns = time.time_ns()
                    notifications.recv(4096)
                    spawn_ms.append((spawned_ns - started_ns) / 1e6)
                    exec_ms.append((int(stamp.read_text()) - started_ns) / 1e6)
        finally:
            if server is not None:
                server.terminate()
                server.wait()
    return spawn_ms, exec_ms


def _summary(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    return f"median {statistics.median(ordered):6.2f} ms  p90 {p90:6.2f} ms  min {ordered[0]:6.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--forkserver", action="store_true", help="spawn through a fork server")
    arguments = parser.parse_args()
    spawn_ms, exec_ms = measure(arguments.runs, arguments.forkserver)
    how = "fork server" if arguments.forkserver else "new interpreter"
    print(f"{how}, {arguments.runs} runs, {os.cpu_count()} CPUs")
    print(f"  spawn() returns:           {_summary(spawn_ms)}")
    print(f"  spawn() -> first rank runs: {_summary(exec_ms)}")


if __name__ == "__main__":
    main()
