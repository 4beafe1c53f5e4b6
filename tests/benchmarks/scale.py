#!/usr/bin/env python3
"""50,000 pending jobs on a full local cluster (issue 23). A script, not a test: prints `key: value` lines.

    python tests/benchmarks/scale.py [--pending 50000] [--agents 4] [--idle-s 60] [--cycles 7]

Starts `garrison up` (a real controller on SQLite, 4 agents x 8 fake GPUs, garrison up's configuration but
for the per-user request rate limit, a metrics endpoint and the heartbeat: --heartbeat-interval, by default
the controller's default of 5 s rather than garrison up's 1 s, whose heartbeats cost an idle controller
~1.2 ms of CPU each), fills every GPU with long jobs, then submits
--pending one-GPU jobs as arrays of up to 10,000 tasks through the client library (what gsub sends). None
of them can start. Then it measures, and prints even when the figures are bad:

- waiting: why the pending jobs cannot start (--waiting): resources (every GPU taken by long jobs), held
  (submitted held, gsub -H), or dependency (-d afterok: on one of the running long jobs);
- idle_cpu_pct: the controller's CPU (user + system, all its threads) over --idle-s seconds in which
  nothing happens, as a percentage of one core (the goal: under 1); idle_cycles: the cycles it ran then;
  idle_cpu_pct_without_pending: the same before the pending jobs are submitted (heartbeats, timers);
- cycle_median_ms, cycle_max_ms: --cycles cycles forced one at a time by a submission of one more job that
  cannot start, each timed by the controller itself (its garrison_scheduling_cycle_seconds histogram:
  snapshot, plan and apply, read before and after each cycle; the goal: under 50 ms); cycle_cpu_median_ms: their CPU time
  (garrison_scheduling_cycle_cpu_seconds), which a machine loaded by others does not stretch;
- gqueue_all_ms: `gqueue` listing every job, as a user runs it (a fresh process, output to /dev/null),
  the median of 3; gqueue_one_ms, gjob_one_ms: `gqueue -j ID` and `gjob ID` of one pending task among them
  (the goal: within 25 ms whatever the queue's size), the median of 21;
- rss_mb_before_restart, rss_mb_after_restart: the controller's resident memory, settled, before a restart
  and after it (the restarted one loads every job from the store); rss_kb_per_pending_job_*: the same, less
  the controller's memory before the pending jobs were submitted (rss_mb_without_pending), per pending job
  (the goal: at most 2 KB);
- restart_serving_s: from starting the controller again (SIGTERM to the old one, then the same command)
  until it answers Hello; restart_listing_s: until it has also answered gqueue's listing of every job
  (ListJobs with each array's pending tasks folded into one row, as squeue and gqueue show them);
  restart_listing_expanded_s: until it has then answered every job one row each (gqueue -r's listing).
  Polled every 10 ms on a channel that retries its connection as often (gRPC's default reconnect backoff,
  1 s and growing, measured itself: a controller up after 0.9 s was seen after ~1.4-2.6 s).
  restart_serving_cpu_s, restart_listing_cpu_s, restart_listing_expanded_cpu_s: the restarted controller's
  CPU time (user + system, all its threads) when each of those answers came, which a machine loaded by
  others does not stretch as it stretches the wall-clock figures; restart_listening_cpu_s: its CPU when it
  started to serve, as it logs it (imports, loading the jobs: what no request could be answered before). With --restarts N, N restarts one after
  the other: each one's figures (restart_1_serving_s, ...), and the medians under the names above.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.polling import WaitTimeout, wait_until  # noqa: E402
from helpers.ports import free_port  # noqa: E402

BIN = Path(sys.executable).parent
ARRAY_CHUNK = 10_000  # tasks per array: each submission well within the client's 30 s deadline
SETTLE_WINDOW_S = 2.0
SETTLED_CPU_PCT = 5.0


def controller_pid(state_dir: Path) -> int:
    return int((state_dir / "controller.pid").read_text().strip())


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def cpu_pct_over(process: psutil.Process, seconds: float) -> float:
    before, started = cpu_seconds(process), time.monotonic()
    time.sleep(seconds)  # the measurement window itself, not a wait for anything
    return (cpu_seconds(process) - before) / (time.monotonic() - started) * 100


def settle(process: psutil.Process, timeout_s: float = 120.0) -> float:
    """Wait until the controller has worked off what it was given (a window of SETTLE_WINDOW_S below
    SETTLED_CPU_PCT of a core); the last window's figure. A controller that never settles (one that plans
    over and over, as before issue 23) is measured as it is, after saying so."""
    last: list[float] = []

    def quiet() -> bool:
        last.append(cpu_pct_over(process, SETTLE_WINDOW_S))
        return last[-1] < SETTLED_CPU_PCT

    try:
        wait_until(quiet, timeout_s, what="the controller to settle", interval_s=0.0, max_interval_s=0.0)
    except WaitTimeout:
        print(f"not_settled_cpu_pct: {last[-1]:.1f}")
    return last[-1]


def cycle_metrics(metrics_url: str) -> tuple[float, float, float]:
    """(count, sum of wall seconds, sum of CPU seconds) of the controller's scheduling cycle histograms."""
    text = urllib.request.urlopen(metrics_url, timeout=60).read().decode()

    def value(name: str) -> float:
        found = re.search(rf"^{name} (\S+)$", text, re.M)
        return float(found.group(1)) if found else 0.0

    return (value("garrison_scheduling_cycle_seconds_count"), value("garrison_scheduling_cycle_seconds_sum"),
            value("garrison_scheduling_cycle_cpu_seconds_sum"))


def answers(call: Callable[[], Any]) -> bool:
    try:
        call()
    except Exception:  # not serving yet: refused, unavailable, deadline
        return False
    return True


class TimedRestart:
    def __init__(self, process: subprocess.Popen[bytes], figures: dict[str, float]) -> None:
        self.process, self.figures = process, figures


# Poll every 10 ms, and let the channel retry its connection as often: the figures are the controller's, not
# gRPC's reconnect backoff's (1 s after a refused connection, then 1.6 times longer each time).
FAST_POLL = {"interval_s": 0.01, "max_interval_s": 0.01}
FAST_RECONNECT = [("grpc.initial_reconnect_backoff_ms", 10), ("grpc.min_reconnect_backoff_ms", 10),
                  ("grpc.max_reconnect_backoff_ms", 10)]


def time_restart(old: psutil.Process, command: list[str], state_dir: Path, address: str,
                 env: dict[str, str]) -> TimedRestart:
    """Stop the controller, start it again with ``command``, and time it until it serves, lists every job
    folded, and every job one row each."""
    import grpc

    from garrison.cli.client import Client
    from garrison.protos.v1 import garrison_pb2 as pb
    from garrison.protos.v1 import garrison_pb2_grpc as pb_grpc

    old.send_signal(signal.SIGTERM)
    old.wait(timeout=120)
    logged = (state_dir / "controller.log").stat().st_size
    with open(state_dir / "controller.log", "ab") as log:
        began = time.monotonic()
        restarted = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                     start_new_session=True, env=env)
    (state_dir / "controller.pid").write_text(f"{restarted.pid}\n")
    process = psutil.Process(restarted.pid)
    figures = {}

    def answered(name: str) -> None:
        figures[name] = time.monotonic() - began
        figures[f"{name}_cpu"] = cpu_seconds(process)

    with grpc.insecure_channel(address, options=FAST_RECONNECT) as channel:
        stub = pb_grpc.ControllerStub(channel)
        wait_until(lambda: answers(lambda: stub.Hello(pb.HelloRequest(), timeout=1.0)), 300,
                   what="the restarted controller to answer Hello", **FAST_POLL)
    answered("serving")
    with Client(address) as client:
        wait_until(lambda: answers(lambda: client.call("ListJobs", pb.ListJobsRequest(fold_pending_arrays=True))),
                   300, what="the restarted controller to list every job", **FAST_POLL)
        answered("listing")
        wait_until(lambda: answers(lambda: client.call("ListJobs", pb.ListJobsRequest())), 300,
                   what="the restarted controller to list every job, one row each", **FAST_POLL)
        answered("listing_expanded")
    # The controller's own figure, logged as it starts serving: its CPU before the first request (imports,
    # loading the jobs); what the others have beyond it is what the first requests waited for.
    with open(state_dir / "controller.log", "rb") as written:
        written.seek(logged)
        found = re.search(rb"controller listening: .*\(database \w+; ([0-9.]+) s of CPU since start\)",
                          written.read())
    if found:
        figures["listening_cpu"] = float(found.group(1))
    return TimedRestart(restarted, figures)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, default=50_000)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--idle-s", type=float, default=60.0, help="how long the idle CPU is measured")
    parser.add_argument("--cycles", type=int, default=7, help="cycles forced and timed one at a time")
    parser.add_argument("--restarts", type=int, default=1, help="restarts timed one after the other (medians)")
    parser.add_argument("--waiting", choices=("resources", "held", "dependency"), default="resources",
                        help="why the pending jobs wait: every GPU taken (the default), held (gsub -H), or a "
                             "dependency on a running job (-d afterok)")
    parser.add_argument("--heartbeat-interval", type=float, default=5.0,
                        help="the agents' heartbeat interval, s (default: the controller's default; garrison up's is 1)")
    args = parser.parse_args()

    state_dir = Path(tempfile.mkdtemp(prefix="gscale-", dir="/tmp"))
    env = dict(os.environ, XDG_CACHE_HOME=str(state_dir / "cache"), PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    metrics_port = free_port()
    # One user submitting arrays back to back is what the per-user request rate limit exists to slow down.
    (state_dir / "extra.toml").write_text(f'request_rate_per_s = 0\nmetrics_address = "127.0.0.1:{metrics_port}"\n'
                                          f"heartbeat_interval_s = {args.heartbeat_interval}\n")
    print(f"heartbeat_interval_s: {args.heartbeat_interval}")
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    up = subprocess.run([str(BIN / "garrison"), "up", "--state-dir", str(state_dir), "--agents", str(args.agents),
                         "--fake-topology", "dgx-a100", "--extra-config", str(state_dir / "extra.toml")],
                        env=env, capture_output=True, text=True)
    if up.returncode != 0:
        print(up.stderr, file=sys.stderr)
        return 1
    address = up.stdout.strip().split("=", 1)[1]
    env["GARRISON_CONTROLLER"] = address
    os.environ.update(XDG_CACHE_HOME=env["XDG_CACHE_HOME"], GARRISON_CONTROLLER=address)
    restarted: subprocess.Popen[bytes] | None = None
    try:
        from garrison.cli.client import Client
        from garrison.protos.v1 import garrison_pb2 as pb

        out_dir = state_dir / "out"
        out_dir.mkdir()
        os.chmod(out_dir, 0o777)

        def spec(gpus: int) -> Any:
            return pb.JobSpec(name="scale", script="#!/bin/sh\nsleep 86400\n", gpus=gpus, workdir=str(out_dir),
                              output="/dev/null", time_limit_s=86400, env={"PATH": os.environ["PATH"]})

        controller = psutil.Process(controller_pid(state_dir))
        print(f"cluster: {args.agents} agents x 8 GPUs, controller {address}, SQLite, {args.pending} pending")
        print(f"waiting: {args.waiting}")
        with Client(address) as client:
            filler = [client.call("SubmitJob", pb.SubmitJobRequest(spec=spec(8))).job_id for _ in range(args.agents)]
            running = pb.ListJobsRequest(states=["RUNNING"], job_ids=[str(j) for j in filler])
            wait_until(lambda: len(client.call("ListJobs", running).jobs) == len(filler), 120,
                       what="the cluster to fill")
            settle(controller)
            empty_rss = controller.memory_info().rss  # the cluster's own jobs only: what each pending one adds
            print(f"rss_mb_without_pending: {empty_rss / 2**20:.0f}")
            # The floor: heartbeats, lease renewals, timers, with nothing to plan.
            print(f"idle_cpu_pct_without_pending: {cpu_pct_over(controller, args.idle_s):.2f}")
            started = time.monotonic()
            left = args.pending
            waiting = spec(1)
            if args.waiting == "dependency":
                waiting.dependency = f"afterok:{filler[0]}"
            while left > 0:
                count = min(ARRAY_CHUNK, left)
                client.call("SubmitJob", pb.SubmitJobRequest(spec=waiting, array_indices=list(range(count)),
                                                             hold=args.waiting == "held"))
                left -= count
            print(f"submit_s: {time.monotonic() - started:.1f}")
            settle(controller)

            cycles_before = cycle_metrics(metrics_url)[0]
            print(f"idle_cpu_pct: {cpu_pct_over(controller, args.idle_s):.2f}")
            print(f"idle_cycles: {cycle_metrics(metrics_url)[0] - cycles_before:.0f}")

            durations: list[float] = []
            cpu: list[float] = []
            for _ in range(args.cycles):
                count, total, total_cpu = cycle_metrics(metrics_url)
                client.call("SubmitJob", pb.SubmitJobRequest(spec=spec(1)))
                # Polled once a second: a scrape samples every job on the controller's event loop, and one
                # that overlapped the cycle would take the GIL from it and inflate the figure.
                after = wait_until(lambda c=count: (m := cycle_metrics(metrics_url))[0] > c and m, 120,  # type: ignore[misc]
                                   what="the forced cycle", interval_s=1.0, max_interval_s=1.0)
                durations.append((after[1] - total) * 1000 / (after[0] - count))
                cpu.append((after[2] - total_cpu) * 1000 / (after[0] - count))
            if durations:
                print(f"cycle_median_ms: {statistics.median(durations):.1f}")
                print(f"cycle_max_ms: {max(durations):.1f}")
                # A controller without the CPU histogram (before issue 23) has 0 here.
                print(f"cycle_cpu_median_ms: {statistics.median(cpu):.1f}")
            settle(controller)

            gqueue_ms = []
            for _ in range(3):
                began = time.perf_counter()
                subprocess.run([str(BIN / "gqueue")], env=env, check=True, stdout=subprocess.DEVNULL, timeout=300)
                gqueue_ms.append((time.perf_counter() - began) * 1000)
            print(f"gqueue_all_ms: {statistics.median(gqueue_ms):.0f}")
            folded = client.call("ListJobs", pb.ListJobsRequest(states=["PENDING"], fold_pending_arrays=True)).jobs
            # The second task of the last array folded, by its own job id (the first task's id names the
            # whole array, as in Slurm: gjob and gqueue -j would show all 10,000 of its tasks).
            one = str(next(row for row in reversed(folded) if row.folded_tasks).job_id + 1)
            for name, argv in (("gqueue_one_ms", ["gqueue", "-j", one]), ("gjob_one_ms", ["gjob", one])):
                times = []
                for _ in range(21):  # one slow call among 5 moved the median: 21, as cli_latency.py's runs
                    began = time.perf_counter()
                    subprocess.run([str(BIN / argv[0]), *argv[1:]], env=env, check=True, stdout=subprocess.DEVNULL,
                                   timeout=60)
                    times.append((time.perf_counter() - began) * 1000)
                print(f"{name}: {statistics.median(times):.1f}")
            settle(controller)
            before_rss = controller.memory_info().rss
            print(f"rss_mb_before_restart: {before_rss / 2**20:.0f}")
            print(f"rss_kb_per_pending_job_before_restart: {(before_rss - empty_rss) / args.pending / 1024:.2f}")

        # The restart: the same command `garrison up` runs, started the moment the old controller is gone.
        command = controller.cmdline()
        figures: dict[str, list[float]] = {}
        for number in range(1, args.restarts + 1):
            old = controller if restarted is None else psutil.Process(restarted.pid)
            if restarted is not None:
                settle(old)  # each restart from a controller that has worked off its own start
            timed = time_restart(old, command, state_dir, address, env)
            restarted = timed.process
            for name, value in timed.figures.items():
                figures.setdefault(name, []).append(value)
                if args.restarts > 1:
                    print(f"restart_{number}_{name}_s: {value:.2f}")
        for name, values in figures.items():
            print(f"restart_{name}_s: {statistics.median(values):.2f}")
        assert restarted is not None
        new = psutil.Process(restarted.pid)
        settle(new)
        after_rss = new.memory_info().rss
        print(f"rss_mb_after_restart: {after_rss / 2**20:.0f}")
        # Against the first controller's figure without them: a restarted one loads the same few others.
        print(f"rss_kb_per_pending_job_after_restart: {(after_rss - empty_rss) / args.pending / 1024:.2f}")
    finally:
        subprocess.run([str(BIN / "garrison"), "down", "--state-dir", str(state_dir)], env=env, capture_output=True)
        if restarted is not None and restarted.poll() is None:
            restarted.terminate()
            restarted.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
