"""The supervisor process of one job attempt (the role of Slurm's slurmstepd).

One supervisor runs per (job_id, attempt) at a time; a fork server's supervisor goes on
to another attempt once one is over (forkserver.py). It is started detached from the node
agent (see client.spawn() and forkserver.py), so the agent can crash or restart
without killing or losing jobs. It reads ``launch.json``, starts every rank in its
own session/process group, forwards control signals, enforces the SIGTERM->SIGKILL
grace period, reaps everything (it is a child subreaper) and records exit statuses
in ``status.json``, which the agent reads, also after its own restart.

This module sits on the path between "the agent decided to launch" and "the first
rank runs", so it imports only small standard-library modules. In particular it does
not import spec.py (dataclasses pulls in inspect, ~10 ms); it reads the launch file
into its own plain classes instead. client.spawn() runs it with ``python -I -S`` by
appending this directory to sys.path, so it must not use package-relative imports
either: when started that way it is the top-level module ``core``.

Control protocol: every request is a file in the attempt's job directory, and a signal to the
supervisor pid (client.py sends them) is only a wake-up to look at them. A supervisor is reused for
one attempt after another (forkserver.py), so a signal meant for an attempt that has just ended may
reach the next one's supervisor: it finds no request in its own attempt's directory and does nothing.
  kill-requested       SIGKILL every rank group now (woken by SIGINT)
  terminate-requested  terminate: SIGCONT+SIGTERM to every process group of the attempt, SIGKILL to
                       everything still alive after kill_wait_s (woken by SIGTERM); also read before
                       any rank starts, so a stop asked for while we were being started is not lost
  control/             one file per request, containing a signal number to forward (woken by SIGHUP):
                       to every process of the attempt, also those that left their rank's process
                       group (torchrun's workers run in sessions of their own), except torchrun agents,
                       which would die of it and pass it to nobody, gsrun clients, whose tasks get it
                       from their steps' own supervisors, and shells that do not trap it, which would
                       die of it (to each rank's own process only when it is the launch's
                       batch_signal: --signal=B:, as in Slurm)
  released             at a gang's start barrier: start the ranks (woken by SIGHUP)
Each wake-up signal is the one that meant the request itself before requests were files, so a
supervisor started by an older agent still acts on a newer agent's requests.

Fencing (docs/operations.md): when launch.json names a ``lease_file``, the supervisor
reads it every LEASE_CHECK_INTERVAL_S. It holds the end of the node's lease in
CLOCK_BOOTTIME seconds, written by the agent from the controller's grants; once that
end has passed (the agent is frozen, dead or cut off from the controller), the
supervisor stops its ranks as terminate does and records ``lease_expired``. It does
this on its own, so a frozen agent cannot keep ranks running past the lease.

Start barrier: with ``start_barrier`` set (a gang over several nodes), no rank is
started until the agent has created ``released`` in the job directory (and sent
SIGHUP); a terminate or kill before that ends the attempt with no rank started.
"""

from __future__ import annotations

import _signal
import errno
import fcntl
import json
import os
import signal
import sys
import time

# The cgroup part of the supervisor: a sibling module, imported as the package's when we are part of it
# (the fork server) and as a top-level module when client.spawn() starts us with this directory on sys.path.
try:
    from . import cgroup_runtime, rankexec
except ImportError:
    import cgroup_runtime  # type: ignore[no-redef]
    import rankexec  # type: ignore[no-redef]

# typing costs ~5 ms of start-up and the annotations here are never evaluated at run
# time (postponed annotations), so it is imported for the type checker only. (mypy
# treats a constant named TYPE_CHECKING as true.)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any, NoReturn

LAUNCH_FILE = "launch.json"
STATUS_FILE = "status.json"
PID_FILE = "supervisor.pid"
LOCK_FILE = "supervisor.lock"
LOG_FILE = "supervisor.log"
# Every file the agent or the supervisor writes in a job directory: launch.json holds the job's whole
# environment, the log its commands' errors. The job's user never needs them (the supervisor reads them as
# root), so nobody but root may read them.
PRIVATE_FILE_MODE = 0o600
CONTROL_DIR = "control"

STATE_STARTING = "starting"
STATE_RUNNING = "running"
STATE_FINISHED = "finished"

FORWARDED_SIGNALS = frozenset({signal.SIGUSR1, signal.SIGUSR2})
TERMINATE_SIGNAL = signal.SIGTERM
KILL_NOW_SIGNAL = signal.SIGINT
CONTROL_REQUEST_SIGNAL = signal.SIGHUP
CONTROL_SIGNALS = FORWARDED_SIGNALS | {TERMINATE_SIGNAL, KILL_NOW_SIGNAL, CONTROL_REQUEST_SIGNAL}
# Everything the main loop waits for stays blocked for the supervisor's whole life and
# is consumed synchronously with sigtimedwait(): no handlers, no EINTR, no races.
_WAITED_SIGNALS = CONTROL_SIGNALS | {signal.SIGCHLD}

# Exit codes follow the shell's conventions, so a job's script sees familiar values.
EXIT_COMMAND_NOT_RUNNABLE = 126
EXIT_COMMAND_NOT_FOUND = 127
EXIT_SIGNAL_BASE = 128

# A descendant that makes itself a subreaper (or similar) can empty a rank's process
# group without us being told by SIGCHLD; while some rank's leader has exited but its
# group has not emptied, re-check this often.
GROUP_POLL_INTERVAL_S = 1.0

NOTIFY_TIMEOUT_S = 0.5

# garrison.model.lease.SUPERVISOR_LEASE_CHECK_S: the controller's fence delay counts on it.
LEASE_CHECK_INTERVAL_S = 1.0
RELEASE_FILE = "released"
# The agent creates it before it signals a stop; a stop requested while the supervisor was being started
# (before its pid was known) is found this way, so it is never lost, not even at a start barrier.
TERMINATE_REQUEST_FILE = "terminate-requested"
# Written by client.kill_now() before its wake-up (SIGINT): kill every rank now.
KILL_REQUEST_FILE = "kill-requested"
# The agent signals the release; this is the fallback should its SIGHUP be lost.
BARRIER_POLL_INTERVAL_S = 0.5

_PR_SET_CHILD_SUBREAPER = 36


class LaunchError(Exception):
    """launch.json is missing or malformed."""


class RankProcess:
    """One rank: what to run (from launch.json) and what became of it."""

    __slots__ = (
        "rank",
        "argv",
        "env",
        "cwd",
        "stdout",
        "stderr",
        "truncate",
        "cpus",
        "pid",
        "leader_start_ticks",
        "leader_exit_code",
        "leader_signal",
        "ended",
        "error",
    )

    def __init__(self, description: dict[str, Any]) -> None:
        self.rank = int(description["rank"])
        self.argv = [str(arg) for arg in description["argv"]]
        self.env = {str(key): str(value) for key, value in description["env"].items()}
        self.cwd = str(description["cwd"])
        self.stdout = str(description["stdout"])
        self.stderr = str(description["stderr"])
        self.truncate = frozenset(str(path) for path in description.get("truncate") or ())
        cpus = description.get("cpus")
        self.cpus = [int(cpu) for cpu in cpus] if cpus else None  # a step task's own --cpu-bind
        if not self.argv:
            raise LaunchError(f"rank {self.rank}: empty argv")
        # The rank is its own session, so its pid is also its process group id.
        self.pid: int | None = None
        # Start time (clock ticks since boot) of the leader, so that kill_orphans() can
        # tell the recorded group from an unrelated one that reused the number.
        self.leader_start_ticks: int | None = None
        self.leader_exit_code: int | None = None
        self.leader_signal: int | None = None  # the signal the leader died of, if it did
        self.ended = False
        self.error: str | None = None

    def status(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "pid": self.pid,
            "pgid": self.pid,
            # Only final once the whole group is gone, so only reported then.
            "exit_code": self.leader_exit_code if self.ended else None,
            # Whether 128+N above was an exit status or a death by signal N (Slurm's ExitCode 0:N then).
            "signal": self.leader_signal if self.ended else None,
            "ended": self.ended,
            "error": self.error,
            "leader_start_ticks": self.leader_start_ticks,
        }


class Launch:
    """The parts of launch.json the supervisor needs (schema: spec.LaunchSpec)."""

    __slots__ = (
        "job_id", "attempt", "uid", "gid", "groups", "user", "ranks", "kill_wait_s", "notify_socket", "umask", "cpus",
        "batch_signal", "lease_file", "start_barrier", "cgroup",
    )

    def __init__(self, document: dict[str, Any]) -> None:
        try:
            self.job_id = int(document["job_id"])
            self.attempt = int(document["attempt"])
            self.uid = int(document["uid"])
            self.gid = int(document["gid"])
            self.groups = [int(group) for group in document["groups"]]
            self.user = str(document["user"])
            self.ranks = [RankProcess(rank) for rank in document["ranks"]]
            self.kill_wait_s = float(document["kill_wait_s"])
            notify_socket = document.get("notify_socket")
            self.notify_socket = None if notify_socket is None else str(notify_socket)
            umask = document.get("umask")
            self.umask = None if umask is None else int(umask) & 0o777
            cpus = document.get("cpus")
            self.cpus = None if not cpus else [int(cpu) for cpu in cpus]
            self.batch_signal = int(document.get("batch_signal") or 0)
            lease_file = document.get("lease_file")
            self.lease_file = None if lease_file is None else str(lease_file)
            self.start_barrier = bool(document.get("start_barrier") or False)
            # The attempt's cgroup directories, by v1 controller (created by the agent); None: unconfined.
            cgroup = document.get("cgroup")
            self.cgroup = None if not cgroup else {str(key): str(value) for key, value in cgroup.items()}
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise LaunchError(f"malformed {LAUNCH_FILE}: {error!r}") from error

    @classmethod
    def read(cls, job_dir: str) -> Launch:
        try:
            with open(os.path.join(job_dir, LAUNCH_FILE), "rb") as launch_file:
                document = json.loads(launch_file.read())
        except (OSError, ValueError) as error:
            raise LaunchError(f"cannot read {LAUNCH_FILE}: {error}") from error
        if not isinstance(document, dict):
            raise LaunchError(f"malformed {LAUNCH_FILE}: not an object")
        return cls(document)


def write_file_atomically(path: str, data: bytes) -> None:
    """Readers see the old content or the new one, never a torn write. Mode 0600: what the agent and the
    supervisor write for an attempt (its environment, its status) is root's alone, never other users'."""
    # Per-process temporary name: the client and the supervisor both write supervisor.pid.
    temporary = f"{path}.{os.getpid()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, PRIVATE_FILE_MODE)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)  # a leftover temporary of a crashed writer keeps its old mode otherwise
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(temporary, path)


def read_start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat: the process start time in clock ticks since boot."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            stat = stat_file.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself contain spaces or
    # parentheses, so count fields from the last ')'.
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[19])


def boottime() -> float:
    """Seconds since boot, suspended time included: the lease file's clock (one per host, so the agent's
    and every supervisor's readings agree)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def read_lease_end(path: str) -> float | None:
    """The lease's end (boottime seconds) in the lease file, or None if it cannot be read: no lease."""
    try:
        with open(path, "rb") as lease_file:
            return float(lease_file.read(64).split()[0])
    except (OSError, ValueError, IndexError):
        return None


_log_file_to_open: str | None = None  # see log_to_file_when_needed()


def log_to_file_when_needed(path: str | None) -> None:
    """Make ``path`` our stderr (the log) once there is something to log, not before: most attempts never log
    a line, and a file created and removed for nothing is one more of each per attempt (the fork server's
    supervisors start with stderr on /dev/null and call this)."""
    global _log_file_to_open
    _log_file_to_open = path


def open_log_file() -> None:
    """Open the log that log_to_file_when_needed() named onto stderr, if not done yet."""
    global _log_file_to_open
    path, _log_file_to_open = _log_file_to_open, None
    if path is None:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, PRIVATE_FILE_MODE)
    except OSError:
        return  # nowhere to report it; the status file still says what matters
    if fd != 2:
        os.dup2(fd, 2)
        os.close(fd)


def _log(message: str) -> None:
    # stderr is supervisor.log in the job dir (set up by whoever started us, or opened now). Unbuffered
    # so nothing is lost if we are killed.
    open_log_file()
    line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} supervisor[{os.getpid()}]: {message}\n"
    try:
        os.write(2, line.encode(errors="replace"))
    except OSError:
        return  # nowhere to report it; the status file still says what matters


def _exit_code_from_wait_status(wait_status: int) -> int:
    code = os.waitstatus_to_exitcode(wait_status)
    return EXIT_SIGNAL_BASE - code if code < 0 else code


def reap_exited_children() -> Iterator[tuple[int, int]]:
    """(pid, wait status) of every child that has exited, without blocking. SIGCHLDs
    coalesce, so one signal may stand for several children: reap until none is left."""
    while True:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, wait_status


_libc: Any = None  # ctypes' handle of the C library, made once: the fork server's supervisors inherit it


def prctl(option: int, argument: int) -> None:
    """prctl(2), which the os module lacks. Raises OSError."""
    global _libc
    import ctypes

    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.prctl(option, argument, 0, 0, 0) != 0:
        error_number = ctypes.get_errno()
        raise OSError(error_number, f"prctl({option}): {os.strerror(error_number)}")


def _become_child_subreaper() -> None:
    # Orphaned descendants of the ranks are re-parented to us rather than to init, so we
    # learn (SIGCHLD) when they die and reap them: a zombie still counts as a member of
    # its process group, and a rank only ends when its group is empty.
    prctl(_PR_SET_CHILD_SUBREAPER, 1)


def _ensure_standard_fds_open() -> None:
    # A rank's output files are dup2()ed onto 0-2; if one of those were closed here, an
    # os.open() could return it and the dup2 dance would clobber it.
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            replacement = os.open(os.devnull, os.O_RDWR)
            if replacement != fd:
                os.dup2(replacement, fd)
                os.close(replacement)


def _open_output(path: str, truncate: bool = False) -> int:
    """Open a rank's output file for appending; emptied first when ``truncate`` (--open-mode)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if truncate else 0), 0o644)


def _describe_exec_failure(stage: str, rank: RankProcess, error: BaseException) -> str:
    if isinstance(error, OSError):
        if stage == "exec" and error.errno == errno.ENOENT and "/" not in rank.argv[0]:
            return f"exec {rank.argv[0]!r}: command not found"
        target = error.filename if error.filename is not None else ""
        return f"{stage} {target!r}: {error.strerror or error}" if target else f"{stage}: {error.strerror}"
    return f"{stage}: {error!r}"


def _become_rank(
    rank: RankProcess, launch: Launch, error_pipe: int, ignored_signals: list[int], cgroup_procs: list[str] | None
) -> NoReturn:
    """Runs in the forked child: set up the rank's process and exec it.

    On failure the one-line reason goes to error_pipe (read by the supervisor) and, if
    it can be opened, to the rank's stderr file; the child then exits 127 (126 for a
    permission problem), which becomes the rank's exit code like any other.
    """
    stage = "setsid"
    exit_code = EXIT_COMMAND_NOT_FOUND
    stderr_fd = -1
    privileges_dropped = False
    # Between fork and exec every object touched costs a page copied (its reference count is written): what can
    # be worked out beforehand is (cgroup_procs, ignored_signals), and the plain _signal functions stand in for
    # signal's, which convert every number to and from an enum member.
    try:
        if cgroup_procs is not None:
            # Before anything of the job runs: every process it ever starts is born inside the cgroup.
            stage = "join the attempt's cgroup"
            cgroup_runtime.join_procs_files(cgroup_procs)
        stage = "setsid"
        os.setsid()
        stage = "reset signals"
        # Ignored dispositions survive exec (Python ignores SIGPIPE and SIGXFSZ; a shell
        # that backgrounded us ignores SIGINT and SIGQUIT); a job must start clean.
        for signal_number in ignored_signals:
            _signal.signal(signal_number, _signal.SIG_DFL)
        _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
        cpus = rank.cpus or launch.cpus
        if cpus:
            stage = "bind to CPUs"
            # The CPUs the scheduler chose, NUMA-local to the GPUs; those this host lacks (a node of
            # `garrison up --fake-cpus 32` on a 2-CPU host) are dropped, and with none left the rank keeps the
            # supervisor's, as the cgroup's cpuset does: four background `srun -c 2` steps once failed with
            # exit code 127 there, three of them bound to CPUs that do not exist.
            usable = os.sched_getaffinity(0)
            os.sched_setaffinity(0, set(cpus) & usable or usable)
        if launch.uid != os.getuid():
            stage = f"switch to uid {launch.uid} gid {launch.gid}"
            os.setgroups(launch.groups)
            os.setgid(launch.gid)
            os.setuid(launch.uid)
        privileges_dropped = True
        if launch.umask is not None:
            os.umask(launch.umask)  # the submitter's, so files the job and its output create get their modes
        # Everything from here on happens with the job user's rights only, so a job
        # cannot chdir into or write output files where its user could not.
        stage = "chdir"
        os.chdir(rank.cwd)
        stage = "open stdin"
        stdin_fd = os.open(os.devnull, os.O_RDONLY)
        stage = "open stdout"
        stdout_fd = _open_output(rank.stdout, rank.stdout in rank.truncate)
        if rank.stderr == rank.stdout:
            stderr_fd = stdout_fd
        else:
            stage = "open stderr"
            stderr_fd = _open_output(rank.stderr, rank.stderr in rank.truncate)
        os.dup2(stdin_fd, 0)
        os.dup2(stdout_fd, 1)
        os.dup2(stderr_fd, 2)
        stderr_fd = 2
        stage = "exec"
        if "/" in rank.argv[0]:
            os.execve(rank.argv[0], rank.argv, rank.env)  # what execvpe() does for a path, without its Python
        os.execvpe(rank.argv[0], rank.argv, rank.env)
    except BaseException as error:  # noqa: B036 - a forked copy of the supervisor must never return
        if isinstance(error, OSError) and error.errno in (errno.EACCES, errno.EPERM):
            exit_code = EXIT_COMMAND_NOT_RUNNABLE
        message = _describe_exec_failure(stage, rank, error)
    try:
        os.write(error_pipe, message.encode(errors="replace"))
        if (
            stderr_fd < 0
            and privileges_dropped
            and stage in ("chdir", "open stdout")
            and os.path.isabs(rank.stderr)
        ):
            stderr_fd = _open_output(rank.stderr)
        if stderr_fd >= 0:
            os.write(stderr_fd, f"garrison: rank {rank.rank}: {message}\n".encode(errors="replace"))
    finally:
        os._exit(exit_code)


def _ignored_signals() -> list[int]:
    # The _signal functions, not signal's: these take and give plain ints, where signal.getsignal() and
    # valid_signals() build an enum member per signal (~70 us for all of them, against ~2 us).
    return [number for number in _signal.valid_signals() if _signal.getsignal(number) == _signal.SIG_IGN]


def _wait_for_signal(timeout: float | None) -> int | None:
    if timeout is None:
        return signal.sigwaitinfo(_WAITED_SIGNALS).si_signo
    info = signal.sigtimedwait(_WAITED_SIGNALS, max(timeout, 0.0))
    return None if info is None else info.si_signo


# --- the attempt's process tree -----------------------------------------------------

# How a torchrun (torch.distributed.run) agent shows in its command line. It handles only
# TERM, INT, HUP and QUIT (TORCHELASTIC_SIGNALS_TO_HANDLE adds more, but as fatal ones):
# any other signal kills it and orphans its workers, which it starts in sessions of their
# own. So a warning signal goes to its workers, never to it.
_TORCHRUN_PROGRAMS = frozenset({"torchrun"})
_TORCHRUN_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch"})
# A step's client in the batch script (gsrun, srun): the agent signals the step's tasks itself, so the client
# forwarding a job signal it got too would deliver it twice. Spared as torchrun agents are.
_STEP_CLIENT_PROGRAMS = frozenset({"gsrun", "srun", "garrison-srun"})
# Shells, by the program they run (/proc/PID/exe: a script's comm is the script's name). One that does not trap
# a warning signal is spared it: Slurm sends --signal without B: to the steps, never to the batch shell, and a
# bash killed by SIGUSR1 would end the job FAILED (138) while its program checkpoints and requeues it.
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ksh93", "mksh", "ash", "busybox", "csh", "tcsh", "fish"})
_SHELL_SPARED_SIGNALS = frozenset({signal.SIGUSR1, signal.SIGUSR2})


def process_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group id) of every process on the host, from /proc."""
    table: dict[int, tuple[int, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat_file:
                stat = stat_file.read()
        except OSError:
            continue  # it has just exited
        # Fields after the parenthesised command name: state, ppid, pgrp, ...
        fields = stat[stat.rindex(b")") + 2 :].split()
        table[int(name)] = (int(fields[1]), int(fields[2]))
    return table


def descendants(root: int, table: dict[int, tuple[int, int]]) -> list[int]:
    """Every process below ``root`` in ``table``. The supervisor is a child subreaper, so
    orphans of the ranks are re-parented to it and stay below it."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found: list[int] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child)
    return found


def _has_children() -> bool:
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _command_head(pid: int) -> list[str] | None:
    """The first words of a process's command line (None once it has gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline_file:
            return cmdline_file.read().decode(errors="replace").split("\0")[:4]
    except OSError:
        return None


def is_torchrun_agent(pid: int) -> bool:
    """A torchrun agent, or a step client (gsrun/srun): a process a job signal must not reach itself."""
    head = _command_head(pid)  # torchrun ..., python [-u] .../torchrun ..., python -m torch.distributed.run ...
    if head is None:
        return False
    if any(os.path.basename(word) in _TORCHRUN_PROGRAMS | _STEP_CLIENT_PROGRAMS for word in head):
        return True
    return any(word == "-m" and following in _TORCHRUN_MODULES for word, following in zip(head, head[1:], strict=False))


def _signal_bits(pid: int) -> int | None:
    """The signals a process catches or ignores, as the bit mask of /proc/PID/status (None once it has gone)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status_file:
            lines = status_file.read().splitlines()
    except OSError:
        return None
    bits = 0
    for line in lines:
        if line.startswith((b"SigCgt:", b"SigIgn:")):
            bits |= int(line.split()[1], 16)
    return bits


def is_unready_shell(pid: int, signal_number: int) -> bool:
    """A shell (the batch script's, or one it started) that neither traps nor ignores ``signal_number``, a
    warning signal: it would die of it (bash: exit 138 for SIGUSR1) while its children checkpoint."""
    if signal_number not in _SHELL_SPARED_SIGNALS:
        return False
    try:
        program = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        head = _command_head(pid)
        program = os.path.basename(head[0]) if head else ""
    if program not in _SHELLS:
        return False
    bits = _signal_bits(pid)
    return bits is not None and not bits & (1 << (signal_number - 1))


def spared_from_warning(pid: int, signal_number: int) -> bool:
    """Whether a job-wide warning signal (--signal without B:, a preemption warning, gcancel -s) leaves this
    process out: a torchrun agent or a gsrun client (is_torchrun_agent), or a shell that would die of it.
    Slurm never sends such a signal to the batch shell nor to srun, only to the steps' tasks."""
    return is_torchrun_agent(pid) or is_unready_shell(pid, signal_number)


class Supervisor:
    """Runs the ranks of one launch to completion; see the module docstring."""

    def __init__(self, job_dir: str, launch: Launch) -> None:
        self.job_dir = job_dir
        self.launch = launch
        self.ranks = launch.ranks
        self._rank_by_leader_pid: dict[int, RankProcess] = {}
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.terminated_by: str | None = None
        self.error: str | None = None
        self._kill_deadline: float | None = None
        # The lease ran out while a rank was still running (or before any started): the attempt was stopped
        # for the node's sake, not the job's. Not set when every rank had already ended on its own.
        self.lease_expired = False
        self._lease_over = False  # the lease has run out: no more looks at the file
        self._next_lease_check = 0.0  # time.monotonic() of the next look at the lease file
        self.usage: dict[str, int] | None = None
        self.out_of_memory = False
        self._leftovers_killed = False
        self._kill_request_taken = False
        self._terminate_request_taken = False
        self.left_something_behind = False  # its cgroup could not be removed: this process is not reused

    # --- lifecycle -------------------------------------------------------------

    def run(self) -> int:
        self.write_status(STATE_STARTING)
        try:
            not_started = self._reason_not_to_start()
            if not_started is not None:
                for rank in self.ranks:
                    rank.ended = True
                    rank.error = f"not started: {not_started}"
            else:
                self._start_ranks()
                self._record_running_ranks()
                self._supervise()
        except Exception as error:
            # A bug here must not leave ranks running unsupervised: kill them and say so.
            import traceback

            _log("supervisor failed:\n" + traceback.format_exc())
            self.error = f"supervisor failed: {error!r}"
            self._signal_ranks(signal.SIGKILL)
        self._end_cgroup()
        self.finished_at = time.time()
        self.write_status(STATE_FINISHED)
        self._notify_agent()
        return 0 if self.error is None and not self.left_something_behind else 1

    def _record_running_ranks(self) -> None:
        """The ranks' process groups, once they have started, for an agent that finds us dead
        (client.kill_orphans()). An attempt in a cgroup needs no such record: the cgroup holds every process
        it started, and kill_orphans() empties it (it was one more status file written and replaced per
        attempt)."""
        if self.launch.cgroup is None:
            self.write_status(STATE_RUNNING)

    def _reason_not_to_start(self) -> str | None:
        """Why no rank may start (a stop requested, the lease run out, at the gang's barrier), or None."""
        if self._termination_requested_before_start():
            return f"{self.terminated_by} requested before start"
        if not self._wait_for_release():
            return "node lease expired" if self._lease_over else f"{self.terminated_by} requested before start"
        self._check_lease(force=True)
        return "node lease expired" if self._lease_over else None

    def _wait_for_release(self) -> bool:
        """At a gang's start barrier, wait until the agent releases it: True then, False if the attempt is
        stopped first (terminate, kill, the lease running out). True at once without a barrier."""
        if not self.launch.start_barrier:
            return True
        release = os.path.join(self.job_dir, RELEASE_FILE)
        while not os.path.exists(release):
            self._check_lease()
            if self._lease_over:
                return False
            if self._stop_requested_by_file():
                self.terminated_by = self.terminated_by or "SIGTERM"
                return False
            timeout = BARRIER_POLL_INTERVAL_S
            if self.launch.lease_file is not None:
                timeout = min(timeout, max(self._next_lease_check - time.monotonic(), 0.0))
            if self._kill_requested_by_file():
                self.terminated_by = "SIGKILL"
                return False
            # Any signal is a wake-up to look at the files again (the release, a stop; a control request has
            # no rank to go to yet).
            signal_number = _wait_for_signal(timeout)
            while signal_number is not None:
                signal_number = _wait_for_signal(0)
        return True

    def _stop_requested_by_file(self) -> bool:
        return os.path.exists(os.path.join(self.job_dir, TERMINATE_REQUEST_FILE))

    def _kill_requested_by_file(self) -> bool:
        return os.path.exists(os.path.join(self.job_dir, KILL_REQUEST_FILE))

    def _check_lease(self, force: bool = False) -> None:
        """Every LEASE_CHECK_INTERVAL_S: once the node's lease has run out, stop the ranks (fencing)."""
        if self.launch.lease_file is None or self._lease_over:
            return
        now = time.monotonic()
        if not force and now < self._next_lease_check:
            return
        self._next_lease_check = now + LEASE_CHECK_INTERVAL_S
        end = read_lease_end(self.launch.lease_file)
        remaining = None if end is None else end - boottime()
        if remaining is not None and remaining > 0:
            return
        self._lease_over = True
        # A rank whose leader has exited has its own exit status; only ranks still running are the lease's.
        self.lease_expired = self.started_at is None or any(
            rank.pid is not None and rank.leader_exit_code is None and not rank.ended for rank in self.ranks
        )
        _log(f"node lease {'unreadable' if end is None else 'expired'} ({self.launch.lease_file}): stopping the ranks")
        self._terminate()

    def _end_cgroup(self) -> None:
        """The attempt has ended only when its cgroup is empty: kill what the ranks left behind (daemons
        that left their process groups), wait for it to go, measure what the attempt used, remove the
        cgroup. Only then is the status final and the GPUs free."""
        cgroup = self.launch.cgroup
        if cgroup is None:
            return
        try:
            cgroup_runtime.kill_all(cgroup, reap=lambda: self._reap_children())
            self.usage = cgroup_runtime.usage(cgroup)
        except OSError as error:
            self.left_something_behind = True
            _log(f"cgroup {cgroup}: {error}")
            return
        if self.usage.get("oom_kills", 0) > 0:
            self.out_of_memory = True
            try:
                self._tell_ranks_out_of_memory(self.usage["oom_kills"])
            except OSError as error:  # a note in the output file is worth less than the final status
                _log(f"could not write the out-of-memory note: {error}")
        left = cgroup_runtime.remove(cgroup)
        if left:
            self.left_something_behind = True
            _log(f"cgroup directories still busy, left in place: {left}")

    def _tell_ranks_out_of_memory(self, kills: int) -> None:
        """As slurmstepd does, say so in the job's error output (written with the job user's rights)."""
        message = (
            f"garrison: error: detected {kills} oom_kill event{'s' if kills != 1 else ''} in job "
            f"{self.launch.job_id}: some of its processes were killed by the memory limit (--mem)\n"
        ).encode()
        paths = list(dict.fromkeys(rank.stderr for rank in self.ranks if os.path.isabs(rank.stderr)))
        for path in paths:
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    if self.launch.uid != os.getuid():
                        os.setgroups(self.launch.groups)
                        os.setgid(self.launch.gid)
                        os.setuid(self.launch.uid)
                    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
                    os.write(fd, message)
                    code = 0
                finally:
                    os._exit(code)
            os.waitpid(pid, 0)

    def _termination_requested_before_start(self) -> bool:
        # The wake-ups pending now were sent before this attempt's requests were looked at (or to the attempt
        # this process supervised before): what they asked for is in the files, which are read after.
        while _wait_for_signal(0) is not None:
            pass
        if self._kill_requested_by_file():
            self.terminated_by = "SIGKILL"
        elif self._stop_requested_by_file():
            self.terminated_by = "SIGTERM"
        else:
            return False
        return True

    def _start_ranks(self) -> None:
        ignored_signals: list[int] | None = None  # for a forked rank only
        cgroup_procs = None if self.launch.cgroup is None else cgroup_runtime.procs_files(self.launch.cgroup)
        self.started_at = time.time()
        exec_results: list[tuple[RankProcess, int]] = []
        # Start every rank before waiting for any exec's outcome, so ranks start in parallel. vfork (rankexec)
        # returns once its child has exec'd or failed, which takes well under a millisecond; a fork's child
        # sets itself up meanwhile.
        for rank in self.ranks:
            read_end, write_end = os.pipe()  # close-on-exec: EOF means exec succeeded
            try:
                if rankexec.can_spawn(rank):
                    pid = rankexec.spawn(rank, self.launch, write_end, cgroup_procs)
                else:
                    if ignored_signals is None:
                        ignored_signals = _ignored_signals()
                    pid = os.fork()
                    if pid == 0:
                        _become_rank(rank, self.launch, write_end, ignored_signals, cgroup_procs)
            except BaseException:
                os.close(read_end)
                raise
            finally:
                os.close(write_end)
            rank.pid = pid
            rank.leader_start_ticks = read_start_ticks(pid)
            self._rank_by_leader_pid[pid] = rank
            exec_results.append((rank, read_end))
        # Waiting for the result also guarantees each child has called setsid() before
        # we first signal its process group.
        for rank, read_end in exec_results:
            chunks = []
            while chunk := os.read(read_end, 4096):
                chunks.append(chunk)
            os.close(read_end)
            if chunks:
                rank.error = b"".join(chunks).decode(errors="replace")
                _log(f"rank {rank.rank}: {rank.error}")

    def _supervise(self) -> None:
        while True:
            self._reap_children()
            self._check_lease()
            self._escalate_to_kill_if_due()
            if self._mark_ended_ranks() and not self._all_ranks_ended():
                self.write_status(STATE_RUNNING)  # which ranks have ended, and how (a step's tasks report it)
            if self._all_ranks_ended() and not self._kill_leftovers():
                return
            signal_number = _wait_for_signal(self._wait_timeout())
            while signal_number is not None:
                self._handle_signal(signal_number)
                signal_number = _wait_for_signal(0)

    def _wait_timeout(self) -> float | None:
        timeout: float | None = None
        if self._kill_deadline is not None:
            timeout = self._kill_deadline - time.monotonic()
        if any(rank.leader_exit_code is not None and not rank.ended for rank in self.ranks) or self._leftovers_killed:
            timeout = GROUP_POLL_INTERVAL_S if timeout is None else min(timeout, GROUP_POLL_INTERVAL_S)
        if self.launch.lease_file is not None and not self._lease_over:
            until_check = max(self._next_lease_check - time.monotonic(), 0.0)
            timeout = until_check if timeout is None else min(timeout, until_check)
        return timeout

    def _kill_leftovers(self) -> bool:
        """Every rank's group is empty: SIGKILL what the ranks left running outside their groups (workers
        in sessions of their own whose launcher has died, daemons), as Slurm kills what is left of a step
        at its end. True while any is left; the attempt ends only when none is."""
        if not _has_children():
            # The topmost of any leftovers has lost its parent and so been re-parented to us: with no child
            # there is none, and the common case costs no scan of /proc (~80 us a process).
            return False
        leftovers = descendants(os.getpid(), process_table())
        if not leftovers:
            return False
        if not self._leftovers_killed:
            _log(f"killing {len(leftovers)} process(es) the ranks left running: {leftovers[:20]}")
        self._leftovers_killed = True
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass  # gone meanwhile, or not ours to kill (only without root)
        return True

    # --- children --------------------------------------------------------------

    def _reap_children(self) -> None:
        # Orphaned descendants that were re-parented to us are reaped and forgotten; only
        # leaders have exit codes.
        for pid, wait_status in reap_exited_children():
            rank = self._rank_by_leader_pid.get(pid)
            if rank is not None:
                rank.leader_exit_code = _exit_code_from_wait_status(wait_status)
                rank.leader_signal = os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else None

    def _mark_ended_ranks(self) -> bool:
        """A rank ends when its leader (the batch script, the task's command) has been reaped, as a Slurm task
        ends when its process exits: what it left running in the background without waiting for it (``cmd &``
        in the script's process group, a daemon) is killed once every rank has ended (``_kill_leftovers``),
        as slurmstepd kills what is left of a step. Before, a rank waited for its whole process group, so a
        script that started a monitor in the background and never waited for it held its job, and its GPUs,
        to the time limit."""
        changed = False
        for rank in self.ranks:
            if rank.ended or rank.leader_exit_code is None or rank.pid is None:
                continue
            rank.ended = True
            changed = True
        return changed

    def _all_ranks_ended(self) -> bool:
        return all(rank.ended for rank in self.ranks)

    # --- control ---------------------------------------------------------------

    def _handle_signal(self, signal_number: int) -> None:
        if signal_number == signal.SIGCHLD:
            return  # reaping happens at the top of the loop
        # Whichever control signal woke us, the requests are the files in our attempt's directory: a signal
        # alone may be one sent to the attempt this process supervised before (see the module docstring).
        self._take_requests()

    def _take_requests(self) -> None:
        if not self._kill_request_taken and self._kill_requested_by_file():
            self._kill_request_taken = self._terminate_request_taken = True
            self.terminated_by = "SIGKILL"
            self._kill_deadline = None
            self._signal_attempt(signal.SIGKILL)
        elif not self._terminate_request_taken and self._stop_requested_by_file():
            self._terminate_request_taken = True  # taken once: a later wake-up must not restart the grace period
            self._terminate()
        self._process_control_requests()

    def _terminate(self) -> None:
        if self._kill_deadline is not None or self.terminated_by == "SIGKILL":
            return  # already terminating; a repeated request must not extend the grace period
        self.terminated_by = self.terminated_by or "SIGTERM"
        # SIGCONT first: a stopped (suspended) process would not act on SIGTERM.
        self._signal_attempt(signal.SIGCONT)
        self._signal_attempt(signal.SIGTERM)
        if self.launch.cgroup is not None:  # and what left the ranks' groups (setsid daemons) hears it too
            cgroup_runtime.signal_all(self.launch.cgroup, signal.SIGCONT)
            cgroup_runtime.signal_all(self.launch.cgroup, signal.SIGTERM)
        self._kill_deadline = time.monotonic() + self.launch.kill_wait_s

    def _escalate_to_kill_if_due(self) -> None:
        if self._kill_deadline is not None and time.monotonic() >= self._kill_deadline:
            self._kill_deadline = None
            self._signal_attempt(signal.SIGKILL)

    def _signal_attempt(self, signal_number: int, warning: bool = False) -> None:
        """Every rank's process group, and every group of the processes below us that left them (torchrun
        starts each worker in a session of its own). For a ``warning``, a group holding a process that must
        be spared it (spared_from_warning: a torchrun agent, a gsrun client, a shell without a trap for it)
        is signalled member by member, those left out."""
        self._signal_ranks(signal_number, warning)
        rank_groups = {rank.pid for rank in self.ranks if rank.pid is not None}
        table = process_table()
        escaped: dict[int, list[int]] = {}
        for pid in descendants(os.getpid(), table):
            pgid = table[pid][1]
            if pgid not in rank_groups and pgid != os.getpgrp():
                escaped.setdefault(pgid, []).append(pid)
        for pgid, members in escaped.items():
            self._signal_group(pgid, members, signal_number, warning)

    @staticmethod
    def _signal_group(pgid: int, members: list[int], signal_number: int, warning: bool) -> None:
        spared = {pid for pid in members if spared_from_warning(pid, signal_number)} if warning else set()
        if not spared:
            try:
                os.killpg(pgid, signal_number)
            except (ProcessLookupError, PermissionError) as error:
                _log(f"signal {signal_number} to group {pgid}: {error}")
            return
        for pid in members:
            if pid in spared:
                continue
            try:
                os.kill(pid, signal_number)
            except (ProcessLookupError, PermissionError) as error:
                _log(f"signal {signal_number} to {pid} of group {pgid}: {error}")

    def _signal_ranks(self, signal_number: int, warning: bool = False) -> None:
        table = process_table() if warning else {}
        for rank in self.ranks:
            # Ended groups are never signalled: their number may already be reused.
            if rank.ended or rank.pid is None:
                continue
            if warning:
                members = [pid for pid, (_, pgid) in table.items() if pgid == rank.pid]
                self._signal_group(rank.pid, members, signal_number, warning)
                continue
            try:
                os.killpg(rank.pid, signal_number)
            except (ProcessLookupError, PermissionError) as error:
                _log(f"rank {rank.rank}: killpg({rank.pid}, {signal_number}): {error}")

    def _forward(self, signal_number: int) -> None:
        """A signal for the job: every rank's process group, or, for the job's --signal=B: signal, only
        each rank's own process (the batch shell), not the children it started."""
        if signal_number != self.launch.batch_signal:
            self._signal_attempt(signal_number, warning=True)
            return
        for rank in self.ranks:
            if rank.ended or rank.pid is None or rank.leader_exit_code is not None:
                continue  # a leader already reaped: its pid may be reused
            try:
                os.kill(rank.pid, signal_number)
            except (ProcessLookupError, PermissionError) as error:
                _log(f"rank {rank.rank}: kill({rank.pid}, {signal_number}): {error}")

    def _process_control_requests(self) -> None:
        control_dir = os.path.join(self.job_dir, CONTROL_DIR)
        try:
            names = sorted(name for name in os.listdir(control_dir) if not name.startswith("."))
        except FileNotFoundError:
            return
        for name in names:
            path = os.path.join(control_dir, name)
            try:
                with open(path, "rb") as request_file:
                    request = request_file.read().decode().strip()
                os.unlink(path)
                signal_number = int(request)
                signal.Signals(signal_number)
            except (OSError, ValueError) as error:
                _log(f"ignoring control request {name}: {error!r}")
                continue
            self._forward(signal_number)

    # --- reporting -------------------------------------------------------------

    def write_status(self, state: str) -> None:
        write_status_file(
            self.job_dir,
            {
                "job_id": self.launch.job_id,
                "attempt": self.launch.attempt,
                "supervisor_pid": os.getpid(),
                "state": state,
                "started_at": self.started_at,
                "finished_at": self.finished_at,
                "ranks": [rank.status() for rank in self.ranks],
                "terminated_by": self.terminated_by,
                "error": self.error,
                "lease_expired": self.lease_expired,
                "usage": self.usage,
                "out_of_memory": self.out_of_memory,
            },
        )

    def _notify_agent(self) -> None:
        if self.launch.notify_socket is None:
            return
        notify_agent(self.launch.notify_socket, self.launch.job_id, self.launch.attempt)


def write_status_file(job_dir: str, document: dict[str, Any]) -> None:
    write_file_atomically(os.path.join(job_dir, STATUS_FILE), json.dumps(document).encode())


def notify_agent(socket_path: str, job_id: int | None, attempt: int | None) -> None:
    """Best effort: the agent may be down, and it re-reads status files when it starts."""
    import socket  # only needed once the job is over; keep it off the start-up path

    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify_socket:
            notify_socket.settimeout(NOTIFY_TIMEOUT_S)
            notify_socket.sendto(json.dumps({"job_id": job_id, "attempt": attempt}).encode(), socket_path)
    except OSError as error:
        _log(f"notify {socket_path}: {error}")


def _claim_job_dir(job_dir: str, inherited_lock_fd: int | None) -> int | None:
    """Holds supervisor.lock for our whole life; None if another supervisor holds it.

    The lock is how clients tell a live supervisor of this job dir from a dead one or an
    unrelated process that reused its pid. client.spawn() takes it before starting us
    and hands the descriptor down, so there is no moment when we run without it.
    """
    if inherited_lock_fd is not None:
        # The ranks must not inherit it, or they would keep us "alive" after our death.
        os.set_inheritable(inherited_lock_fd, False)
        return inherited_lock_fd
    lock_fd = os.open(os.path.join(job_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, PRIVATE_FILE_MODE)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock_fd)
        return None
    return lock_fd


def run_supervisor(
    job_dir: str | os.PathLike[str], *, lock_fd: int | None = None, pid_file_written: bool = False
) -> int:
    """Supervise the job attempt in job_dir until every rank has ended.

    Safe to call right after os.fork() from a single-threaded process (see
    forkserver.py). lock_fd, if given, is an open descriptor of job_dir/supervisor.lock
    on which the caller already holds an exclusive flock for us. pid_file_written: the
    caller has written our pid to supervisor.pid (the fork server does, before it answers).
    """
    # Block first: control signals sent while we start stay pending instead of killing
    # us (client.spawn() already starts us with them blocked).
    signal.pthread_sigmask(signal.SIG_BLOCK, _WAITED_SIGNALS)
    # An inherited SIG_IGN for SIGCHLD would make the kernel reap our children for us
    # and lose their exit statuses.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _ensure_standard_fds_open()
    job_dir = os.path.abspath(job_dir)
    owned_lock_fd = _claim_job_dir(job_dir, lock_fd)
    if owned_lock_fd is None:
        _log(f"{job_dir} already has a live supervisor; exiting")
        return 0
    if os.path.exists(os.path.join(job_dir, STATUS_FILE)):
        # A supervisor already ran this attempt (perhaps it was killed): never run the
        # ranks twice. The agent deals with the leftovers (client.kill_orphans()).
        _log(f"{job_dir} already has a {STATUS_FILE}; not starting the job again")
        return 0
    if os.getpgid(0) != os.getpid():  # setsid() fails for a process group leader
        os.setsid()  # detach from the session (and terminal) of whoever started us
    os.chdir("/")  # keep no directory busy; rank cwds and paths are set per rank
    if not pid_file_written:
        write_file_atomically(os.path.join(job_dir, PID_FILE), f"{os.getpid()}\n".encode())
    try:
        launch = Launch.read(job_dir)
    except LaunchError as error:
        _log(str(error))
        write_status_file(
            job_dir,
            {
                "job_id": None,
                "attempt": None,
                "supervisor_pid": os.getpid(),
                "state": STATE_FINISHED,
                "started_at": None,
                "finished_at": time.time(),
                "ranks": [],
                "terminated_by": None,
                "error": str(error),
            },
        )
        return 2
    _become_child_subreaper()
    return Supervisor(job_dir, launch).run()


USAGE = "usage: python -m garrison.nodeagent.supervisor JOB_DIR [--lock-fd=FD]"


def main(argv: list[str]) -> int:
    # Hand-rolled argument parsing: argparse alone costs milliseconds at start-up.
    job_dir: str | None = None
    lock_fd: int | None = None
    for argument in argv:
        if argument.startswith("--lock-fd="):
            lock_fd = int(argument.removeprefix("--lock-fd="))
        elif argument.startswith("-") or job_dir is not None:
            print(USAGE, file=sys.stderr)
            return 2
        else:
            job_dir = argument
    if job_dir is None:
        print(USAGE, file=sys.stderr)
        return 2
    return run_supervisor(job_dir, lock_fd=lock_fd)
