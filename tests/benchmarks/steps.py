#!/usr/bin/env python3
"""Job steps on a local cluster: how long gsrun takes, and how fast output streams. Prints `key: value`.

    python tests/benchmarks/steps.py [--runs 20] [--megabytes 64]

Starts `garrison up` with two fake nodes and one running job holding a GPU on each, then measures, with
fresh gsrun processes as a user runs them:
  1. `gsrun true` on one node and `gsrun -N 2 true` on both, from gsrun's start to its exit (median, p90);
  2. the output rate of one task writing N MiB to stdout, through agent, controller and gsrun;
  3. `gsrun --pty`'s round trip: a byte typed at gsrun's terminal until its echo comes back (median).
"""

from __future__ import annotations

import argparse
import os
import pty
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.polling import wait_until  # noqa: E402

BIN = Path(sys.executable).parent


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / args[0]), *args[1:]], env=env, capture_output=True, text=True, timeout=300,
                          check=True)


def timed(env: dict[str, str], runs: int, *args: str) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([str(BIN / "gsrun"), *args], env=env, check=True, capture_output=True, timeout=60)
        times.append(time.perf_counter() - started)
    return times


def pty_round_trip(env: dict[str, str], job_id: str, count: int) -> list[float]:
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(str(BIN / "gsrun"), [str(BIN / "gsrun"), "--jobid", job_id, "--pty", "cat"], env)
    times = []
    time.sleep(1.0)  # let cat start; not a measurement
    for index in range(count):
        token = f"{index % 10}".encode()
        started = time.perf_counter()
        os.write(fd, token)
        seen = b""
        while token not in seen:
            ready, _, _ = select.select([fd], [], [], 10)
            if not ready:
                raise SystemExit("no echo from the pty step")
            seen += os.read(fd, 1024)
        times.append(time.perf_counter() - started)
    os.write(fd, b"\x04\x04")
    os.waitpid(pid, 0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--megabytes", type=int, default=64)
    options = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="gbench-steps-", dir="/tmp"))
    os.chmod(state, 0o755)
    env = dict(os.environ, XDG_CACHE_HOME=str(state / "cache"), PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    env.pop("GARRISON_CONTROLLER", None)
    up = run(env, "garrison", "up", "--state-dir", str(state), "--fake-topology", "dgx-a100", "--fake-topology", "dgx1v")
    env["GARRISON_CONTROLLER"] = up.stdout.strip().split("=", 1)[1]
    try:
        job_id = run(env, "gsub", "--parsable", "-N", "2", "--gpus-per-node", "1", "-t", "30:00", "--wrap",
                     "sleep 1800").stdout.strip()
        wait_until(lambda: "RUNNING" in run(env, "gqueue", "-h", "-j", job_id).stdout, 60, what="the job to run")
        one = timed(env, options.runs, "--jobid", job_id, "-N", "1", "true")
        both = timed(env, options.runs, "--jobid", job_id, "-N", "2", "true")
        print(f"gsrun_true_1node_median_ms: {statistics.median(one) * 1000:.0f}")
        print(f"gsrun_true_1node_p90_ms: {sorted(one)[int(0.9 * (len(one) - 1))] * 1000:.0f}")
        print(f"gsrun_true_2nodes_median_ms: {statistics.median(both) * 1000:.0f}")
        size = options.megabytes << 20
        started = time.perf_counter()
        out = subprocess.run([str(BIN / "gsrun"), "--jobid", job_id, "-N", "1", "head", "-c", str(size), "/dev/zero"],
                             env=env, capture_output=True, timeout=600, check=True).stdout
        elapsed = time.perf_counter() - started
        print(f"output_bytes_received: {len(out)} of {size}")
        print(f"output_rate_mib_s: {len(out) / elapsed / (1 << 20):.1f}")
        echoes = pty_round_trip(env, job_id, 50)
        print(f"pty_echo_median_ms: {statistics.median(echoes) * 1000:.0f}")
    finally:
        subprocess.run([str(BIN / "garrison"), "down", "--state-dir", str(state)], env=env, capture_output=True,
                       timeout=120)
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
