"""The agent's job attempts on this node: launch through detached supervisors, signal, collect results.

Everything an attempt needs survives in its job directory (``STATE_DIR/jobs/<job>.<attempt>/``): the
launch description, the supervisor's pid and status, and an ``acked`` marker. So a restarted agent finds its
running attempts and its unacknowledged results again by scanning the directory, and the controller's
launch commands are idempotent (keyed by job id and attempt).
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import re
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from garrison.model.launch import LaunchDescription
from garrison.nodeagent.launch.env import AttemptPaths, RankPlan, checkpoint_dir_for, plan_ranks
from garrison.nodeagent.supervisor import client as supervisor
from garrison.nodeagent.supervisor import core as supervisor_core
from garrison.nodeagent.supervisor.spec import LaunchSpec, RankSpec

log = logging.getLogger("garrison.agent.jobs")

JOBS_DIR = "jobs"  # under the agent's state dir: one directory per attempt
USER_DIR = "user"
CHECKPOINT_MARK = "checkpoint-mark"
MAX_ERROR_FILE_BYTES = 64 << 10
PLACEHOLDER = "placeholder"  # a node of the allocation with no ranks (e.g. --launch single)
ACKED = "acked"
TERMINATE_REQUESTED = "terminate-requested"


@dataclass(frozen=True, slots=True)
class RankResult:
    rank: int
    exit_code: int
    error: str = ""


@dataclass(frozen=True, slots=True)
class AttemptResult:
    job_id: int
    attempt: int
    ranks: tuple[RankResult, ...]
    error: str = ""
    finished_at: float = 0.0


class RefusedLaunch(Exception):
    """This node will not start the attempt (e.g. a root job where root jobs are not allowed)."""


class JobManager:
    def __init__(
        self, state_dir: Path, notify_socket: str, allow_root_jobs: bool, forkserver: Path | None = None
    ) -> None:
        self.jobs_dir = state_dir / JOBS_DIR
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.jobs_dir, 0o711)
        self.notify_socket = notify_socket
        self.allow_root_jobs = allow_root_jobs
        self.forkserver = forkserver  # forks supervisors in ~8 ms instead of starting an interpreter (~25 ms)

    def job_dir(self, job_id: int, attempt: int) -> Path:
        return self.jobs_dir / f"{job_id}.{attempt}"

    @staticmethod
    def parse_dir_name(name: str) -> tuple[int, int] | None:
        head, _, tail = name.partition(".")
        if head.isdigit() and tail.isdigit():
            return int(head), int(tail)
        return None

    def attempts(self) -> list[tuple[int, int]]:
        found = []
        for entry in os.scandir(self.jobs_dir):
            key = self.parse_dir_name(entry.name)
            if key is not None and entry.is_dir():
                found.append(key)
        return sorted(found)

    # ---------------------------------------------------------------------------------------------

    def launch(self, launch: LaunchDescription) -> None:
        """Start the attempt's ranks on this node. Idempotent: a second call for the same attempt is a no-op."""
        job_dir = self.job_dir(launch.job_id, launch.attempt)
        if job_dir.exists():
            return
        if launch.uid == 0 and not self.allow_root_jobs:
            raise RefusedLaunch("root jobs are not allowed on this node")
        if launch.uid != os.getuid():
            _check_same_identity(launch.user, launch.uid)
        staging = job_dir.with_name(job_dir.name + ".new")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(mode=0o711)
        # The one place in the job dir the job's user may write: torch error files and the checkpoint mark.
        user_dir = staging / USER_DIR
        user_dir.mkdir(mode=0o700)
        self._give_to_user(user_dir, launch)
        if launch.node_rank == 0:
            _check_port_free(launch.master_port)
        argv: list[str] = list(launch.spec.command)
        if launch.spec.script is not None:
            script = staging / "script"
            script.write_text(launch.spec.script)
            os.chmod(script, 0o700)
            self._give_to_user(script, launch)
            argv = [str(job_dir / "script"), *launch.spec.command]
        paths = AttemptPaths(
            error_file_dir=str(job_dir / USER_DIR),
            checkpoint_dir=checkpoint_dir_for(launch.spec, launch.job_id),
            checkpoint_mark=str(job_dir / USER_DIR / CHECKPOINT_MARK),
        )
        # Unbound ranks may use every CPU the agent may (SLURM_CPUS_ON_NODE).
        ranks = plan_ranks(launch, paths, argv, cpus_on_node=len(os.sched_getaffinity(0)))
        if not ranks:
            (staging / PLACEHOLDER).touch()
            staging.rename(job_dir)
            return
        spec = supervisor_spec(
            launch,
            ranks,
            groups=_groups_of(launch.user, launch.gid) if launch.uid != os.getuid() else [],
            cpus=_usable_cpus(launch.allocation.nodes[launch.node_rank].cpus),
            notify_socket=self.notify_socket,
        )
        # Rename first so a crash never leaves a half-written job dir under the attempt's real name.
        staging.rename(job_dir)
        supervisor.spawn(job_dir, spec, forkserver=self.forkserver)

    @staticmethod
    def _give_to_user(path: Path, launch: LaunchDescription) -> None:
        if os.getuid() == 0 and launch.uid != 0:
            os.chown(path, launch.uid, launch.gid)

    def is_placeholder(self, job_id: int, attempt: int) -> bool:
        return (self.job_dir(job_id, attempt) / PLACEHOLDER).exists()

    def signal(self, job_id: int, attempt: int, action: str, signum: int = 0) -> bool:
        """Deliver a stop or a signal. Returns False when the attempt is unknown here."""
        job_dir = self.job_dir(job_id, attempt)
        if not job_dir.exists():
            return False
        if action in ("terminate", "kill"):
            (job_dir / TERMINATE_REQUESTED).touch()
        if self.is_placeholder(job_id, attempt):
            return True
        if action == "terminate":
            supervisor.terminate(job_dir)
        elif action == "kill":
            supervisor.kill_now(job_dir)
        elif signum:
            supervisor.send(job_dir, signum)
        return True

    def result(self, job_id: int, attempt: int) -> AttemptResult | None:
        """The attempt's result once every rank here has ended, else None."""
        job_dir = self.job_dir(job_id, attempt)
        if self.is_placeholder(job_id, attempt):
            if (job_dir / TERMINATE_REQUESTED).exists():
                return AttemptResult(job_id, attempt, ())
            return None
        status = supervisor.read_status(job_dir)
        if status is None or status.state != "finished":
            if supervisor.is_alive(job_dir):
                return None
            # Not alive now: it may have written its final status and exited between our two looks (a
            # trivial job ends within milliseconds), so look again before calling it dead.
            status = supervisor.read_status(job_dir)
        if status is not None and status.state == "finished":
            ranks = tuple(
                RankResult(
                    r.rank,
                    r.exit_code if r.exit_code is not None else 1,
                    r.error or (_error_file_message(job_dir / USER_DIR, r.rank) if r.exit_code else ""),
                )
                for r in status.ranks
            )
            return AttemptResult(job_id, attempt, ranks, finished_at=status.finished_at or 0.0)
        if status is None and not (job_dir / "launch.json").exists():
            return AttemptResult(job_id, attempt, (), error="launch did not complete")
        # The supervisor died without a final status: kill what it left and report the attempt as failed,
        # with the last thing it wrote (its log goes with the job dir once the result is acknowledged).
        supervisor.kill_orphans(job_dir)
        last = _last_log_line(job_dir / supervisor_core.LOG_FILE)
        return AttemptResult(job_id, attempt, (), error=f"supervisor died: {last}" if last else "supervisor died")

    def checkpoint_time(self, job_id: int, attempt: int) -> float | None:
        """When the job last touched its checkpoint mark (GARRISON_CHECKPOINT_MARK), if ever."""
        try:
            return (self.job_dir(job_id, attempt) / USER_DIR / CHECKPOINT_MARK).stat().st_mtime
        except OSError:
            return None

    def acknowledge(self, job_id: int, attempt: int) -> None:
        job_dir = self.job_dir(job_id, attempt)
        if job_dir.exists():
            shutil.rmtree(job_dir, ignore_errors=True)

    def scan(self) -> tuple[list[tuple[int, int]], list[AttemptResult]]:
        """(running attempts, finished results not yet acknowledged): what a reconnect reports."""
        running: list[tuple[int, int]] = []
        finished: list[AttemptResult] = []
        for job_id, attempt in self.attempts():
            result = self.result(job_id, attempt)
            if result is None:
                running.append((job_id, attempt))
            else:
                finished.append(result)
        return running, finished


def supervisor_spec(
    launch: LaunchDescription,
    ranks: list[RankPlan],
    *,
    groups: list[int],
    cpus: list[int] | None,
    notify_socket: str | None,
) -> LaunchSpec:
    """The supervisor's launch.json for this node's ranks of the attempt: the one place a launch description
    becomes the supervisor's file format. groups and cpus are this host's answers (its user database, its
    CPUs), looked up by the caller."""
    truncated = output_truncation(launch, ranks)
    return LaunchSpec(
        job_id=launch.job_id,
        attempt=launch.attempt,
        uid=launch.uid,
        gid=launch.gid,
        groups=groups,
        user=launch.user,
        ranks=[
            RankSpec(rank=r.rank, argv=list(r.argv), env=dict(r.env), cwd=r.cwd, stdout=r.stdout, stderr=r.stderr,
                     truncate=truncated.get(r.rank, []))
            for r in ranks
        ],
        kill_wait_s=launch.kill_wait_s,
        notify_socket=notify_socket,
        umask=launch.spec.umask,
        cpus=cpus,
        batch_signal=launch.batch_signal,
    )


def truncates_output(launch: LaunchDescription) -> bool:
    """--open-mode: truncate always, append always, or (not given, as in Slurm for a requeued job) truncate
    on the job's first attempt only, so a requeued or restarted job's log keeps its earlier attempts."""
    if launch.spec.open_mode is not None:
        return launch.spec.open_mode == "truncate"
    return launch.attempt == 0


_PER_NODE_SPECIFIER = re.compile(r"%[0-9]*[tnN]")


def output_truncation(launch: LaunchDescription, ranks: list[RankPlan]) -> dict[int, list[str]]:
    """Which output paths each of this node's ranks empties before writing: each path once, by the first
    rank opening it, and a path every node shares (no %t or %n in its pattern) only on node rank 0, so no
    rank empties what another has written."""
    if not truncates_output(launch):
        return {}
    spec = launch.spec
    patterns = [spec.output or ""] + ([spec.error] if spec.error else [])  # no --output: slurm-%j.out, shared
    shared_across_nodes = not all(_PER_NODE_SPECIFIER.search(pattern) for pattern in patterns)
    if launch.node_rank != 0 and shared_across_nodes:
        return {}
    seen: set[str] = set()
    found: dict[int, list[str]] = {}
    for plan in sorted(ranks, key=lambda r: r.rank):
        for path in dict.fromkeys((plan.stdout, plan.stderr)):
            if path not in seen:
                seen.add(path)
                found.setdefault(plan.rank, []).append(path)
    return found


def _usable_cpus(chosen: tuple[int, ...]) -> list[int] | None:
    """The scheduler's CPU choice for this node, limited to CPUs this host really has. None when it chose
    none, or when none of them exist here (a fake machine description larger than the test host)."""
    if not chosen:
        return None
    present = sorted(set(chosen) & os.sched_getaffinity(0))
    return present or None


def _check_port_free(port: int) -> None:
    """Rank 0 hosts the rendezvous store on MASTER_PORT: fail the launch (and so get a new attempt with
    another port) rather than start a gang that cannot rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As torch's TCPStore binds: connections of an earlier job lingering in TIME_WAIT do not count.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            raise RuntimeError(f"MASTER_PORT {port} is in use on this node") from None


def _error_file_message(user_dir: Path, rank: int) -> str:
    """The message torch's @record wrote to TORCHELASTIC_ERROR_FILE, if the rank left one."""
    path = user_dir / f"error-{rank}.json"
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read(MAX_ERROR_FILE_BYTES))
    except (OSError, ValueError):
        return ""
    message = data.get("message", data) if isinstance(data, dict) else data
    if isinstance(message, dict):
        message = message.get("message", message)
    return str(message).strip().splitlines()[-1][:500] if str(message).strip() else ""


def _last_log_line(path: Path, limit: int = 300) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 4096))
            lines = [line.strip() for line in handle.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1][:limit] if lines else ""


def _check_same_identity(user: str, uid: int) -> None:
    """The controller took the uid from the submitting process and the name from the submit host's user
    database. If this node maps the name to another uid (or does not know it), the job would run as a
    different person here, or without that person's groups: refuse, and say why."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise RefusedLaunch(f"user {user} (uid {uid}) does not exist on this node") from None
    if entry.pw_uid != uid:
        raise RefusedLaunch(
            f"user {user} is uid {entry.pw_uid} on this node but submitted as uid {uid}: "
            "user ids must be the same on every node"
        )


def _groups_of(user: str, gid: int) -> list[int]:
    try:
        return sorted(set(os.getgrouplist(user, gid)))
    except (KeyError, OSError):
        return [gid]

