#!/usr/bin/env python3
"""A randomized soak: a mixed stream of jobs on a local cluster while daemons are killed, frozen and restarted.

    python tests/benchmarks/chaos.py --seed 1 [--duration-s 300] [--jobs 150] [--agents 3] [--postgres]

A script, not a test: prints `key: value`. `garrison up` with --agents agents (fake DGX A100s, 8 GPUs each;
SQLite, or a private PostgreSQL with --postgres), then for --duration-s seconds it keeps submitting (up to
--jobs jobs, arrays counting each task) a seeded mix of

  single   one GPU                                  gang     two nodes x one GPU (--launch node)
  array    three one-GPU tasks                      steps    one GPU, then `srun` steps inside the job
  cancel   one GPU, gcancel/scancel at a random moment (pending or running)
  requeue  one GPU or a gang, `scontrol requeue` / `gcontrol requeue` once it runs

while, one episode at a time with random pauses between them, it injects faults at random moments:

  ctl_kill          the controller SIGKILLed, down 0.5-5 s or 16-30 s (past the 15 s node lease), `garrison up`
  agent_kill        an agent SIGKILLed, down 0.5-35 s (past the heartbeat timeout, past the fence delay), `garrison up`
  agent_stop_short  an agent SIGSTOPped 1-8 s (within the lease), SIGCONT
  agent_stop_long   an agent SIGSTOPped 17-35 s (beyond the lease), SIGCONT
  forkserver_kill   an agent's supervisor fork server SIGKILLed
  supervisor_kill   the supervisor of a running attempt SIGKILLed
  ctl_down_agent_restart  the controller and an agent SIGKILLed, the agent restarted while the controller is
                    still down, then the controller
  ctl_down_agent_stop     the controller SIGKILLed and an agent SIGSTOPped; the controller comes back first, then
                    the agent is woken
  ctl_stop          the controller SIGSTOPped 1-8 s or 17-30 s (a paused VM: past the lease, the nodes stop their
                    jobs and the woken controller requeues them), SIGCONT
  db_outage         (--postgres only) PostgreSQL restarted, or stopped for 2-30 s

Every rank of every job journals itself (start, a tick every 0.5 s, stopped on SIGTERM, end: one line each, with
the job, attempt, node and bash's $EPOCHREALTIME, O_APPEND writes shorter than PIPE_BUF) and starts a marker
process (`chaosmark-TOKEN-JOB-ATTEMPT-NODE`, setsid'd out of the rank's session and process group, so only the
job's cgroup and the supervisor's cleanup can end it); a sampler lists the markers alive every second. Once
--duration-s has passed, faults and submissions stop, every daemon is brought up, and the queue is drained.
Then, counted from the jobs' side:

  jobs              jobs submitted (array tasks each)
  ended             jobs in a terminal state
  ran_twice         jobs whose user code ran to its end (on every node of the attempt) in two attempts, except
                    where the controller could not know of the first end: an attempt requeued on request (the
                    request may land after the end), one NODE_FAIL because its node was declared dead (silent
                    past the fence delay), one whose supervisor the soak killed; those are counted in
                    reran_after_fault_excused, and the overlap checks still apply to them
  overlapping       jobs with two attempts whose journal lines interleave (one attempt's last line after the
                    next one's first), or a marker of one attempt alive after the next attempt started
  ran_after_recorded_end  attempts whose journal has a line later than the end the controller recorded for them
  lost              jobs never cancelled that never ran to their end, or never reached a
                    terminal state, or COMPLETED without a complete run
  leaked_processes  markers alive more than 3 s after the controller recorded their attempt's end, or alive at
                    all once the queue has drained
  wrong_final_state jobs whose final state is not what their kind allows (COMPLETED; CANCELLED for cancelled
                    jobs, or COMPLETED if they ran to their end first)

and the fault log. Every ran_twice, overlapping, ran_after_recorded_end, lost and leaked count must be 0 (the
script exits 1 otherwise, and lists each case under `problems:`). With --keep the cluster's
state directory is left for inspection (its daemons stopped).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from e2e.conftest import BIN, Cluster, start_cluster  # noqa: E402
from helpers.polling import WaitTimeout, wait_until  # noqa: E402

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"}
TICK_S = 0.5
LEAK_GRACE_S = 3.0  # the sampler's 1 s period, and the controller's end time taken a moment before the report

RANK_SCRIPT = r"""#!/bin/bash
# One rank of a chaos job: journals itself, starts a marker process, ticks, runs srun steps, ends.
# usage: rank.sh TICKS STEPS   |   rank.sh step (a job step's task)
J=__JOURNAL__
ID=$SLURM_JOB_ID; A=${CHAOS_ATTEMPT:-${SLURM_RESTART_COUNT:-0}}; N=${GARRISON_NODENAME:-${SLURMD_NODENAME:-unknown}}
mark() { echo "$1 $ID $A $N $EPOCHREALTIME" >> "$J"; }
if [ "$1" = step ]; then
  trap 'mark stepstopped; exit 143' TERM
  mark step; sleep 1 & wait $!; mark step; exit 0
fi
trap 'mark stopped; exit 143' TERM
mark start
(setsid /bin/bash -c "exec -a chaosmark-__TOKEN__-$ID-$A-$N sleep 7200" </dev/null >/dev/null 2>&1 &)
i=0; while [ $i -lt "$1" ]; do mark tick; sleep __TICK__ & wait $!; i=$((i+1)); done
export CHAOS_ATTEMPT=$A
s=0; while [ $s -lt "$2" ]; do srun -n 1 /bin/bash "$0" step || mark stepfail; s=$((s+1)); done
mark end
"""


# ---------------------------------------------------------------------------------------------------- cluster


class Chaos:
    def __init__(self, c: Cluster, seed: int, agents: int) -> None:
        self.c = c
        self.agents = agents
        self.token = f"{seed}x{os.getpid()}"
        self.journal = c.work / "journal"
        self.journal.touch()
        os.chmod(self.journal, 0o666)
        self.rank = c.work / "rank.sh"
        self.rank.write_text(RANK_SCRIPT.replace("__JOURNAL__", str(self.journal)).replace("__TOKEN__", self.token)
                             .replace("__TICK__", str(TICK_S)))
        self.rank.chmod(0o755)
        self.slurm = Path(c.run("garrison", "slurm-path").stdout.strip())
        self.started = time.time()
        self.fault_log: list[str] = []
        self.fault_counts: Counter[str] = Counter()
        self.lock = threading.Lock()
        # (job, attempt, node) -> [first seen, last seen, pid]
        self.markers: dict[tuple[int, int, str], list[float]] = {}
        self.stop_sampling = threading.Event()
        self.up_lock = threading.Lock()  # one `garrison up` at a time
        self.supervisors_killed: set[tuple[int, int]] = set()  # (job, attempt)

    # -- daemons --------------------------------------------------------------------------------------------

    def pid(self, daemon: str) -> int | None:
        try:
            return int((self.c.state_dir / f"{daemon}.pid").read_text())
        except (OSError, ValueError):
            return None

    def log(self, what: str) -> None:
        line = f"t={time.time() - self.started:7.1f} {what}"
        with self.lock:
            self.fault_log.append(line)
        print(f"# {line}", file=sys.stderr, flush=True)

    def kill(self, daemon: str, sig: int) -> int | None:
        pid = self.pid(daemon)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pid

    def up(self) -> None:
        """`garrison up`: restarts whatever is dead and returns once every agent has registered."""
        with self.up_lock:
            for tries in range(5):
                proc = self.c.run("garrison", "up", "--state-dir", str(self.c.state_dir), check=False)
                if proc.returncode == 0:
                    return
                self.log(f"garrison up failed (try {tries + 1}): {proc.stderr.strip()[-300:]}")
            raise RuntimeError("garrison up kept failing")

    def start_controller_alone(self) -> None:
        """The controller started without waiting for the agents (one of them may be frozen)."""
        from garrison.cli.up import _start

        config = self.c.state_dir / "garrison.toml"
        _start(["-m", "garrison.controller.main", "--config", str(config)], self.c.state_dir / "controller.log",
               self.c.state_dir / "controller.pid")

    def start_agent_alone(self, n: int) -> None:
        """Agent n started as `garrison up` starts it, with the controller down (up would start that too)."""
        from garrison.cli.up import _start

        config = self.c.state_dir / f"agent-{n}.toml"
        _start(["-m", "garrison.nodeagent.main", "--config", str(config)], self.c.state_dir / f"agent-{n}.log",
               self.c.state_dir / f"agent-{n}.pid")

    def forkserver_pid(self, n: int) -> int | None:
        agent = self.pid(f"agent-{n}")
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if b"supervisor.forkserver" in cmdline and ppid == agent:
                return int(entry.name)
        return None

    def running_supervisors(self) -> list[tuple[int, str, tuple[int, int]]]:
        found = []
        for pid_file in self.c.state_dir.glob("agent-*/jobs/*/supervisor.pid"):
            job_dir = pid_file.parent
            try:
                if json.loads((job_dir / "status.json").read_bytes()).get("state") == "finished":
                    continue
            except (OSError, ValueError):
                pass  # none yet (starting), or gone meanwhile
            try:
                pid = int(pid_file.read_text())
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except (OSError, ValueError):
                continue
            job, _, attempt = job_dir.name.partition(".")
            if b"garrison" in cmdline and job.isdigit() and attempt.isdigit():
                found.append((pid, f"{job_dir.parent.parent.name}/{job_dir.name}", (int(job), int(attempt))))
        return found

    # -- the marker sampler ---------------------------------------------------------------------------------

    def scan_markers(self) -> dict[tuple[int, int, str], int]:
        prefix = f"chaosmark-{self.token}-".encode()
        alive = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if cmdline.startswith(prefix):
                job, attempt, node = cmdline.split(b"\0")[0][len(prefix):].decode().split("-", 2)
                alive[(int(job), int(attempt), node)] = int(entry.name)
        return alive

    def sample(self) -> None:
        while not self.stop_sampling.is_set():
            now = time.time()
            for key, pid in self.scan_markers().items():
                with self.lock:
                    seen = self.markers.setdefault(key, [now, now, pid])
                    seen[1] = now
            self.stop_sampling.wait(1.0)

    # -- queries --------------------------------------------------------------------------------------------

    def get_jobs(self, job_ids: list[int]) -> dict[int, Any]:
        """Each job with its attempts (ListJobs leaves them out)."""
        from garrison.cli.client import Client
        from garrison.protos.v1 import garrison_pb2 as pb

        with Client(self.c.env["GARRISON_CONTROLLER"]) as client:
            return {i: client.call("GetJob", pb.GetJobRequest(job_id=str(i))) for i in job_ids}

    def list_jobs(self) -> dict[int, Any]:
        from garrison.cli.client import Client
        from garrison.protos.v1 import garrison_pb2 as pb

        with Client(self.c.env["GARRISON_CONTROLLER"]) as client:
            return {j.job_id: j for j in client.call("ListJobs", pb.ListJobsRequest()).jobs}


# ---------------------------------------------------------------------------------------------------- workload


@dataclass
class Submitted:
    kind: str
    job_ids: list[int]
    cancel_at: float | None = None  # when to cancel (cancel jobs)
    requeue: bool = False
    requeued: list[int] = field(default_factory=list)  # jobs a requeue request was accepted for
    cancelled: bool = False


class Workload:
    KINDS = (("single", 30), ("gang", 15), ("array", 12), ("steps", 15), ("cancel", 14), ("requeue", 14))

    def __init__(self, chaos: Chaos, rng: random.Random, max_jobs: int) -> None:
        self.chaos = chaos
        self.rng = rng
        self.max_jobs = max_jobs
        self.submitted: list[Submitted] = []
        self.kind_of: dict[int, str] = {}
        self.requeue_tool = 0
        self.failed_submissions = 0
        self.actions_failed = 0

    def total(self) -> int:
        return sum(len(s.job_ids) for s in self.submitted)

    def command(self, ticks: int, steps: int = 0) -> list[str]:
        return ["--wrap", f"exec /bin/bash {self.chaos.rank} {ticks} {steps}"]

    def submit_one(self) -> None:
        kinds, weights = zip(*self.KINDS, strict=True)
        kind = self.rng.choices(kinds, weights)[0]
        rng = self.rng
        args = ["-J", f"chaos-{kind}", "-t", "20:00", "-o", "/dev/null"]
        item = Submitted(kind, [])
        if kind == "single":
            args += ["-G", "1", *self.command(rng.randint(4, 30))]
        elif kind == "gang":
            args += ["-N", "2", "--gpus-per-node", str(rng.choice((1, 1, 2))), "--launch", "node",
                     *self.command(rng.randint(4, 30))]
        elif kind == "array":
            args += ["--array", "0-2", "-G", "1", *self.command(rng.randint(4, 20))]
        elif kind == "steps":
            args += ["-G", "1", *self.command(rng.randint(2, 10), rng.randint(1, 2))]
        elif kind == "cancel":
            args += ["-G", "1", *self.command(rng.randint(10, 60))]
            item.cancel_at = time.time() + rng.uniform(0.5, 20)
        else:
            item.requeue = True
            if rng.random() < 0.3:
                args += ["-N", "2", "--gpus-per-node", "1", "--launch", "node"]
            else:
                args += ["-G", "1"]
            args += self.command(rng.randint(16, 40))
        proc = self.chaos.c.run("gsub", "--parsable", *args, check=False)
        if proc.returncode != 0:
            self.failed_submissions += 1
            return
        first = int(proc.stdout.strip().split(";")[0])
        item.job_ids = [first + i for i in range(3)] if kind == "array" else [first]
        for job_id in item.job_ids:
            self.kind_of[job_id] = kind
        self.submitted.append(item)

    def act(self, runs: dict[int, dict[int, Run]]) -> None:
        """Due cancels, and requeues of jobs running their first attempt."""
        now = time.time()
        for item in self.submitted:
            job_id = item.job_ids[0]
            if item.cancel_at is not None and not item.cancelled and now >= item.cancel_at:
                tool = "gcancel" if self.rng.random() < 0.5 else str(self.chaos.slurm / "scancel")
                proc = self.chaos.c.run(tool, str(job_id), check=False)
                if proc.returncode == 0:
                    item.cancelled = True
                else:
                    self.actions_failed += 1
                    item.cancel_at = now + 2  # the controller may be down: again in a moment
            if item.requeue and not item.requeued:
                job_runs = runs.get(job_id, {})
                if 0 in job_runs and not job_runs[0].ended_anywhere:
                    self.requeue_tool += 1
                    if self.requeue_tool % 2:
                        proc = self.chaos.c.run(str(self.chaos.slurm / "scontrol"), "requeue", str(job_id),
                                                check=False)
                    else:
                        proc = self.chaos.c.run("gcontrol", "requeue", str(job_id), check=False)
                    if proc.returncode == 0:
                        item.requeued.append(job_id)
                    else:
                        self.actions_failed += 1


# ---------------------------------------------------------------------------------------------------- journal


@dataclass
class Run:
    """One attempt of one job, as its ranks wrote it."""

    first: float = float("inf")
    last: float = 0.0
    started: set[str] = field(default_factory=set)
    ended: set[str] = field(default_factory=set)
    stopped: set[str] = field(default_factory=set)
    step_failures: int = 0

    @property
    def ended_anywhere(self) -> bool:
        return bool(self.ended)

    @property
    def complete(self) -> bool:
        return bool(self.started) and self.started <= self.ended


def read_journal(path: Path) -> dict[int, dict[int, Run]]:
    runs: dict[int, dict[int, Run]] = defaultdict(dict)
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) != 5:
            continue
        kind, job, attempt, node, when = parts
        run = runs[int(job)].setdefault(int(attempt), Run())
        t = float(when)
        run.first, run.last = min(run.first, t), max(run.last, t)
        if kind == "start":
            run.started.add(node)
        elif kind == "end":
            run.ended.add(node)
        elif kind == "stopped":
            run.stopped.add(node)
        elif kind == "stepfail":
            run.step_failures += 1
    return dict(runs)


# ---------------------------------------------------------------------------------------------------- faults


FAULTS = ("ctl_kill", "agent_kill", "agent_stop_short", "agent_stop_long", "forkserver_kill", "supervisor_kill",
          "ctl_down_agent_restart", "ctl_down_agent_stop", "ctl_stop", "db_outage")
FAULT_WEIGHTS = (16, 16, 14, 10, 10, 14, 10, 10, 8, 10)


class Injector:
    def __init__(self, chaos: Chaos, rng: random.Random, faults: list[str], pg: Any = None) -> None:
        self.chaos = chaos
        self.pg = pg  # the private PostgreSQL (--postgres), whose outages are a fault of their own
        self.rng = rng
        self.faults = faults
        self.stop = threading.Event()
        self.error: str | None = None

    def pause(self, low: float, high: float) -> None:
        """The pause between two faults (cut short once the soak's duration is over)."""
        self.stop.wait(self.rng.uniform(low, high))

    @staticmethod
    def hold(seconds: float) -> None:
        """A fault's own timing (how long a daemon stays down or frozen): not a wait for an event, and never
        cut short, so that the fault log says what was done."""
        time.sleep(seconds)

    def run(self) -> None:
        try:
            self.pause(5, 15)
            weights = [FAULT_WEIGHTS[FAULTS.index(f)] for f in self.faults]
            while not self.stop.is_set():
                fault = self.rng.choices(self.faults, weights)[0]
                self.inject(fault)
                self.pause(3, 25)
        except Exception:  # noqa: BLE001 - the report says what broke the injector
            self.error = traceback.format_exc()
            self.chaos.log(f"injector failed: {self.error}")

    def inject(self, fault: str) -> None:
        c = self.chaos
        n = self.rng.randint(1, c.agents)
        agent = f"agent-{n}"
        if fault == "ctl_kill":
            down = self.rng.uniform(0.5, 5) if self.rng.random() < 0.6 else self.rng.uniform(16, 30)
            c.kill("controller", signal.SIGKILL)
            c.log(f"ctl_kill: controller SIGKILL, down {down:.1f}s")
            self.hold(down)
            c.up()
        elif fault == "agent_kill":
            down = self.rng.choice((self.rng.uniform(0.5, 5), self.rng.uniform(10, 20), self.rng.uniform(24, 35)))
            c.kill(agent, signal.SIGKILL)
            c.log(f"agent_kill: {agent} SIGKILL, down {down:.1f}s")
            self.hold(down)
            c.up()
        elif fault in ("agent_stop_short", "agent_stop_long"):
            frozen = self.rng.uniform(1, 8) if fault == "agent_stop_short" else self.rng.uniform(17, 35)
            c.kill(agent, signal.SIGSTOP)
            c.log(f"{fault}: {agent} SIGSTOP for {frozen:.1f}s")
            try:
                self.hold(frozen)
            finally:
                c.kill(agent, signal.SIGCONT)
        elif fault == "forkserver_kill":
            pid = c.forkserver_pid(n)
            if pid is None:
                c.log(f"forkserver_kill: {agent} has no fork server now")
                return
            os.kill(pid, signal.SIGKILL)
            c.log(f"forkserver_kill: {agent}'s fork server {pid} SIGKILL")
        elif fault == "supervisor_kill":
            supervisors = c.running_supervisors()
            if not supervisors:
                c.log("supervisor_kill: no running supervisor now")
                return
            pid, where, attempt = self.rng.choice(supervisors)
            c.supervisors_killed.add(attempt)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            c.log(f"supervisor_kill: supervisor {pid} of {where} SIGKILL")
        elif fault == "ctl_down_agent_restart":
            c.kill("controller", signal.SIGKILL)
            c.kill(agent, signal.SIGKILL)
            before = self.rng.uniform(0.5, 8)
            after = self.rng.uniform(0.5, 10)
            c.log(f"ctl_down_agent_restart: controller and {agent} SIGKILL; {agent} back after {before:.1f}s, "
                  f"controller {after:.1f}s later")
            self.hold(before)
            c.start_agent_alone(n)
            self.hold(after)
            c.up()
        elif fault == "ctl_down_agent_stop":
            c.kill("controller", signal.SIGKILL)
            c.kill(agent, signal.SIGSTOP)
            down = self.rng.uniform(0.5, 10)
            frozen = self.rng.uniform(0.5, 25)
            c.log(f"ctl_down_agent_stop: controller SIGKILL, {agent} SIGSTOP; controller back after {down:.1f}s, "
                  f"{agent} woken {frozen:.1f}s later")
            try:
                self.hold(down)
                c.start_controller_alone()
                self.hold(frozen)
            finally:
                c.kill(agent, signal.SIGCONT)
            c.up()
        elif fault == "ctl_stop":
            frozen = self.rng.uniform(1, 8) if self.rng.random() < 0.6 else self.rng.uniform(17, 30)
            c.kill("controller", signal.SIGSTOP)
            c.log(f"ctl_stop: controller SIGSTOP for {frozen:.1f}s")
            try:
                self.hold(frozen)
            finally:
                c.kill("controller", signal.SIGCONT)
        elif fault == "db_outage":
            if self.pg is None:
                return
            if self.rng.random() < 0.4:
                c.log("db_outage: PostgreSQL restarted")
                self.pg.restart()
            else:
                down = self.rng.uniform(2, 30)
                c.log(f"db_outage: PostgreSQL stopped for {down:.1f}s")
                self.pg.stop()
                try:
                    self.hold(down)
                finally:
                    self.pg.start()
        else:
            raise ValueError(fault)
        c.fault_counts[fault] += 1


# ---------------------------------------------------------------------------------------------------- verdict


def verdict(chaos: Chaos, work: Workload, jobs: dict[int, Any], stuck: set[int]) -> dict[str, Any]:
    runs = read_journal(chaos.journal)
    markers = dict(chaos.markers)
    final_alive = chaos.scan_markers()
    requeued = {j for s in work.submitted for j in s.requeued}
    cancelled = {j for s in work.submitted if s.cancelled for j in s.job_ids}
    problems: list[str] = []
    notes: list[str] = []
    counts: Counter[str] = Counter()
    known = set(work.kind_of)
    # Jobs the harness does not know of (a gsub whose answer was lost in a controller kill) still count.
    for job_id, job in jobs.items():
        if job_id not in known and job.name.startswith("chaos-"):
            work.kind_of[job_id] = job.name.removeprefix("chaos-")
            counts["jobs_unknown_to_harness"] += 1
    for job_id, kind in sorted(work.kind_of.items()):
        job = jobs.get(job_id)
        state = job.state if job is not None else "MISSING"
        job_runs = runs.get(job_id, {})
        attempts = {a.attempt: a for a in job.attempts} if job is not None else {}
        counts["jobs"] += 1
        counts["ended"] += state in TERMINAL
        counts["attempts_run"] += len(job_runs)
        counts["requeued_by_controller"] += sum(1 for a in attempts.values() if a.state == "NODE_FAIL")
        counts["step_failures"] += sum(r.step_failures for r in job_runs.values())
        complete = [a for a, r in job_runs.items() if r.complete]
        # A run to its end that the controller could not have known of is not counted twice: an attempt
        # requeued on request (the request may land after the end), one whose node was declared dead (silent
        # past the fence delay: its result could not reach the controller; the overlap check still holds it
        # to having been stopped), one whose supervisor the soak killed (it died before recording the end).
        excused = {a for a in complete if attempts.get(a) is not None and (
            (attempts[a].state == "REQUEUED" and job_id in requeued)
            or (attempts[a].state == "NODE_FAIL" and "not responding" in attempts[a].reason)
            or (attempts[a].state == "NODE_FAIL" and "supervisor died" in attempts[a].reason
                and (job_id, a) in chaos.supervisors_killed))}
        if excused and len(complete) > 1:
            counts["reran_after_fault_excused"] += 1
            notes.append(f"job {job_id} ({kind}) ran to its end in attempts {complete}, excused {sorted(excused)}: "
                         f"{describe(job)}")
        if len(complete) - len(excused) > 1:
            counts["ran_twice"] += 1
            problems.append(f"job {job_id} ({kind}) ran to its end in attempts {complete}: {describe(job)}")
        for a, run in job_runs.items():
            record = attempts.get(a)
            # Tick lines come every 0.5 s; the controller records an end once every node has reported it.
            if record is not None and record.end_time and run.last > record.end_time + 0.5:
                counts["ran_after_recorded_end"] += 1
                problems.append(f"job {job_id} ({kind}): attempt {a} wrote at {run.last:.2f}, after its recorded "
                                f"end ({record.state}) at {record.end_time:.2f}: {describe(job)}")
        ordered = sorted(job_runs.items())
        for (a, ra), (b, rb) in zip(ordered, ordered[1:], strict=False):
            if ra.last >= rb.first:
                counts["overlapping"] += 1
                problems.append(f"job {job_id} ({kind}): attempt {a} wrote until {ra.last:.2f}, attempt {b} "
                                f"started {rb.first:.2f}: {describe(job)}")
        for (marked_job, attempt, node), (_first, last, pid) in markers.items():
            if marked_job != job_id:
                continue
            later = job_runs.get(attempt + 1)
            if later is not None and last > later.first + LEAK_GRACE_S:
                counts["overlapping_markers"] += 1
                problems.append(f"job {job_id}: attempt {attempt}'s marker on {node} (pid {int(pid)}) alive at "
                                f"{last:.1f}, after attempt {attempt + 1} started at {later.first:.1f}")
            record = attempts.get(attempt)
            if record is not None and record.end_time and last > record.end_time + LEAK_GRACE_S:
                counts["leaked_processes"] += 1
                problems.append(f"job {job_id}: attempt {attempt}'s marker on {node} (pid {int(pid)}) seen "
                                f"{last - record.end_time:.1f}s after the attempt ended ({record.state}) "
                                f"at {record.end_time:.1f}")
        was_cancelled = kind == "cancel" and job_id in cancelled
        if kind == "cancel" and not was_cancelled:
            counts["cancel_never_sent"] += 1
        if job_id in stuck or state not in TERMINAL:
            counts["lost"] += 1
            problems.append(f"job {job_id} ({kind}) never ended: {state} {describe(job)}")
        elif not complete and (not was_cancelled or state == "COMPLETED"):
            # Never ran to its end, though nobody cancelled it (or the controller says it completed).
            counts["lost"] += 1
            problems.append(f"job {job_id} ({kind}) {state} without a complete run: {describe(job)}")
        allowed = {"COMPLETED"} if not was_cancelled else ({"CANCELLED", "COMPLETED"} if complete else {"CANCELLED"})
        if state not in allowed:
            counts["wrong_final_state"] += 1
            problems.append(f"job {job_id} ({kind}) ended {state}, expected {sorted(allowed)}: {describe(job)}")
        counts[f"kind_{kind}"] += 1
        counts["requeued_on_request"] += job_id in requeued
        counts["cancelled_on_request"] += was_cancelled
    for (marked_job, attempt, node), pid in final_alive.items():
        counts["leaked_at_drain"] += 1
        problems.append(f"marker of job {marked_job} attempt {attempt} on {node} (pid {pid}) alive after the drain "
                        f"({work.kind_of.get(marked_job, '?')}, {describe(jobs.get(marked_job))})")
    return {"counts": counts, "problems": problems, "notes": notes}


def describe(job: Any) -> str:
    if job is None:
        return "(unknown to the controller)"
    attempts = "; ".join(f"#{a.attempt} {a.state} {a.start_time:.1f}-{a.end_time:.1f} "
                         f"{','.join(n.node for n in a.allocation)} {a.reason}" for a in job.attempts)
    return f"[{job.state} restarts={job.restart_count} {attempts}]"


# ---------------------------------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--duration-s", type=float, default=300.0, help="how long jobs and faults keep coming")
    parser.add_argument("--jobs", type=int, default=150, help="at most this many jobs (array tasks each)")
    parser.add_argument("--agents", type=int, default=3, choices=(2, 3))
    parser.add_argument("--postgres", action="store_true", help="a private PostgreSQL instead of SQLite")
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of {', '.join(FAULTS)}")
    parser.add_argument("--drain-timeout-s", type=float, default=300.0)
    parser.add_argument("--keep", action="store_true", help="keep the cluster's state directory")
    args = parser.parse_args()
    faults = [f for f in args.faults.split(",") if f]
    if not faults or not set(faults) <= set(FAULTS):
        parser.error(f"--faults: unknown {', '.join(sorted(set(faults) - set(FAULTS)))}")
    if args.duration_s <= 0 or args.jobs <= 0:
        parser.error("--duration-s and --jobs must be positive")

    pg = None
    extra = Path(f"/tmp/chaos-extra-{os.getpid()}.toml")
    # Finished jobs stay in the controller's memory (gqueue, ListJobs) for the whole soak.
    extra.write_text("finished_job_retention_s = 7200.0\n")
    cluster_args = ["--agents", str(args.agents), "--extra-config", str(extra)]
    if args.postgres:
        from helpers.private_postgres import PrivatePostgres

        pg = PrivatePostgres()
        pg.start()
        cluster_args += ["--database", pg.url]
    c = start_cluster(["dgx-a100"] * args.agents, cluster_args)
    os.environ["GARRISON_CONTROLLER"] = c.env["GARRISON_CONTROLLER"]
    chaos = Chaos(c, args.seed, args.agents)
    work = Workload(chaos, random.Random(args.seed), args.jobs)
    if pg is None:
        faults = [f for f in faults if f != "db_outage"] or parser.error("--faults: db_outage needs --postgres")
    injector = Injector(chaos, random.Random(args.seed * 7919 + 1), faults, pg)
    sampler = threading.Thread(target=chaos.sample, daemon=True)
    sampler.start()
    faulting = threading.Thread(target=injector.run, daemon=True)
    faulting.start()
    started = time.time()
    code = 0
    try:
        next_submit = next_act = started
        # Submissions spread over the first 85% of the run, so the last jobs still meet faults.
        rate = args.jobs / (args.duration_s * 0.85)
        while time.time() - started < args.duration_s:
            now = time.time()
            if now >= next_submit and work.total() < args.jobs:
                work.submit_one()
                next_submit = now + work.rng.expovariate(rate / 1.4)
            if now >= next_act:
                work.act(read_journal(chaos.journal))
                next_act = now + 1.0
            time.sleep(0.2)  # the submission loop's pace, not a wait for an event
        chaos.log("duration over: no more faults or submissions")
        injector.stop.set()
        faulting.join(timeout=120)
        chaos.up()
        # Pending cancels still go out (a cancel job must be cancelled to be judged as one).
        for item in work.submitted:
            if item.cancel_at is not None and not item.cancelled:
                item.cancel_at = 0
        work.act(read_journal(chaos.journal))
        ids = set(work.kind_of)
        stuck: set[int] = set()
        drain_started = time.time()
        try:
            wait_until(lambda: all(j.state in TERMINAL for i, j in chaos.list_jobs().items() if i in ids),
                       args.drain_timeout_s, what="the queue to drain", interval_s=1.0, max_interval_s=2.0)
        except WaitTimeout:
            stuck = {i for i, j in chaos.list_jobs().items() if i in ids and j.state not in TERMINAL}
        drained_s = time.time() - drain_started
        # Every marker of an ended job must be gone: give the last ends' cleanups the kill wait and a margin.
        with contextlib.suppress(WaitTimeout):
            wait_until(lambda: not chaos.scan_markers(), 10, what="the markers to go", interval_s=0.5)
        chaos.stop_sampling.set()
        sampler.join(timeout=5)
        listed = chaos.list_jobs()
        jobs = chaos.get_jobs(sorted(i for i, j in listed.items() if i in ids or j.name.startswith("chaos-")))
        result = verdict(chaos, work, jobs, stuck)
        counts: Counter[str] = result["counts"]
        log_text = "".join(p.read_text(errors="replace") for p in c.state_dir.glob("*.log"))
        for key in ("seed", "duration_s", "agents", "database"):
            value = {"seed": args.seed, "duration_s": args.duration_s, "agents": args.agents,
                     "database": "postgresql" if args.postgres else "sqlite"}[key]
            print(f"{key}: {value}")
        for key in ("jobs", "ended", "ran_twice", "overlapping", "overlapping_markers", "ran_after_recorded_end",
                    "lost", "leaked_processes", "leaked_at_drain", "wrong_final_state", "reran_after_fault_excused"):
            print(f"{key}: {counts[key]}")
        for key in sorted(k for k in counts if k.startswith("kind_")):
            print(f"{key}: {counts[key]}")
        for key in ("attempts_run", "requeued_by_controller", "requeued_on_request", "cancelled_on_request",
                    "cancel_never_sent", "step_failures", "jobs_unknown_to_harness"):
            print(f"{key}: {counts[key]}")
        print(f"markers_seen: {len(chaos.markers)}")
        print(f"submissions_refused: {work.failed_submissions}")
        print(f"actions_refused: {work.actions_failed}")
        print(f"tracebacks_in_logs: {log_text.count('Traceback')}")
        print(f"drain_s: {drained_s:.1f}")
        print(f"wall_s: {time.time() - started:.1f}")
        print(f"faults_injected: {sum(chaos.fault_counts.values())}")
        for fault in FAULTS:
            print(f"faults_{fault}: {chaos.fault_counts[fault]}")
        if injector.error:
            print(f"injector_error: {injector.error.strip().splitlines()[-1]}")
        print("fault_log:")
        for line in chaos.fault_log:
            print(f"  {line}")
        if result["notes"]:
            print("excused:")
            for line in result["notes"][:100]:
                print(f"  {line}")
        if result["problems"]:
            print("problems:")
            for line in result["problems"][:100]:
                print(f"  {line}")
        bad = sum(counts[k] for k in ("ran_twice", "overlapping", "overlapping_markers", "ran_after_recorded_end",
                                      "lost", "leaked_processes", "leaked_at_drain"))
        code = 1 if bad else 0
        print(f"state_dir: {c.state_dir}")
    finally:
        injector.stop.set()
        chaos.stop_sampling.set()
        # Whatever is frozen must wake for `garrison down` to stop it.
        for n in range(1, args.agents + 1):
            chaos.kill(f"agent-{n}", signal.SIGCONT)
        subprocess.run([str(BIN / "garrison"), "down", "--state-dir", str(c.state_dir)], env=c.env,
                       capture_output=True, timeout=120)
        if not args.keep:
            shutil.rmtree(c.state_dir, ignore_errors=True)
        if pg is not None:
            pg.destroy()
        extra.unlink(missing_ok=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
