#!/usr/bin/env python3
"""Preemption delays on a local cluster. A script, not a test: prints `key: value` lines.

    python tests/benchmarks/preemption.py [--rounds 5]

One agent (8 fake GPUs), preemption on, QoS `urgent` may preempt `low` (grace 5 s). Each round: a low job
takes all 8 GPUs and traps SIGUSR1 (it exits at once, as a job that has just saved its checkpoint would);
an urgent job asking for the 8 GPUs is submitted and runs for 1 s. Every timestamp is taken by the jobs
themselves (date +%s.%N) or by this script right after the CLI returned, on this machine's clock:

- submit_to_signal: gsub of the urgent job starts -> the victim's SIGUSR1 handler runs;
- signal_to_preemptor_start: the victim's handler -> the urgent job's first line (victim gone, GPUs reused);
- gpus_free_to_victim_restart: the urgent job's last line -> the victim's requeued attempt starts
  (Slurm holds a requeued job for about 120 s; the goal here is under 1 s).
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
from helpers.polling import wait_until  # noqa: E402

BIN = Path(sys.executable).parent
CONFIG = Path(__file__).resolve().parents[1] / "data" / "preemption.toml"


def run(env: dict[str, str], *args: str) -> str:
    return subprocess.run([str(BIN / args[0]), *args[1:]], env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def stamps(path: Path, word: str) -> list[float]:
    if not path.exists():
        return []
    return [float(line.split()[-1]) for line in path.read_text().splitlines() if line.startswith(word)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    state_dir = Path(tempfile.mkdtemp(prefix="gpreempt-", dir="/tmp"))
    env = dict(os.environ, XDG_CACHE_HOME=str(state_dir / "cache"), PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    line = run(env, "garrison", "up", "--state-dir", str(state_dir), "--agents", "1", "--fake-topology", "dgx-a100",
               "--extra-config", str(CONFIG))
    env["GARRISON_CONTROLLER"] = line.split("=", 1)[1]
    work = state_dir / "work"
    work.mkdir()
    figures: dict[str, list[float]] = {"submit_to_signal_ms": [], "signal_to_preemptor_start_ms": [],
                                       "gpus_free_to_victim_restart_ms": []}
    try:
        for round_number in range(args.rounds):
            log = work / f"victim-{round_number}.log"
            urgent_log = work / f"urgent-{round_number}.log"
            victim = run(env, "gsub", "--parsable", "-q", "low", "-N", "1", "--gpus-per-node", "8", "--launch", "node",
                         "-o", "/dev/null", "-D", str(work), "--wrap",
                         f"trap 'echo usr1 $(date +%s.%N) >> {log}; exit 0' USR1; "
                         f"echo start $GARRISON_ATTEMPT $(date +%s.%N) >> {log}; "
                         f"if [ $GARRISON_ATTEMPT -gt 0 ]; then exit 0; fi; while :; do sleep 0.02; done")
            # Polled every 10 ms, as before; the figures come from the jobs' own timestamps either way.
            wait_until(lambda: stamps(log, "start"), 60, what="the victim to start", max_interval_s=0.01)  # noqa: B023
            submitted = time.time()  # before gsub: the signal may arrive before gsub has even exited
            urgent = run(env, "gsub", "--parsable", "-q", "urgent", "-N", "1", "--gpus-per-node", "8", "--launch",
                         "node", "-o", "/dev/null", "-D", str(work), "--wrap",
                         f"echo start $(date +%s.%N) >> {urgent_log}; sleep 1; echo end $(date +%s.%N) >> {urgent_log}")
            restarted = wait_until(
                lambda: stamps(log, "start")[1:],  # noqa: B023
                60, what="the victim's second attempt", max_interval_s=0.01,
            )
            signalled = stamps(log, "usr1")[0]
            urgent_start = stamps(urgent_log, "start")[0]
            urgent_end = stamps(urgent_log, "end")[0]
            figures["submit_to_signal_ms"].append((signalled - submitted) * 1000)
            figures["signal_to_preemptor_start_ms"].append((urgent_start - signalled) * 1000)
            figures["gpus_free_to_victim_restart_ms"].append((restarted[0] - urgent_end) * 1000)
            for job in (urgent, victim):
                run(env, "gjob", "--wait", job, "--timeout", "60")
        print(f"rounds: {args.rounds}")
        for key, values in figures.items():
            print(f"{key}_median: {statistics.median(values):.1f}")
            print(f"{key}_max: {max(values):.1f}")
    finally:
        subprocess.run([str(BIN / "garrison"), "down", "--state-dir", str(state_dir)], env=env, capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
