#!/usr/bin/env python3
"""End-to-end throughput and latency of a local Garrison cluster. A script, not a test: prints `key: value`.

    python tests/benchmarks/e2e_throughput.py [--jobs 1000] [--agents 4] [--cli-calls 20] [--modes cli,library,array]

Starts `garrison up` with 4 agents x 8 fake GPUs (32 GPUs, like ../shared/slurm-anchor's 4 x 8), then runs
N trivial one-GPU jobs three ways, each compared with its like on Slurm by compare_slurm.sh:
  cli:     a shell loop of `gsub --parsable ... --wrap` (Slurm: bench.sh seq, a loop of sbatch);
  library: one process submitting them one by one through the client library (Slurm has no such path: its
           figure is compared with the sbatch loop, Slurm's default way in);
  array:   one `--array=1-N` submission (Slurm: bench.sh array);
and for each reports jobs/s from the first submit until the last job has ended, and submit-to-start latency
(the client's clock when the submission returned -> the first line of the job, read from its output: both on
this machine's clock). Finally it times `gsub`, `gjob` and `gqueue` as a user runs them (fresh processes,
tests/benchmarks/cli_latency.py): from this environment and installed from a wheel, as users get them
(`*_installed_*`; the wheel is built from this checkout into a throwaway venv that takes its dependencies
from this one).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# A script, so its own directory is on sys.path, not tests/: put tests/ there for the shared helpers package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.polling import WaitTimeout, wait_until  # noqa: E402

BIN = Path(sys.executable).parent
JOB_COMMAND = "date +%s.%N"
POLL_INTERVAL_S = 0.2  # bench.sh polls squeue every 0.2 s


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def wait_all_done(client, job_ids: list[int], timeout: float) -> float:  # type: ignore[no-untyped-def]
    """When the last of the jobs ended, as ../shared/slurm-anchor's bench.sh sees it for Slurm: polling every
    0.2 s for the jobs still queued or running (what squeue lists), then checking once that every job
    completed."""
    from garrison.protos.v1 import garrison_pb2 as pb

    ids = [str(i) for i in job_ids]
    count = len(ids)
    active = pb.ListJobsRequest(states=["PENDING", "CONFIGURING", "RUNNING", "COMPLETING"], job_ids=ids)
    try:
        # A fixed interval, not wait_until's backoff: the figure is "when squeue-style polling sees them end".
        wait_until(lambda: not client.call("ListJobs", active).jobs, timeout, what=f"{count} jobs to end",
                   interval_s=POLL_INTERVAL_S, max_interval_s=POLL_INTERVAL_S)
    except WaitTimeout:
        raise SystemExit(f"timed out: {len(client.call('ListJobs', active).jobs)}/{count} jobs not ended") from None
    finished = time.time()
    states = {str(j.job_id): j.state for j in client.call("ListJobs", pb.ListJobsRequest(job_ids=ids)).jobs}
    bad = [job_id for job_id in ids if states.get(job_id) != "COMPLETED"]
    if bad:
        raise SystemExit(f"{len(bad)} jobs did not complete, e.g. {bad[0]}: {states.get(bad[0], 'missing')}")
    return finished


def latencies(out_dir: Path, submitted_at: dict[int, float]) -> list[float]:
    result = []
    for job_id, at in submitted_at.items():
        text = (out_dir / f"{job_id}.out").read_text().strip()
        result.append(float(text) - at)
    return result


def run_batch(client, out_dir: Path, count: int, mode: str, env: dict[str, str]) -> dict[str, float]:  # type: ignore[no-untyped-def]
    from garrison.protos.v1 import garrison_pb2 as pb

    spec = pb.JobSpec(name="bench", script=f"#!/bin/sh\n{JOB_COMMAND}\n", gpus=1, workdir=str(out_dir),
                      output=str(out_dir / "%j.out"), time_limit_s=600, env={"PATH": os.environ["PATH"]})
    submitted_at: dict[int, float] = {}
    started = time.time()
    if mode == "array":
        response = client.call("SubmitJob", pb.SubmitJobRequest(spec=spec, array_indices=list(range(1, count + 1))))
        now = time.time()
        submitted_at = {response.job_id + i: now for i in range(count)}
    elif mode == "library":
        for _ in range(count):
            response = client.call("SubmitJob", pb.SubmitJobRequest(spec=spec))
            submitted_at[response.job_id] = time.time()
    else:  # cli: bench.sh's seq loop, with gsub for sbatch
        loop = (f'for _ in $(seq {count}); do id=$(gsub --parsable -J bench -G 1 -t 10 -o "$OUT/%j.out" '
                f'--wrap "{JOB_COMMAND}"); echo "$id $(date +%s.%N)"; done')
        submits = subprocess.run(["bash", "-c", loop], env={**env, "OUT": str(out_dir)}, cwd=out_dir, check=True,
                                 capture_output=True, text=True).stdout
        for line in submits.splitlines():
            job_id, at = line.split()
            submitted_at[int(job_id)] = float(at)
    submit_done = time.time()
    finished = wait_all_done(client, sorted(submitted_at), timeout=600)
    lat = latencies(out_dir, submitted_at)
    return {
        "submit_rate_jobs_per_s": count / max(submit_done - started, 1e-9),
        "wall_s": finished - started,
        "throughput_jobs_per_s": count / (finished - started),
        "submit_to_start_median_ms": statistics.median(lat) * 1000,
        "submit_to_start_p95_ms": percentile(lat, 95) * 1000,
    }


def idle_latency(client, out_dir: Path, count: int) -> list[float]:  # type: ignore[no-untyped-def]
    """One job at a time on an idle cluster (Slurm's `bench.sh 20 lat`)."""
    from garrison.protos.v1 import garrison_pb2 as pb

    spec = pb.JobSpec(name="lat", script=f"#!/bin/sh\n{JOB_COMMAND}\n", gpus=1, workdir=str(out_dir),
                      output=str(out_dir / "%j.out"), time_limit_s=600, env={"PATH": os.environ["PATH"]})
    result = []
    for _ in range(count):
        response = client.call("SubmitJob", pb.SubmitJobRequest(spec=spec))
        at = time.time()
        wait_all_done(client, [response.job_id], timeout=60)
        result += latencies(out_dir, {response.job_id: at})
    return result


# Which of the cluster's processes is which, by a word of its command line (cli/up.py, the agent's fork
# server). Supervisors and the jobs' own processes are counted through the fork server: it reaps the
# supervisors, and each supervisor (a subreaper) reaps the job's processes, so their CPU time is the fork
# server's children's time. A supervisor kept for the next attempt (forkserver.py) has not been reaped: it
# is counted from its own figures, with the ranks it reaped. It has the fork server's command line (it is
# a fork of it); the fork server is the one whose parent is an agent.
PROCESS_KINDS = (("garrison.controller.main", "controller"), ("garrison.nodeagent.main", "agents"),
                 ("supervisor.forkserver", "forkservers"))


def cpu_by_kind(state_dir: Path) -> dict[str, float]:
    """CPU seconds so far of the cluster's processes under ``state_dir``, by kind (PROCESS_KINDS); the fork
    servers' reaped children and the live supervisors as ``supervisors_and_jobs``."""
    import psutil

    totals = {kind: 0.0 for _, kind in PROCESS_KINDS} | {"supervisors_and_jobs": 0.0}
    found: list[tuple[str, psutil.Process]] = []
    for proc in psutil.process_iter(["cmdline", "ppid"]):
        cmdline = " ".join(proc.info["cmdline"] or ())
        kind = next((kind for word, kind in PROCESS_KINDS if word in cmdline), None)
        if kind is not None and str(state_dir) in cmdline:
            found.append((kind, proc))
    agents = {proc.pid for kind, proc in found if kind == "agents"}
    for kind, proc in found:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        if kind == "forkservers" and proc.info["ppid"] not in agents:  # a supervisor kept for reuse
            totals["supervisors_and_jobs"] += times.user + times.system + times.children_user + times.children_system
            continue
        totals[kind] += times.user + times.system
        if kind == "forkservers":
            totals["supervisors_and_jobs"] += times.children_user + times.children_system
    return totals


def byte_compile() -> None:
    """Write the package's bytecode, as installing it does (pip compiles a wheel's modules): with
    PYTHONDONTWRITEBYTECODE set, an editable checkout would otherwise recompile every module the CLI
    imports on every call (~15 ms), which is not what a user of an installed Garrison pays."""
    import compileall
    import importlib

    for package in ("garrison", "garrison.cli", "garrison.controller", "garrison.protos"):
        # Each package's own directory: garrison's search path also holds the checkout's root, with .venv in it.
        location = Path(importlib.import_module(package).__file__ or "").parent
        compileall.compile_dir(location, quiet=1)


def installed_cli(root: Path) -> Path | None:
    """This checkout built as a wheel and installed into a fresh venv under ``root`` (dependencies from the
    running environment): the bin directory with its console scripts, or None if that cannot be done here."""
    import sysconfig

    repo = Path(__file__).resolve().parents[2]
    venv = root / "wheel-venv"
    purelib = sysconfig.get_paths()["purelib"]
    steps = [
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"), str(repo)],
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
    ]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True, timeout=300)
        venv_purelib = subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True).stdout.strip()
        Path(venv_purelib, "garrison-deps.pth").write_text(purelib + "\n")
        (wheel,) = (root / "dist").glob("garrison-*.whl")
        subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                        "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True, timeout=300)
    except (subprocess.SubprocessError, OSError, ValueError) as exc:
        print(f"installed_cli: unavailable ({exc})")
        return None
    return venv / "bin"


def time_cli(env: dict[str, str], name: str, args: list[str], calls: int, cwd: Path) -> None:
    """cli_latency.py's figures for ``args``, printed as they come."""
    timer = Path(__file__).resolve().parent / "cli_latency.py"
    out = subprocess.run([sys.executable, str(timer), name, str(calls), "--", *args], env=env, cwd=cwd, check=True,
                         capture_output=True, text=True).stdout
    print(out, end="")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--cli-calls", type=int, default=20, help="0: do not time the CLI")
    parser.add_argument("--idle-jobs", type=int, default=20, help="0: skip the idle-latency part")
    parser.add_argument("--modes", default="cli,library,array", help="which of cli, library, array to run")
    parser.add_argument("--cpu", action="store_true",
                        help="also print each batch's CPU time per job by process kind (psutil)")
    args = parser.parse_args()

    state_dir = Path(tempfile.mkdtemp(prefix="gbench-", dir="/tmp"))
    env = dict(os.environ, XDG_CACHE_HOME=str(state_dir / "cache"), PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    # One user submitting 1,000 jobs one by one is exactly what the per-user request rate limit (50/s by
    # default) exists to slow down; lift it, as Slurm's benchmark runs without rl_enable.
    (state_dir / "extra.toml").write_text("request_rate_per_s = 0\n")
    up = subprocess.run([str(BIN / "garrison"), "up", "--state-dir", str(state_dir), "--agents", str(args.agents),
                         "--fake-topology", "dgx-a100", "--extra-config", str(state_dir / "extra.toml")],
                        env=env, capture_output=True, text=True)
    if up.returncode != 0:
        print(up.stderr, file=sys.stderr)
        return 1
    address = up.stdout.strip().split("=", 1)[1]
    env["GARRISON_CONTROLLER"] = address
    os.environ.update(XDG_CACHE_HOME=env["XDG_CACHE_HOME"], GARRISON_CONTROLLER=address)
    try:
        from garrison.cli.client import Client

        print(f"cluster: {args.agents} agents x 8 GPUs, controller {address}, SQLite")
        with Client(address) as client:
            for name in args.modes.split(","):
                out_dir = state_dir / f"out-{name}"
                out_dir.mkdir()
                os.chmod(out_dir, 0o777)
                cpu_before = cpu_by_kind(state_dir) if args.cpu else {}
                figures = run_batch(client, out_dir, args.jobs, name, env)
                if args.cpu:
                    cpu_after = cpu_by_kind(state_dir)
                    for kind, seconds in cpu_after.items():
                        figures[f"cpu_ms_per_job_{kind}"] = (seconds - cpu_before[kind]) * 1000 / args.jobs
                    figures["cpu_ms_per_job_total"] = sum(
                        (cpu_after[kind] - cpu_before[kind]) * 1000 / args.jobs for kind in cpu_after)
                for key, value in figures.items():
                    print(f"{name}_{args.jobs}_{key}: {value:.1f}")
            out_dir = state_dir / "out-idle"
            out_dir.mkdir()
            os.chmod(out_dir, 0o777)
            if args.idle_jobs > 0:
                lat = idle_latency(client, out_dir, args.idle_jobs)
                print(f"idle_submit_to_start_median_ms: {statistics.median(lat) * 1000:.1f}")
                print(f"idle_submit_to_start_p95_ms: {percentile(lat, 95) * 1000:.1f}")
        if args.cli_calls > 0:
            cwd = state_dir / "out-idle"
            byte_compile()
            with Client(address) as client:  # a job for gjob to show: the last one, ended
                from garrison.protos.v1 import garrison_pb2 as pb

                last = max(job.job_id for job in client.call("ListJobs", pb.ListJobsRequest(states=["COMPLETED"])).jobs)
            installed = installed_cli(state_dir)
            for suffix, bin_dir in (("", BIN), ("_installed", installed)):
                if bin_dir is None:
                    continue
                time_cli(env, f"gsub{suffix}", [str(bin_dir / "gsub"), "-G", "1", "-o", "/dev/null", "--wrap", "true"],
                         args.cli_calls, cwd)
                time_cli(env, f"gjob{suffix}", [str(bin_dir / "gjob"), str(last)], args.cli_calls, cwd)
                time_cli(env, f"gqueue{suffix}", [str(bin_dir / "gqueue")], args.cli_calls, cwd)
    finally:
        subprocess.run([str(BIN / "garrison"), "down", "--state-dir", str(state_dir)], env=env, capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
