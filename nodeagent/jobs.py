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
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from garrison.config.schema import DEFAULT_CONFIG_PATH
from garrison.model.launch import LaunchDescription
from garrison.nodeagent.containment.interface import DEVICES, AttemptLimits, Containment, ContainmentError
from garrison.nodeagent.containment.unconfined import Unconfined
from garrison.nodeagent.fsflags import mark_top_of_hierarchy
from garrison.nodeagent.jobfiles import owner_of_directory, read_job_file, remove_tree
from garrison.nodeagent.launch.env import (
    AttemptPaths,
    RankPlan,
    checkpoint_dir_for,
    plan_ranks,
    ranks_on_node,
)
from garrison.nodeagent.supervisor import cgroup_runtime
from garrison.nodeagent.supervisor import client as supervisor
from garrison.nodeagent.supervisor import core as supervisor_core
from garrison.nodeagent.supervisor.spec import LaunchSpec, RankSpec

log = logging.getLogger("garrison.agent.jobs")

JOBS_DIR = "jobs"  # under the agent's state dir: one directory per attempt
USER_DIR = "user"
TMP_DIR = "tmp"  # the attempt's scratch directory (SLURM_TMPDIR), the job user's, beside USER_DIR
CHECKPOINT_MARK = "checkpoint-mark"
MAX_ERROR_FILE_BYTES = 64 << 10
PLACEHOLDER = "placeholder"  # a node of the allocation with no ranks (e.g. --launch single)
ACKED = "acked"
TERMINATE_REQUESTED = supervisor_core.TERMINATE_REQUEST_FILE  # read by the supervisor before it starts ranks
LEASE_STOPPED = "lease-stopped"  # the agent stopped the attempt because the node's lease ran out


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
    lease_expired: bool = False  # the node's lease ran out and the supervisor stopped the ranks
    # From the attempt's cgroup (supervisor/cgroup_runtime.py usage()): max_rss_bytes, cpu_time_ns, ...;
    # None when the attempt ran unconfined.
    usage: dict[str, int] | None = None
    out_of_memory: bool = False  # the memory limit's OOM killer killed one of its processes
    supervisor_lost: bool = False  # the supervisor died without a final status (the node's failure)


class RefusedLaunch(Exception):
    """This node will not start the attempt (e.g. a root job where root jobs are not allowed)."""


# An acknowledged attempt's job directory while it is removed: never an attempt's name (parse_dir_name).
REMOVING_SUFFIX = ".removing"


class JobManager:
    def __init__(
        self,
        state_dir: Path,
        notify_socket: str,
        allow_root_jobs: bool,
        forkserver: Path | None = None,
        containment: Containment | None = None,
        pids_max: int = 10_000,
        gpu_minors: Mapping[int, int] | None = None,
        lease_file: Path | None = None,
        slurm_path: str | None = None,
        controller: str = "",
        job_devices: str = "gpus",
        scratch_dir: str = "",
    ) -> None:
        self.jobs_dir = state_dir / JOBS_DIR
        # Where attempts' scratch directories (SLURM_TMPDIR) live: the agent's scratch_dir setting (a local disk
        # of its own, so a job that fills it cannot fill the state directory and drain the node), or, unset,
        # each attempt's directory.
        self.scratch_root = Path(scratch_dir) if scratch_dir else None
        if self.scratch_root is not None:
            self.scratch_root.mkdir(parents=True, exist_ok=True)
            os.chmod(self.scratch_root, 0o711)
        self.slurm_path = slurm_path  # Slurm's command names, first on every job's PATH (garrison.slurmpath)
        self.controller = controller  # its address, for the commands in jobs that lack it (node_defaults)
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.jobs_dir, 0o711)
        mark_top_of_hierarchy(self.jobs_dir)  # attempts' directories spread over ext4's block groups (fsflags.py)
        self.notify_socket = notify_socket
        self.allow_root_jobs = allow_root_jobs
        self.forkserver = forkserver  # forks supervisors in ~8 ms instead of starting an interpreter (~25 ms)
        self.revive_forkserver: Callable[[], bool] | None = None  # starts a fork server that died again
        self.lease_file = lease_file  # the node lease every supervisor honours (nodeagent/lease.py); None: none
        self.containment: Containment = containment or Unconfined()
        self.pids_max = pids_max
        # Every GPU of the node: its index -> its /dev/nvidiaN minor (NVML's); absent: the index. Those a job
        # was not given are the device files it may not open (containment/devices.py).
        self.gpu_minors = dict(gpu_minors or {})
        self.job_devices = job_devices  # the agent's device policy: "gpus" or "allowlist" (AgentConfig)
        self._cgroups: dict[tuple[int, int], dict[str, str] | None] = {}  # running attempts' cgroups, as read
        # Until acknowledged: each attempt's GPUs (from its launch, so that its result needs no second parse of
        # launch.json) and, once asked, NVML's figures for them (a result is read again until acknowledged).
        self._gpus: dict[tuple[int, int], list[int]] = {}
        self._gpu_usages: dict[tuple[int, int], dict[str, int]] = {}

    def job_dir(self, job_id: int, attempt: int) -> Path:
        return self.jobs_dir / f"{job_id}.{attempt}"

    def scratch_dir(self, job_id: int, attempt: int) -> Path:
        """The attempt's scratch directory on this node (SLURM_TMPDIR)."""
        if self.scratch_root is not None:
            return self.scratch_root / f"{job_id}.{attempt}"
        return self.job_dir(job_id, attempt) / TMP_DIR

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
        scratch = staging / TMP_DIR
        if self.scratch_root is not None:
            scratch = self.scratch_dir(launch.job_id, launch.attempt)
            remove_tree(scratch)  # an agent that died before acknowledging this attempt's first launch left it
        scratch.mkdir(mode=0o700)
        self._give_to_user(scratch, launch)
        if launch.node_rank == 0 and _world_size(launch) > 1:
            # A one-rank job has nobody to rendezvous with: a taken port must not keep it from starting.
            _check_port_free(launch.master_port)
        argv: list[str] = list(launch.spec.command)
        if launch.spec.script is not None:
            script = staging / "script"
            # Created 0700 from the start: never readable by others, not even until a chmod.
            fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o700)
            with open(fd, "w", encoding="utf-8", errors="surrogateescape") as handle:
                handle.write(launch.spec.script)
            os.chmod(script, 0o700)  # the umask may have narrowed it; the user must be able to execute it
            self._give_to_user(script, launch)
            argv = [str(job_dir / "script"), *launch.spec.command]
        paths = AttemptPaths(
            error_file_dir=str(job_dir / USER_DIR),
            checkpoint_dir=checkpoint_dir_for(launch.spec, launch.job_id),
            checkpoint_mark=str(job_dir / USER_DIR / CHECKPOINT_MARK),
            tmp_dir=str(self.scratch_dir(launch.job_id, launch.attempt)),
        )
        # Unbound ranks may use every CPU the agent may (SLURM_CPUS_ON_NODE).
        ranks = plan_ranks(launch, paths, argv, cpus_on_node=len(os.sched_getaffinity(0)),
                           slurm_path=self.slurm_path, defaults=node_defaults(launch.user, self.controller),
                           devices_constrained=self.containment.capabilities.can(DEVICES))
        if not ranks:
            # No process runs here (yet): the attempt's cgroup is still made, with its limits, so that the job
            # steps started in it (gsrun) are contained as the attempt would be; acknowledge removes it. The
            # placeholder names the attempt's GPUs here, which its steps' tasks see (visible_gpus).
            self._create_cgroup(launch)
            gpus = list(launch.allocation.nodes[launch.node_rank].gpus)
            (staging / PLACEHOLDER).write_text(json.dumps({"gpus": gpus}))
            staging.rename(job_dir)
            return
        cgroup = self._create_cgroup(launch)
        spec = supervisor_spec(
            launch,
            ranks,
            groups=_groups_of(launch.user, launch.gid) if launch.uid != os.getuid() else [],
            cpus=_usable_cpus(launch.allocation.nodes[launch.node_rank].cpus),
            notify_socket=self.notify_socket,
            lease_file=str(self.lease_file) if self.lease_file is not None else None,
            cgroup=cgroup,
        )
        self._gpus[(launch.job_id, launch.attempt)] = spec.gpus
        if launch.start_barrier:
            spec = empty_outputs_before_start(spec, launch)
        # Rename first so a crash never leaves a half-written job dir under the attempt's real name.
        staging.rename(job_dir)
        try:
            supervisor.spawn(job_dir, spec, forkserver=self.forkserver, revive=self.revive_forkserver)
        except BaseException:
            if cgroup is not None and supervisor.read_status(job_dir) is None and not supervisor.is_alive(job_dir):
                self.containment.destroy(cgroup)
            raise

    def _create_cgroup(self, launch: LaunchDescription) -> dict[str, str] | None:
        """The attempt's cgroup, with its limits, before any of its processes exists."""
        mine = launch.allocation.nodes[launch.node_rank]
        given = tuple(self.gpu_minors.get(gpu, gpu) for gpu in mine.gpus)
        limits = AttemptLimits(
            memory_bytes=mine.mem_mb << 20,
            cpus=mine.cpus,
            gpu_minors=given,
            pids_max=self.pids_max,
            other_gpu_minors=tuple(sorted(set(self.gpu_minors.values()) - set(given))),
            only_listed_devices=self.job_devices == "allowlist",
        )
        try:
            dirs = self.containment.create(attempt_cgroup_name(launch.job_id, launch.attempt), limits)
        except ContainmentError as exc:
            raise RuntimeError(str(exc)) from None
        return None if dirs is None else dict(dirs)

    @staticmethod
    def _give_to_user(path: Path, launch: LaunchDescription) -> None:
        if os.getuid() == 0 and launch.uid != 0:
            os.chown(path, launch.uid, launch.gid)

    def release(self, job_id: int, attempt: int) -> bool:
        """Every node of the gang has launched: let this node's ranks start. False when unknown here."""
        job_dir = self.job_dir(job_id, attempt)
        if not job_dir.exists():
            return False
        if not self.is_placeholder(job_id, attempt):
            supervisor.release(job_dir)
        return True
    def batch_signal(self, job_id: int, attempt: int) -> int:
        """The attempt's --signal=B: signal (only its batch shell gets it), or 0."""
        try:
            return LaunchSpec.from_json((self.job_dir(job_id, attempt) / "launch.json").read_bytes()).batch_signal
        except (OSError, ValueError):
            return 0

    def step_cgroup(self, job_id: int, step_id: int) -> dict[str, str] | None:
        """A cgroup for job step ``step_id``, a child of the job's running attempt's here (its limits, and
        killed with it); None where the attempt is unconfined or not running here."""
        attempt = self._running_attempt(job_id)
        if attempt is None:
            return None
        if self.is_placeholder(job_id, attempt):
            dirs = self.containment.attempt_dirs(attempt_cgroup_name(job_id, attempt))
            if dirs is not None and not all(os.path.isdir(path) for path in dirs.values()):
                dirs = None
        else:
            dirs = launch_cgroup(self.job_dir(job_id, attempt))
        if dirs is None:
            return None
        try:
            return dict(self.containment.create_child(dirs, f"step_{step_id}"))
        except ContainmentError as exc:
            raise RuntimeError(str(exc)) from None

    def _running_attempt(self, job_id: int) -> int | None:
        """The job's attempt running here (a step joins it), or None."""
        for running_job, attempt in self.attempts():
            if running_job == job_id and self.result(running_job, attempt) is None:
                return attempt
        return None

    def tmp_dir(self, job_id: int) -> str | None:
        """The scratch directory (SLURM_TMPDIR) of the job's attempt running here, for its steps' tasks; None
        where it does not run here or has none (an attempt an older agent launched)."""
        attempt = self._running_attempt(job_id)
        if attempt is None:
            return None
        path = self.scratch_dir(job_id, attempt)
        return str(path) if path.is_dir() else None

    def visible_gpus(self, job_id: int) -> tuple[int, ...] | None:
        """The GPUs the job's running attempt here lets its processes open (its devices cgroup's), which its
        steps' tasks see numbered from 0 (launch/env.py's cuda_device_numbers); None where its devices are not
        constrained, where it does not run here, or where that is not known (a placeholder of an older agent)."""
        attempt = self._running_attempt(job_id)
        if attempt is None:
            return None
        job_dir = self.job_dir(job_id, attempt)
        try:
            if self.is_placeholder(job_id, attempt):
                dirs = self.containment.attempt_dirs(attempt_cgroup_name(job_id, attempt))
                gpus = json.loads((job_dir / PLACEHOLDER).read_bytes() or b"{}").get("gpus")
            else:
                spec = LaunchSpec.from_json((job_dir / supervisor_core.LAUNCH_FILE).read_bytes())
                dirs, gpus = spec.cgroup, spec.gpus
        except (OSError, ValueError, AttributeError):
            return None
        if not dirs or DEVICES not in dirs or not isinstance(gpus, list):
            return None
        return tuple(int(gpu) for gpu in gpus)

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

    def stop_for_lease(self, job_id: int, attempt: int) -> bool:
        """Terminate the attempt because the node's lease ran out: its result then says so, whether this stop
        or the supervisor's own lease check got there first."""
        job_dir = self.job_dir(job_id, attempt)
        if not job_dir.exists():
            return False
        (job_dir / LEASE_STOPPED).touch()
        return self.signal(job_id, attempt, "terminate")

    def result(self, job_id: int, attempt: int) -> AttemptResult | None:
        """The attempt's result once every rank here has ended, else None."""
        job_dir = self.job_dir(job_id, attempt)
        lease_stopped = (job_dir / LEASE_STOPPED).exists()
        if self.is_placeholder(job_id, attempt):
            if (job_dir / TERMINATE_REQUESTED).exists():
                return AttemptResult(job_id, attempt, (), lease_expired=lease_stopped)
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
                    # A job's rank killed by signal N is -N (Slurm's ExitCode 0:N); one that exited 128+N
                    # itself stays 128+N (137:0). Steps keep srun's 128+N for both (steps.py).
                    -r.signal if r.signal else r.exit_code if r.exit_code is not None else 1,
                    r.error or (_error_file_message(job_dir / USER_DIR, r.rank) if r.exit_code else ""),
                )
                for r in status.ranks
            )
            usage = status.usage
            if usage is not None:
                usage = {**usage, **self._gpu_usage(job_id, attempt, status.started_at or 0.0)}
            # The agent's own stop for the lease counts only where it stopped something: ranks that all exited 0
            # had finished on their own (the supervisor's flag is the precise one; this covers supervisors
            # started without a lease file).
            stopped = lease_stopped and (not ranks or any(r.exit_code != 0 for r in ranks))
            return AttemptResult(job_id, attempt, ranks, finished_at=status.finished_at or 0.0,
                                 lease_expired=status.lease_expired or stopped, usage=usage,
                                 out_of_memory=status.out_of_memory)
        if status is None and not (job_dir / "launch.json").exists():
            return AttemptResult(job_id, attempt, (), error="launch did not complete")
        # The supervisor died without a final status: kill what it left and report the attempt as failed,
        # with the last thing it wrote (its log goes with the job dir once the result is acknowledged).
        supervisor.kill_orphans(job_dir)
        cgroup = launch_cgroup(job_dir)
        if cgroup is not None:  # what escaped the ranks' process groups is still in the cgroup
            self.containment.destroy(cgroup)
        last = _last_log_line(job_dir / supervisor_core.LOG_FILE)
        # A supervisor that dies once the node's lease has run out (it could not record its stop: a full disk
        # is what stops the lease's renewals too) died of the node's failure, not the job's: the controller
        # then requeues the job as for any lease stop.
        return AttemptResult(job_id, attempt, (), error=f"supervisor died: {last}" if last else "supervisor died",
                             lease_expired=lease_stopped or self._lease_ran_out(), supervisor_lost=True)

    def _lease_ran_out(self) -> bool:
        if self.lease_file is None:
            return False
        end = supervisor_core.read_lease_end(str(self.lease_file))
        return end is not None and supervisor_core.boottime() >= end

    def running_usage(self, job_id: int, attempt: int) -> dict[str, int] | None:
        """A running attempt's figures so far, read from its cgroup (None: unconfined, or already gone)."""
        key = (job_id, attempt)
        if key not in self._cgroups:
            self._cgroups[key] = launch_cgroup(self.job_dir(job_id, attempt))
        dirs = self._cgroups[key]
        if dirs is None or not os.path.isdir(next(iter(dirs.values()))):
            return None
        found = cgroup_runtime.usage(dirs)
        return found or None

    def _gpu_usage(self, job_id: int, attempt: int, started_at: float) -> dict[str, int]:
        """NVML's per-process accounting of the attempt's GPUs, asked once (the result is read again until the
        controller acknowledges it; an agent restarted meanwhile asks again)."""
        key = (job_id, attempt)
        found = self._gpu_usages.get(key)
        if found is not None:
            return found
        gpus = self._gpus.get(key)
        if gpus is None:  # launched by an earlier agent
            try:
                gpus = LaunchSpec.from_json(
                    (self.job_dir(job_id, attempt) / supervisor_core.LAUNCH_FILE).read_bytes()).gpus
            except (OSError, ValueError):
                gpus = []
        from garrison.nodeagent.gpu.accounting import attempt_gpu_usage

        measured = attempt_gpu_usage(gpus, started_at)
        found = {} if measured is None else {
            "gpu_utilization_milli_pct": round(measured.utilization_pct * 1000),
            "gpu_memory_bytes": measured.memory_bytes,
        }
        self._gpu_usages[key] = found
        return found

    def checkpoint_time(self, job_id: int, attempt: int) -> float | None:
        """When the job last touched its checkpoint mark (GARRISON_CHECKPOINT_MARK), if ever."""
        try:
            # Not following a link the job put there: a stat never blocks, but need not reveal root's files.
            return os.lstat(self.job_dir(job_id, attempt) / USER_DIR / CHECKPOINT_MARK).st_mtime
        except OSError:
            return None

    def acknowledge(self, job_id: int, attempt: int) -> None:
        self._cgroups.pop((job_id, attempt), None)
        self._gpus.pop((job_id, attempt), None)
        self._gpu_usages.pop((job_id, attempt), None)
        # Normally the supervisor removed the attempt's cgroup; one made by an agent that crashed before
        # starting the supervisor is empty and still there.
        leftover = self.containment.attempt_dirs(attempt_cgroup_name(job_id, attempt))
        if leftover is not None and any(os.path.isdir(path) for path in leftover.values()):
            self.containment.destroy(leftover)
        job_dir = self.job_dir(job_id, attempt)
        # Renamed first, in one step: from then on no scan (a reconnect's report, the lease's stop) sees the
        # attempt half removed, its status.json gone and so "running". An agent that dies before the rmtree
        # has ended leaves the renamed directory to remove_leftover_removals.
        doomed = job_dir.with_name(job_dir.name + REMOVING_SUFFIX)
        try:
            os.rename(job_dir, doomed)
        except FileNotFoundError:
            return  # acknowledged before (a result reported again after a reconnect)
        except OSError:
            doomed = job_dir  # a leftover of the same name in the way: remove the attempt where it is
        if self.scratch_root is not None:
            remove_tree(self.scratch_dir(job_id, attempt))  # before the job dir, whose absence marks it done
        remove_tree(doomed)

    def remove_leftover_removals(self) -> int:
        """Remove the job directories an earlier agent renamed to remove and did not finish removing (see
        acknowledge); returns how many."""
        removed = 0
        for entry in os.scandir(self.jobs_dir):
            if entry.name.endswith(REMOVING_SUFFIX) and entry.is_dir(follow_symlinks=False):
                key = self.parse_dir_name(entry.name.removesuffix(REMOVING_SUFFIX))
                if key is not None and self.scratch_root is not None:
                    remove_tree(self.scratch_dir(*key))
                remove_tree(entry.path)
                removed += 1
        if self.scratch_root is not None:
            # Scratch directories of attempts that are gone (their job directory removed, or never made).
            for entry in os.scandir(self.scratch_root):
                key = self.parse_dir_name(entry.name)
                if key is not None and not self.job_dir(*key).exists():
                    remove_tree(entry.path)
                    removed += 1
        return removed

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


def attempt_cgroup_name(job_id: int, attempt: int) -> str:
    return f"job_{job_id}_{attempt}"


def launch_cgroup(job_dir: Path) -> dict[str, str] | None:
    """The attempt's cgroup directories as its launch.json records them (None: unconfined or unreadable)."""
    try:
        return LaunchSpec.from_json((job_dir / supervisor_core.LAUNCH_FILE).read_bytes()).cgroup
    except (OSError, ValueError):
        return None


def supervisor_spec(
    launch: LaunchDescription,
    ranks: list[RankPlan],
    *,
    groups: list[int],
    cpus: list[int] | None,
    notify_socket: str | None,
    lease_file: str | None = None,
    cgroup: dict[str, str] | None = None,
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
        lease_file=lease_file,
        start_barrier=launch.start_barrier,
        cgroup=cgroup,
        gpus=list(launch.allocation.nodes[launch.node_rank].gpus),
    )


def truncates_output(launch: LaunchDescription) -> bool:
    """--open-mode: truncate always, append always, or (not given, as in Slurm for a requeued job) truncate
    on the job's first attempt only, so a requeued or restarted job's log keeps its earlier attempts."""
    if launch.spec.open_mode is not None:
        return launch.spec.open_mode == "truncate"
    return launch.attempt == 0


_PER_NODE_SPECIFIER = re.compile(r"%[0-9]*[tnN]")


# Only regular files (or missing ones, which truncate creates) are emptied: an output that is /dev/null, a
# FIFO or a terminal is left as it is, as opening it with O_TRUNC would (truncate(2) fails on those).
_EMPTY_REGULAR_FILES = ('for p do if [ -e "$p" ] && [ ! -f "$p" ]; then continue; fi; '
                        'truncate -s 0 -- "$p" || exit 1; done')


def empty_outputs_before_start(spec: LaunchSpec, launch: LaunchDescription) -> LaunchSpec:
    """A gang's output files are emptied now, before this node reports its launch, rather than when its first
    rank opens them: the gang's ranks start together once every node has reported, and a file shared by
    every node (slurm-%j.out) emptied by node 0's rank after another node's rank had written lost that line.
    With the job user's rights (coreutils' truncate creates a missing file, as opening it would)."""
    paths = sorted({path for rank in spec.ranks for path in rank.truncate})
    if not paths:
        return spec
    as_user = {} if launch.uid == os.getuid() else {
        "user": launch.uid, "group": launch.gid, "extra_groups": spec.groups}
    umask = launch.spec.umask if launch.spec.umask is not None else -1
    done = subprocess.run(["sh", "-c", _EMPTY_REGULAR_FILES, "sh", *paths], cwd=spec.ranks[0].cwd, umask=umask,
                          capture_output=True, text=True, timeout=30, check=False, **as_user)  # type: ignore[call-overload]
    if done.returncode != 0:
        raise RuntimeError(f"cannot empty the output files: {done.stderr.strip()[:200]}")
    return replace(spec, ranks=[replace(rank, truncate=[]) for rank in spec.ranks])


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


def _world_size(launch: LaunchDescription) -> int:
    nodes = launch.allocation.nodes
    return sum(ranks_on_node(launch.spec, launch.allocation, i) for i in range(len(nodes)))


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
    """The message torch's @record wrote to TORCHELASTIC_ERROR_FILE, if the rank left one. The file is the
    job's: read only if it is a regular file of the job's user (the owner of its user dir), see jobfiles.py."""
    owner = owner_of_directory(user_dir)
    if owner is None:
        return ""
    content = read_job_file(user_dir / f"error-{rank}.json", owner, MAX_ERROR_FILE_BYTES)
    if content is None:
        return ""
    try:
        data = json.loads(content)
    except ValueError:
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


def node_defaults(user: str, controller: str) -> dict[str, str]:
    """What a job gets from the node where its environment lacks it (``with_node_defaults``): HOME, USER,
    LOGNAME and SHELL as a login of ``user`` on this node sets them, and, where the node has no configuration
    file for the commands to read it from, the controller's address (``garrison up``'s nodes), so that
    ``srun`` in a job submitted with ``--export=NONE`` finds it."""
    defaults = {"USER": user, "LOGNAME": user}
    try:
        entry = pwd.getpwnam(user)
        defaults.update(HOME=entry.pw_dir, SHELL=entry.pw_shell)
    except KeyError:
        pass
    if controller and not os.path.exists(DEFAULT_CONFIG_PATH):
        defaults["GARRISON_CONTROLLER"] = controller
    return defaults


def _groups_of(user: str, gid: int) -> list[int]:
    try:
        return sorted(set(os.getgrouplist(user, gid)))
    except (KeyError, OSError):
        return [gid]

