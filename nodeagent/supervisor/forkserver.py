"""A pre-started process that forks detached supervisors, and hands attempts to those that are idle.

Starting a supervisor as a new interpreter costs ~15-20 ms of Python start-up; a fork
of an interpreter that has already imported core.py costs ~1 ms. The agent starts one
fork server (start_forkserver()) and passes its socket to client.spawn(forkserver=...).

Protocol, on an AF_UNIX SOCK_SEQPACKET socket (mode 0600, and peers must have our uid
or be root, since a supervisor may start ranks as any user): one request per
connection, the JSON ``{"job_dir": "/abs/path"}`` with one descriptor attached
(SCM_RIGHTS): job_dir/supervisor.lock, exclusively flocked by the client. The reply
is ``{"pid": N}`` or ``{"error": "..."}``, sent once the server has written N to job_dir/supervisor.pid (the
supervisor does not write it again: one file write less per attempt).

The server must stay single-threaded: its children run Python code after fork().

Reused supervisors (issue 23): a supervisor that has finished an attempt (status.json written, the agent
notified, its ranks reaped, its cgroup emptied and removed, supervisor.lock let go) does not exit: it says
``idle`` on a SEQPACKET socket pair it shares with the server and waits there. The server hands the next
request to an idle supervisor, the job_dir and the lock descriptor as above; the supervisor acknowledges
(``ok``) before it does anything else, and only then does the server write its pid and answer. A supervisor
that dies before its acknowledgement ran nothing, so the server forks one instead. The fork, the page copies
that follow it and the teardown of a ~13 MB interpreter are then paid once per supervisor, not per attempt
(tests/benchmarks/supervisor_spawn.py; docs/performance.md). At most ``max_idle`` wait (the agent passes its
node's GPU count, MAX_IDLE_SUPERVISORS at least: as many as the jobs that end together and are replaced
together, or their replacements are forked after all); one more is told to exit (its socket closed). An
idle supervisor exits when the server has gone (EOF: the agent restarted); a busy one finishes its attempt
first. A supervisor is reused only when nothing of its attempt is left in it: its process state (cwd, umask,
environment, rlimits, descriptors, signal dispositions and mask, ids, CPU affinity, cgroups) must be what it
was before its first attempt, it has no child, and its attempt ended without an error; otherwise, and after
MAX_ATTEMPTS_PER_SUPERVISOR attempts, it exits.

What a fork costs is mostly the child's copy-on-write faults (every object the supervisor touches, if only to
count a reference, copies its page) and the page tables copied and torn down. So the server imports only what
a supervisor needs (start_forkserver()'s subprocess and pathlib are the agent's, imported there).
(gc.freeze() before serving was measured again and left out: supervisor_spawn.py, three alternating pairs,
7.77, 7.30, 8.10 ms of supervisor-and-rank CPU per job with it, 7.20, 6.97, 7.53 without.)
"""

from __future__ import annotations

import _signal
import json
import os
import resource
import select
import signal
import socket
import struct
import sys

from .core import (
    _WAITED_SIGNALS,
    CONTROL_SIGNALS,
    LOG_FILE,
    PID_FILE,
    _has_children,
    log_to_file_when_needed,
    open_log_file,
    prctl,
    reap_exited_children,
    run_supervisor,
    write_file_atomically,
)

TYPE_CHECKING = False  # typing, pathlib and subprocess are the agent's, not the server's (see above)
if TYPE_CHECKING:
    import subprocess
    from pathlib import Path
    from typing import NoReturn

MAX_REQUEST_BYTES = 64 * 1024
READY_LINE = b"ready\n"
_PR_SET_PDEATHSIG = 1
MAX_IDLE_SUPERVISORS = 8
# A bound on what one process may accumulate unseen (its heap, its modules): after this many attempts it
# exits and the next one is forked, which costs one fork in this many.
MAX_ATTEMPTS_PER_SUPERVISOR = 256
IDLE = b"idle"
ACKNOWLEDGED = b"ok"
# How long the server waits for an idle supervisor's acknowledgement. It is blocked on its socket and answers
# at once; one that does not (stopped, stuck) is killed, and the attempt goes to a new supervisor.
ACKNOWLEDGE_TIMEOUT_S = 5.0


def _peer_uid(connection: socket.socket) -> int:
    credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", credentials)
    return uid


def _exit_when_parent_dies() -> None:
    # The agent owns the fork server; a restarted agent starts a new one. (The
    # supervisors it forked are detached and unaffected.)
    prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _process_state(attempt_lock_fd: int | None = None) -> tuple[object, ...]:
    """Everything of this process an attempt could change and the next one would inherit (Python objects are
    made anew per attempt: core.Supervisor, its Launch). Compared before and after each attempt; the
    descriptors leave out the attempt's supervisor.lock, which is closed when the attempt ends."""
    umask = os.umask(0o077)
    os.umask(umask)
    limits = tuple(
        resource.getrlimit(getattr(resource, name)) for name in sorted(dir(resource)) if name.startswith("RLIMIT_")
    )
    dispositions = tuple(_signal.getsignal(number) for number in sorted(_signal.valid_signals()))
    with open("/proc/self/cgroup", "rb") as cgroup_file:
        cgroups = cgroup_file.read()
    descriptors = sorted(fd for fd in os.listdir("/proc/self/fd") if fd != str(attempt_lock_fd))
    return (
        os.getcwd(), umask, dict(os.environ), limits, dispositions,
        frozenset(signal.pthread_sigmask(signal.SIG_BLOCK, ())), descriptors,
        os.getresuid(), os.getresgid(), os.getgroups(), frozenset(os.sched_getaffinity(0)),
        os.getpriority(os.PRIO_PROCESS, 0), os.getsid(0), os.getpgid(0), cgroups,
    )


def _reset_after_attempt() -> None:
    """What an attempt leaves that is ours to undo: the log it named (and perhaps opened onto stderr)."""
    log_to_file_when_needed(None)
    null_fd = os.open(os.devnull, os.O_RDWR)
    os.dup2(null_fd, 2)
    os.close(null_fd)


def _next_attempt(channel: socket.socket) -> tuple[str, int] | None:
    """Tell the server we are idle and wait for its next attempt: (job_dir, lock_fd), or None (it is gone, or
    has idle supervisors enough)."""
    try:
        channel.send(IDLE)
        message, fds, _flags, _address = socket.recv_fds(channel, MAX_REQUEST_BYTES, 1)
    except OSError:
        return None
    if not message or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        return None
    try:
        job_dir = str(json.loads(message)["job_dir"])
        channel.send(ACKNOWLEDGED)
    except (OSError, ValueError, KeyError, TypeError):
        os.close(fds[0])  # the server takes no acknowledgement for one: it forks a supervisor for it
        return None
    return job_dir, fds[0]


def _become_supervisor(
    job_dir: str, lock_fd: int, sockets_to_close: list[socket.socket], channel: socket.socket
) -> NoReturn:
    """In the forked child: a session of its own, then run the supervisor, for one attempt after another."""
    exit_code = 1
    try:
        os.setsid()
        for server_socket in sockets_to_close:
            # detach() first: our copy of the socket object must not close the number
            # again later, when it may belong to something else.
            os.close(server_socket.detach())
        null_fd = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null_fd, fd)
        os.close(null_fd)
        # The state run_supervisor() sets up for itself, set before the snapshot, so that the snapshot is what
        # every attempt starts from.
        os.chdir("/")
        signal.pthread_sigmask(signal.SIG_BLOCK, _WAITED_SIGNALS)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        initial_state = _process_state(lock_fd)
        for attempts in range(1, MAX_ATTEMPTS_PER_SUPERVISOR + 1):
            log_to_file_when_needed(os.path.join(job_dir, LOG_FILE))
            exit_code = run_supervisor(job_dir, lock_fd=lock_fd, pid_file_written=True)
            # The attempt is over for the agent and for clients only once this is closed: is_alive() is the lock.
            os.close(lock_fd)
            _reset_after_attempt()
            if exit_code != 0 or attempts == MAX_ATTEMPTS_PER_SUPERVISOR or _has_children():
                break
            if _process_state() != initial_state:
                break
            next_attempt = _next_attempt(channel)
            if next_attempt is None:
                break
            job_dir, lock_fd = next_attempt
    except BaseException:  # noqa: B036 - a forked copy of the server must never return into its loop
        try:
            import traceback

            open_log_file()
            os.write(2, traceback.format_exc().encode(errors="replace"))
        finally:
            os._exit(1)
    os._exit(exit_code)


# The server's end of each supervisor's socket pair, by the supervisor's pid, and the idle ones (oldest first).
_channels: dict[int, socket.socket] = {}
_pid_by_channel_fd: dict[int, int] = {}
# poll(), not select(): a node may run more supervisors than select()'s 1,024 descriptors. (A poll object holds
# no descriptor, so the supervisors forked with a copy of it inherit nothing.)
_poller = select.poll()
_idle: list[int] = []
_max_idle = MAX_IDLE_SUPERVISORS


def _drop(pid: int) -> None:
    """Forget a supervisor: closing our end tells it (if idle) to exit."""
    channel = _channels.pop(pid, None)
    if channel is not None:
        _poller.unregister(channel)
        del _pid_by_channel_fd[channel.fileno()]
        channel.close()
    if pid in _idle:
        _idle.remove(pid)


def _hear_from_supervisor(pid: int) -> None:
    """Its socket is readable: it is idle, or has gone (EOF)."""
    try:
        message = _channels[pid].recv(16)
    except OSError:
        message = b""
    if message != IDLE:
        _drop(pid)
        return
    _idle.append(pid)
    while len(_idle) > _max_idle:
        _drop(_idle[0])


def _hand_to_idle_supervisor(job_dir: str, lock_fd: int) -> int | None:
    """Give the attempt to an idle supervisor (the most recently idle: its pages are the warmest); its pid, or
    None when none took it."""
    while _idle:
        pid = _idle.pop()
        channel = _channels[pid]
        try:
            socket.send_fds(channel, [json.dumps({"job_dir": job_dir}).encode()], [lock_fd])
            channel.settimeout(ACKNOWLEDGE_TIMEOUT_S)
            acknowledgement = channel.recv(16)
            channel.settimeout(None)
        except TimeoutError:
            # Stopped or stuck with the request in hand: it must not start it later, after another has.
            _kill_and_wait(pid)
            acknowledgement = b""
        except OSError:
            acknowledgement = b""
        if acknowledgement == ACKNOWLEDGED:
            write_file_atomically(os.path.join(job_dir, PID_FILE), f"{pid}\n".encode())
            return pid
        # It died (or was killed) before acknowledging: it started nothing, and the lock is still ours to pass on.
        _drop(pid)
    return None


def _kill_and_wait(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass  # reaped by _reap_supervisors meanwhile: dead either way


def fork_supervisor(job_dir: str, lock_fd: int, sockets_to_close: list[socket.socket]) -> int:
    """Fork a supervisor for job_dir, in a session of its own; return its pid.

    One fork, not the classic daemon's two: the supervisor stays our child (reaped by _reap_supervisors
    as it exits) until we exit, and then belongs to init, like any orphan; nothing it does depends on
    its parent. An intermediate process cost every job a second fork and teardown of this interpreter.
    """
    if not os.path.isabs(job_dir) or not os.path.isdir(job_dir):
        raise ValueError(f"job_dir must be an existing absolute directory: {job_dir!r}")
    # Fork with the control signals blocked: the child inherits the mask, so signals
    # sent to it before run_supervisor() takes over stay pending instead of killing it.
    # SIGTERM among them: the agent's death (PR_SET_PDEATHSIG) waits until the pid file is written, so a
    # live supervisor always has one.
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, CONTROL_SIGNALS)
    try:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            raise
        if pid == 0:
            # Our ends of the other supervisors' pairs: held here, they would keep those supervisors from
            # seeing the server's exit.
            _become_supervisor(job_dir, lock_fd, [*sockets_to_close, ours, *_channels.values()], theirs)
        theirs.close()
        _channels[pid] = ours
        _pid_by_channel_fd[ours.fileno()] = pid
        _poller.register(ours, select.POLLIN)
        write_file_atomically(os.path.join(job_dir, PID_FILE), f"{pid}\n".encode())
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
    return pid


def _reap_supervisors(_signal_number: int = 0, _frame: object = None) -> None:
    """SIGCHLD: reap every supervisor that has exited, at once. A zombie would still look alive to an agent
    that checks its pid, and run_supervisor() itself resets SIGCHLD in the child."""
    for _pid, _status in reap_exited_children():
        pass


def _handle_request(connection: socket.socket, listener: socket.socket) -> None:
    reply: dict[str, object]
    if _peer_uid(connection) not in (0, os.getuid()):
        connection.send(json.dumps({"error": "permission denied"}).encode())
        return
    message, fds, _flags, _address = socket.recv_fds(connection, MAX_REQUEST_BYTES, 1)
    try:
        if len(fds) != 1:
            raise ValueError("expected exactly one descriptor (the job's supervisor.lock)")
        request = json.loads(message)
        job_dir = str(request["job_dir"])
        if not os.path.isabs(job_dir) or not os.path.isdir(job_dir):
            raise ValueError(f"job_dir must be an existing absolute directory: {job_dir!r}")
        # As around a fork: our death (SIGTERM, PR_SET_PDEATHSIG) waits until the pid file of a supervisor
        # that took the attempt is written.
        previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            pid = _hand_to_idle_supervisor(job_dir, fds[0])
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
        if pid is None:
            pid = fork_supervisor(job_dir, fds[0], [listener, connection])
        reply = {"pid": pid}
    except Exception as error:
        reply = {"error": repr(error)}
    finally:
        for fd in fds:
            os.close(fd)
    connection.send(json.dumps(reply).encode())


def serve(
    socket_path: str | os.PathLike[str], *, exit_with_parent: bool = True, max_idle: int = MAX_IDLE_SUPERVISORS
) -> NoReturn:
    """Listen on socket_path and fork a supervisor per request (or hand it to an idle one), forever; keep at
    most ``max_idle`` idle supervisors."""
    global _max_idle
    _max_idle = max_idle
    if exit_with_parent:
        _exit_when_parent_dies()
    else:
        prctl(_PR_SET_PDEATHSIG, 0)  # a no-op, made here so that every supervisor inherits the C library's handle
    signal.signal(signal.SIGCHLD, _reap_supervisors)
    try:
        os.unlink(socket_path)  # a previous server's leftover
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    old_umask = os.umask(0o177)  # the socket is created 0600: only our user may connect
    try:
        listener.bind(str(socket_path))
    finally:
        os.umask(old_umask)
    listener.listen(64)
    sys.stdout.buffer.write(READY_LINE)
    sys.stdout.flush()
    _poller.register(listener, select.POLLIN)
    while True:
        # poll() retries by itself after the SIGCHLD handler has run (PEP 475). Supervisors first: one that has
        # just said it is idle can take the request that came with it.
        ready = [fd for fd, _events in _poller.poll()]
        for fd in ready:
            pid = _pid_by_channel_fd.get(fd)
            if pid is not None:
                _hear_from_supervisor(pid)
        if listener.fileno() not in ready:
            continue
        connection, _address = listener.accept()
        with connection:
            try:
                _handle_request(connection, listener)
            except OSError as error:
                print(f"forkserver: request failed: {error!r}", file=sys.stderr, flush=True)


def start_forkserver(
    socket_path: Path, *, python: str = sys.executable, timeout_s: float = 30.0,
    max_idle: int = MAX_IDLE_SUPERVISORS,
) -> subprocess.Popen[bytes]:
    """Start a fork server listening on socket_path, keeping at most ``max_idle`` idle supervisors; return
    once it accepts requests.

    The caller owns the process (stop it with terminate() and wait()). It exits by
    itself when the thread that started it exits (PR_SET_PDEATHSIG).
    """
    import subprocess
    import time

    server = subprocess.Popen(
        [python, "-I", "-m", "garrison.nodeagent.supervisor.forkserver", str(socket_path), str(max_idle)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert server.stdout is not None
    deadline = time.monotonic() + timeout_s
    line = b""
    while not line.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        readable, _, _ = select.select([server.stdout], [], [], max(remaining, 0))
        chunk = os.read(server.stdout.fileno(), 64) if readable else b""
        if not chunk:  # EOF (the server died) or the deadline passed
            server.kill()
            server.wait()
            raise RuntimeError(f"fork server on {socket_path} did not start")
        line += chunk
    server.stdout.close()
    return server


USAGE = "usage: python -m garrison.nodeagent.supervisor.forkserver SOCKET_PATH [MAX_IDLE]"


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print(USAGE, file=sys.stderr)
        return 2
    max_idle = MAX_IDLE_SUPERVISORS
    if len(argv) == 2:
        if not argv[1].isdigit():
            print(f"forkserver: error: MAX_IDLE must be a whole number, not {argv[1]!r}", file=sys.stderr)
            return 2
        max_idle = int(argv[1])
    serve(argv[0], max_idle=max_idle)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
