"""The agent's side of the supervisor: spawn one per job attempt, read its status, signal it.

Standard library only. Every function takes the attempt's job directory and keeps no
state in memory, so an agent that restarted uses them exactly like the one that
spawned the supervisor.

Whether a supervisor is alive is decided by ``supervisor.lock``, not by its pid: the
supervisor holds an exclusive flock on it for its whole life (taken by spawn() before
the process even exists and handed down to it), so a reused pid can never pass for a
supervisor, and there is no start-up window in which a live supervisor looks dead.

Every request to a supervisor is a file in the attempt's directory, and the signal sent to its pid only wakes
it: a supervisor that has finished an attempt goes on to the next one (forkserver.py), so a pid read for an
attempt that ended meanwhile may be the next attempt's supervisor, which finds no request in its own
directory and ignores the signal.

Launches are idempotent: a job directory that has a live supervisor or a status.json
(its attempt ran, or is running) never gets a second supervisor, because the
controller resends launch commands.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from . import cgroup_runtime, core
from .spec import LaunchSpec, SupervisorStatus

# Where core.py lives: the supervisor is started by appending this directory to sys.path.
SUPERVISOR_CODE_DIR = str(Path(core.__file__).resolve().parent)

# -I: ignore PYTHON* variables and the user's site directory; -S: skip site-packages
# altogether (the editable-install finder alone costs ~14 ms of start-up). core.py
# needs nothing but the standard library.
_BOOTSTRAP = "import sys; sys.path.append(sys.argv[1]); import core; sys.exit(core.main(sys.argv[2:]))"

# The shell starts the supervisor in the background and exits at once, so the
# supervisor is re-parented (to init or the nearest subreaper): the agent never reaps
# it, and the agent's death does not concern it. `$!` is the supervisor's pid, since
# the backgrounded child execs python directly. A shell is the cheapest double fork
# that is safe in a multi-threaded agent (no Python code runs between fork and exec).
_DETACH_SCRIPT = 'log=$1; shift; "$@" </dev/null >/dev/null 2>>"$log" & echo $!'

# The supervisor's own environment (the ranks get exactly their launch env instead).
_SUPERVISOR_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}

SPAWN_TIMEOUT_S = 30.0
ORPHAN_KILL_TIMEOUT_S = 10.0  # emptying a dead supervisor's cgroup (a process stuck in the kernel may not die)

_control_request_numbers = itertools.count()


class SpawnError(RuntimeError):
    """The supervisor could not be started."""


class ForkServerUnreachable(SpawnError):
    """Nothing listens on the fork server's socket: it has died (nothing was asked of it)."""


def spawn(
    job_dir: Path,
    spec: LaunchSpec,
    *,
    forkserver: Path | None = None,
    python: str = sys.executable,
    revive: Callable[[], bool] | None = None,
) -> int:
    """Write launch.json and start the attempt's supervisor, detached; return its pid.

    Returns as soon as the pid is known (a few milliseconds); the supervisor starts the
    ranks on its own. If job_dir already has a live supervisor or a status.json, nothing
    is started and the recorded pid is returned (that supervisor may since have died:
    check is_alive()). With forkserver, the supervisor is forked by the fork server
    listening on that socket (see forkserver.py) instead of starting a new interpreter. A fork server that
    refuses the connection (it has died: killed, or by the OOM killer) is started again by ``revive``
    (True once one listens again) and asked once more; without one, the supervisor starts as a new
    interpreter. Nothing was sent to a server that refused, so asking again cannot start two supervisors.
    """
    job_dir = Path(os.path.abspath(job_dir))
    job_dir.mkdir(parents=True, exist_ok=True)
    with _spawn_lock(job_dir):
        existing_pid = _existing_supervisor_pid(job_dir, spec)
        if existing_pid is not None:
            return existing_pid
        core.write_file_atomically(str(job_dir / core.LAUNCH_FILE), spec.to_json().encode())
        lock_fd = os.open(job_dir / core.LOCK_FILE, os.O_RDWR | os.O_CREAT, core.PRIVATE_FILE_MODE)
        try:
            # Blocking is fine: no supervisor holds it (checked above under the spawn
            # lock), at most an is_alive() probe does, for microseconds.
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            if forkserver is None:
                pid = _start_detached_interpreter(job_dir, lock_fd, python)
                # The supervisor writes it too; writing it here means it exists as soon as we return.
                core.write_file_atomically(str(job_dir / core.PID_FILE), f"{pid}\n".encode())
            else:
                # The fork server has written it (and the supervisor does not) before it answers.
                try:
                    pid = _start_through_forkserver(job_dir, lock_fd, forkserver)
                except ForkServerUnreachable:
                    if revive is not None and revive():
                        pid = _start_through_forkserver(job_dir, lock_fd, forkserver)
                    else:
                        pid = _start_detached_interpreter(job_dir, lock_fd, python)
                        core.write_file_atomically(str(job_dir / core.PID_FILE), f"{pid}\n".encode())
        finally:
            # The supervisor holds its own descriptor of the same open file, so the
            # lock stays held as long as it lives.
            os.close(lock_fd)
        return pid


@contextlib.contextmanager
def _spawn_lock(job_dir: Path) -> Iterator[None]:
    # Serialises concurrent spawns of one job dir (e.g. a resent launch command handled
    # in another thread), so the check-then-start below is not a race. The lock is the
    # directory's own: a lock file was one more file to create and remove per attempt.
    fd = os.open(job_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _existing_supervisor_pid(job_dir: Path, spec: LaunchSpec) -> int | None:
    status = read_status(job_dir)
    if status is not None:
        if (status.job_id, status.attempt) not in ((spec.job_id, spec.attempt), (None, None)):
            raise ValueError(
                f"{job_dir} belongs to job {status.job_id} attempt {status.attempt}, "
                f"not job {spec.job_id} attempt {spec.attempt}"
            )
        return status.supervisor_pid
    if is_alive(job_dir):
        pid = supervisor_pid(job_dir)
        if pid is None:
            raise SpawnError(f"{job_dir} has a supervisor that has not written its pid yet")
        return pid
    # Neither: no supervisor ever got as far as writing a status, so no rank was
    # started and starting (again) is safe.
    return None


def _start_detached_interpreter(job_dir: Path, lock_fd: int, python: str) -> int:
    # Created here, 0600, so the shell's 2>> appends to a private file rather than creating one under the
    # agent's umask (the supervisor's umask must stay the agent's: ranks without --umask inherit it).
    os.close(os.open(job_dir / core.LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                     core.PRIVATE_FILE_MODE))
    command = [
        "/bin/sh",
        "-c",
        _DETACH_SCRIPT,
        "garrison-supervisor-spawn",
        str(job_dir / core.LOG_FILE),
        python,
        "-I",
        "-S",
        "-c",
        _BOOTSTRAP,
        SUPERVISOR_CODE_DIR,
        str(job_dir),
        f"--lock-fd={lock_fd}",
    ]
    # The supervisor inherits our signal mask. With its control signals blocked from the
    # first instant, a terminate() sent while its interpreter still starts stays pending
    # until its main loop consumes it, instead of killing it before it records anything.
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, core.CONTROL_SIGNALS)
    try:
        launcher = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(lock_fd,),
            cwd="/",
            env=_SUPERVISOR_ENV,
            start_new_session=True,
        )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
    output, errors = launcher.communicate(timeout=SPAWN_TIMEOUT_S)
    pid_text = output.decode(errors="replace").strip()
    if launcher.returncode != 0 or not pid_text.isdigit():
        raise SpawnError(
            f"could not start the supervisor for {job_dir}: {errors.decode(errors='replace').strip()}"
        )
    return int(pid_text)


def _start_through_forkserver(job_dir: Path, lock_fd: int, forkserver: Path) -> int:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as connection:
        connection.settimeout(SPAWN_TIMEOUT_S)
        try:
            connection.connect(str(forkserver))
        except (ConnectionRefusedError, FileNotFoundError) as error:
            raise ForkServerUnreachable(f"fork server {forkserver}: {error.strerror}") from None
        socket.send_fds(connection, [json.dumps({"job_dir": str(job_dir)}).encode()], [lock_fd])
        reply = json.loads(connection.recv(65536) or b"{}")
    if not isinstance(reply.get("pid"), int):
        raise SpawnError(f"fork server {forkserver} could not start the supervisor for {job_dir}: {reply}")
    return int(reply["pid"])


def read_status(job_dir: Path) -> SupervisorStatus | None:
    """The supervisor's status.json, or None if it has not written one (yet).

    Raises ValueError if the file is malformed (it is replaced atomically, so that
    means it was not written by a supervisor).
    """
    try:
        text = (Path(job_dir) / core.STATUS_FILE).read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return SupervisorStatus.from_json(text)


def is_alive(job_dir: Path) -> bool:
    """Whether a supervisor for job_dir is running (it holds supervisor.lock)."""
    try:
        fd = os.open(Path(job_dir) / core.LOCK_FILE, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        # A shared probe, released at once: it never blocks a supervisor from starting,
        # and concurrent probes do not disturb each other.
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    finally:
        os.close(fd)
    return False


def supervisor_pid(job_dir: Path) -> int | None:
    """The pid recorded in supervisor.pid (alive or not), or None."""
    try:
        return int((Path(job_dir) / core.PID_FILE).read_text().strip())
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None


def _signal_supervisor(job_dir: Path, signal_number: int) -> bool:
    if not is_alive(job_dir):
        return False
    pid = supervisor_pid(job_dir)
    if pid is None:
        return False
    try:
        os.kill(pid, signal_number)
    except ProcessLookupError:
        return False
    return True


def send(job_dir: Path, sig: int) -> bool:
    """Deliver sig to every rank's process group. False if no supervisor is alive.

    Through a request file in control/ and a SIGHUP, SIGUSR1 and SIGUSR2 too (they were
    sent to the supervisor itself, which a reused supervisor cannot tell from one meant
    for its previous attempt). To stop a job use terminate() or kill_now(), which also
    record why the job ended and enforce the grace period.
    """
    signal_number = signal.Signals(sig)  # ValueError for a number that is no signal
    if not is_alive(job_dir):
        return False
    control_dir = Path(job_dir) / core.CONTROL_DIR
    control_dir.mkdir(mode=0o700, exist_ok=True)
    # One file per request (sorted by name = by time), so concurrent senders never
    # overwrite each other's requests; a dot-name until complete so none is read half-written.
    name = f"{time.time_ns():020d}-{os.getpid()}-{next(_control_request_numbers)}"
    fd = os.open(control_dir / f".{name}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, f"{int(signal_number)}\n".encode())
    finally:
        os.close(fd)
    os.replace(control_dir / f".{name}", control_dir / name)
    return _signal_supervisor(job_dir, core.CONTROL_REQUEST_SIGNAL)


def _request(job_dir: Path, request_file: str, wake_up: int) -> bool:
    """Leave a request file for the attempt's live supervisor, then wake it. False if none is alive."""
    if not is_alive(job_dir):
        return False
    path = Path(job_dir) / request_file
    if not path.exists():
        path.touch(mode=0o600)
    if _signal_supervisor(job_dir, wake_up):
        return True
    # It ended between the two looks: a supervisor awake for another reason may have read this very request
    # first (a gang held at its start barrier ends "not started" on a terminate). It was alive when the
    # request was left and it left its final status: the request did not go unheard. One that died without a
    # status did not take it.
    status = read_status(job_dir)
    return status is not None and status.finished


def terminate(job_dir: Path) -> bool:
    """SIGCONT+SIGTERM to every rank group, SIGKILL to those left after kill_wait_s."""
    return _request(job_dir, core.TERMINATE_REQUEST_FILE, core.TERMINATE_SIGNAL)


def release(job_dir: Path) -> bool:
    """Open a gang's start barrier: the supervisor starts its ranks. Idempotent; the file stays, so a
    supervisor that missed the signal still finds it."""
    path = Path(job_dir) / core.RELEASE_FILE
    if not path.exists():
        path.touch(mode=0o644)
    return _signal_supervisor(job_dir, core.CONTROL_REQUEST_SIGNAL)


def kill_now(job_dir: Path) -> bool:
    """SIGKILL every rank group at once."""
    return _request(job_dir, core.KILL_REQUEST_FILE, core.KILL_NOW_SIGNAL)


def _empty_cgroup(job_dir: Path) -> None:
    """SIGKILL every process in the attempt's cgroup, if it has one: there are all the processes its ranks
    started (a supervisor in a cgroup records no process groups until a rank has ended)."""
    try:
        dirs = LaunchSpec.from_json((Path(job_dir) / core.LAUNCH_FILE).read_bytes()).cgroup
    except (OSError, ValueError):
        return
    if dirs is not None:
        with contextlib.suppress(OSError):
            cgroup_runtime.kill_all(dirs, timeout_s=ORPHAN_KILL_TIMEOUT_S)


def kill_orphans(job_dir: Path) -> list[int]:
    """SIGKILL the rank process groups a dead supervisor left behind, and everything in its attempt's cgroup;
    return the pgids.

    For an agent that finds a supervisor dead (e.g. SIGKILLed by the OOM killer)
    without a final status: its ranks run on in their own groups. Does nothing while a
    supervisor is alive. The ranks' exit codes are lost (they were not our children).
    """
    if is_alive(job_dir):
        return []
    _empty_cgroup(job_dir)
    try:
        status = read_status(job_dir)
    except ValueError:
        return []
    if status is None:
        return []
    killed: list[int] = []
    for rank in status.ranks:
        if rank.ended or rank.pgid is None:
            continue
        # A group number is only reused after the group is gone; if a process with the
        # leader's pid runs but started at another time, the number belongs to someone
        # else now. (The leader itself may be gone while its group lives on.)
        current_start_ticks = core.read_start_ticks(rank.pgid)
        if (
            current_start_ticks is not None
            and rank.leader_start_ticks is not None
            and current_start_ticks != rank.leader_start_ticks
        ):
            continue
        try:
            os.killpg(rank.pgid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        killed.append(rank.pgid)
    return killed
