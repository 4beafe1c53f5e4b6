"""gsrun --pty's task: run a command on a new pseudo-terminal and relay its bytes (the role of slurmstepd's
pty handling).

Started by the step's supervisor as task 0, as the job's user: ``python -I -S steps_pty.py INPUT -- ARGV``.
The command gets the terminal's slave side as its controlling terminal (pty.fork: setsid + login_tty), so
a Ctrl-C byte typed at gsrun makes the line discipline send SIGINT to its foreground process group, as at
a local terminal. What the terminal prints goes to our stdout, the task's output file, which the agent
streams to gsrun. INPUT is a FIFO the agent writes frames to: ``d`` + length + bytes typed at gsrun, ``w``
+ length + rows and columns (struct "!HH") for a window size change, applied with TIOCSWINSZ (the kernel
then sends SIGWINCH to the foreground group).

Our exit status is the command's (128+N for a signal N). A SIGTERM or SIGHUP for the step hangs the
terminal up (the command's session gets SIGHUP, as when an ssh connection drops); the supervisor's SIGKILL
after the grace period ends us, and closing the terminal's master side hangs the session up then too.
Standard library only: this runs with -S, without site-packages.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pty
import select
import signal
import struct
import sys
import termios

FRAME_HEADER = struct.Struct("!cI")
WINDOW = struct.Struct("!HH")
MAX_FRAME = 1 << 20


def _set_window(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            written = os.write(fd, data)
        except InterruptedError:
            continue
        data = data[written:]


def relay(input_path: str, argv: list[str]) -> int:
    child, master = pty.fork()
    if child == 0:
        try:
            os.execvp(argv[0], argv)
        except OSError as error:
            os.write(2, f"gsrun --pty: exec {argv[0]!r}: {error.strerror}\n".encode())
        os._exit(127)

    hang_up = []

    def on_stop(signum: int, frame: object) -> None:
        hang_up.append(signum)

    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT):
        signal.signal(signum, on_stop)
    # Opened read-write, so the FIFO never reports end-of-file while the agent reopens it.
    feed = os.open(input_path, os.O_RDWR | os.O_NONBLOCK)
    pending = b""
    status: int | None = None
    while True:
        if hang_up:
            hang_up.clear()
            # The command's session loses its terminal, as with a dropped connection.
            try:
                os.killpg(os.getpgid(child), signal.SIGHUP)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                os.kill(child, signal.SIGHUP)
            except ProcessLookupError:
                pass
        try:
            ready, _, _ = select.select([master, feed], [], [], 0.5)
        except InterruptedError:
            continue
        if master in ready:
            try:
                data = os.read(master, 65536)
            except OSError as error:
                if error.errno != errno.EIO:
                    raise
                data = b""  # every slave descriptor closed: the command and its children are gone
            if not data:
                break
            _write_all(1, data)
        if feed in ready:
            try:
                pending += os.read(feed, 65536)
            except BlockingIOError:
                pass
            while len(pending) >= FRAME_HEADER.size:
                kind, length = FRAME_HEADER.unpack_from(pending)
                if length > MAX_FRAME or len(pending) < FRAME_HEADER.size + length:
                    break
                body = pending[FRAME_HEADER.size:FRAME_HEADER.size + length]
                pending = pending[FRAME_HEADER.size + length:]
                if kind == b"d":
                    _write_all(master, body)
                elif kind == b"w" and len(body) == WINDOW.size:
                    _set_window(master, *WINDOW.unpack(body))
        if status is None:
            pid, wait_status = os.waitpid(child, os.WNOHANG)
            if pid == child:
                status = wait_status
    if status is None:
        _, status = os.waitpid(child, 0)
    os.close(master)
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--":
        print("usage: steps_pty.py INPUT_FIFO -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    return relay(args[0], args[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
