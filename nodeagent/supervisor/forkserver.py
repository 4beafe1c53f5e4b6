"""A pre-started process that forks a detached supervisor per request.

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

What a fork costs is mostly the child's copy-on-write faults (every object the supervisor touches, if only to
count a reference, copies its page) and the page tables copied and torn down. So the server imports only what
a supervisor needs (start_forkserver()'s subprocess, select and pathlib are the agent's, imported there).
(gc.freeze() before serving was measured again and left out: supervisor_spawn.py, three alternating pairs,
7.77, 7.30, 8.10 ms of supervisor-and-rank CPU per job with it, 7.20, 6.97, 7.53 without.)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

from .core import (
    CONTROL_SIGNALS,
    LOG_FILE,
    PID_FILE,
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


def _peer_uid(connection: socket.socket) -> int:
    credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", credentials)
    return uid


def _exit_when_parent_dies() -> None:
    # The agent owns the fork server; a restarted agent starts a new one. (The
    # supervisors it forked are detached and unaffected.)
    prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _become_supervisor(job_dir: str, lock_fd: int, sockets_to_close: list[socket.socket]) -> NoReturn:
    """In the forked child: a session of its own, then run the supervisor."""
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
        log_to_file_when_needed(os.path.join(job_dir, LOG_FILE))
        exit_code = run_supervisor(job_dir, lock_fd=lock_fd, pid_file_written=True)
    except BaseException:  # noqa: B036 - a forked copy of the server must never return into its loop
        try:
            import traceback

            open_log_file()
            os.write(2, traceback.format_exc().encode(errors="replace"))
        finally:
            os._exit(1)
    os._exit(exit_code)


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
        pid = os.fork()
        if pid == 0:
            _become_supervisor(job_dir, lock_fd, sockets_to_close)
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
        pid = fork_supervisor(str(request["job_dir"]), fds[0], [listener, connection])
        reply = {"pid": pid}
    except Exception as error:
        reply = {"error": repr(error)}
    finally:
        for fd in fds:
            os.close(fd)
    connection.send(json.dumps(reply).encode())


def serve(socket_path: str | os.PathLike[str], *, exit_with_parent: bool = True) -> NoReturn:
    """Listen on socket_path and fork a supervisor per request, forever."""
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
    while True:
        connection, _address = listener.accept()
        with connection:
            try:
                _handle_request(connection, listener)
            except OSError as error:
                print(f"forkserver: request failed: {error!r}", file=sys.stderr, flush=True)


def start_forkserver(
    socket_path: Path, *, python: str = sys.executable, timeout_s: float = 30.0
) -> subprocess.Popen[bytes]:
    """Start a fork server listening on socket_path; return once it accepts requests.

    The caller owns the process (stop it with terminate() and wait()). It exits by
    itself when the thread that started it exits (PR_SET_PDEATHSIG).
    """
    import select
    import subprocess
    import time

    server = subprocess.Popen(
        [python, "-I", "-m", "garrison.nodeagent.supervisor.forkserver", str(socket_path)],
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


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m garrison.nodeagent.supervisor.forkserver SOCKET_PATH", file=sys.stderr)
        return 2
    serve(argv[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
