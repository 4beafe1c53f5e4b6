"""What runs inside an attempt's lifetime with its cgroup v1 directories: join, empty, measure, remove.

The agent creates an attempt's cgroups with their limits (nodeagent/containment/) before the supervisor
starts; from then on the supervisor owns them, so that they live and die with the attempt whatever the
agent does: every rank joins them between fork and exec (so setsid, a double fork or nohup cannot leave
them), and when the attempt ends the supervisor freezes the cgroup, kills every process in it, waits until
it is empty, reads what the attempt used and removes the directories. The agent uses the same functions
for an attempt whose supervisor died.

``dirs`` maps a v1 controller name (memory, cpuset, devices, pids, freezer, cpuacct) to the attempt's
directory in that hierarchy. Standard library only, and importable both as part of the package and as the
top-level module the supervisor's fast start uses (see core.py).
"""

from __future__ import annotations

import errno
import os
import signal
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

PROCS_FILE = "cgroup.procs"
FREEZE_POLL_S = 0.001
EMPTY_POLL_S = 0.005
FREEZE_TIMEOUT_S = 2.0
REMOVE_ATTEMPTS = 200  # rmdir answers EBUSY for a moment after the last task has gone


def join(dirs: Mapping[str, str], pid: int = 0) -> None:
    """Put a process (0: the caller) into every one of the attempt's cgroups. Raises OSError."""
    join_procs_files(procs_files(dirs), pid)


def procs_files(dirs: Mapping[str, str]) -> list[str]:
    """The cgroup.procs files a process joins the attempt's cgroups by, in the order to write them: cpuset
    first (a task cannot join a cpuset without CPUs, and an error there should come before the rest)."""
    return [os.path.join(dirs[controller], PROCS_FILE) for controller in sorted(dirs, key=lambda name: name != "cpuset")]


def join_procs_files(paths: list[str], pid: int = 0) -> None:
    """join() with procs_files() worked out beforehand, for a child between fork and exec, where every object
    touched costs a page copied. pid 0 is the writer itself, to the kernel as to us. Raises OSError."""
    text = b"%d" % pid
    for path in paths:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, text)
        finally:
            os.close(fd)


def _bottom_up(directory: str) -> list[str]:
    """The cgroup and its children (a job step's, say), deepest first."""
    found: list[str] = []
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return found
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            found += _bottom_up(entry.path)
    found.append(directory)
    return found


def members(dirs: Mapping[str, str]) -> list[int]:
    """The pids in the attempt's cgroup and its children (the freezer's, or any one: every process joins
    all of them)."""
    directory = dirs.get("freezer") or next(iter(dirs.values()), None)
    if directory is None:
        return []
    pids: list[int] = []
    for cgroup in _bottom_up(directory):
        try:
            with open(os.path.join(cgroup, PROCS_FILE), "rb") as procs:
                pids += [int(line) for line in procs.read().split()]
        except FileNotFoundError:
            continue
    return pids


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: str) -> str:
    with open(path, "rb") as handle:
        return handle.read().decode().strip()


def _freeze(freezer_dir: str) -> None:
    """FROZEN, and wait (briefly) until the kernel says so: a frozen cgroup cannot fork while we kill it."""
    state_file = os.path.join(freezer_dir, "freezer.state")
    _write(state_file, "FROZEN")
    deadline = time.monotonic() + FREEZE_TIMEOUT_S
    while _read(state_file) != "FROZEN" and time.monotonic() < deadline:
        time.sleep(FREEZE_POLL_S)


def _thaw(freezer_dir: str) -> None:
    _write(os.path.join(freezer_dir, "freezer.state"), "THAWED")


def signal_all(dirs: Mapping[str, str], signal_number: int) -> None:
    """Send a signal to every process in the cgroup (SIGCONT first for SIGTERM, as Slurm does)."""
    for pid in members(dirs):
        try:
            os.kill(pid, signal_number)
        except (ProcessLookupError, PermissionError):
            continue


def kill_all(dirs: Mapping[str, str], reap: Callable[[], None] | None = None, timeout_s: float | None = None) -> bool:
    """Freeze, SIGKILL every member, thaw; repeat until the cgroup is empty. True once it is empty.

    reap is called while waiting: the supervisor is the subreaper of everything the ranks left behind,
    and a zombie it has not reaped would still be a member.
    """
    freezer = dirs.get("freezer")
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        pids = members(dirs)
        if not pids:
            return True
        if freezer is not None:
            try:
                _freeze(freezer)
            except OSError:
                freezer = None  # gone, or not writable: killing without freezing still ends it
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
        if freezer is not None:
            try:
                _thaw(freezer)
            except OSError:
                freezer = None
        if reap is not None:
            reap()
        if deadline is not None and time.monotonic() >= deadline:
            return not members(dirs)
        time.sleep(EMPTY_POLL_S)


def _read_int(path: str) -> int | None:
    try:
        return int(_read(path))
    except (OSError, ValueError):
        return None


def _oom_kills(memory_dir: str) -> int:
    try:
        text = _read(os.path.join(memory_dir, "memory.oom_control"))
    except OSError:
        return 0
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0


def usage(dirs: Mapping[str, str]) -> dict[str, int]:
    """What the attempt used: peak memory (bytes), CPU time (ns), OOM kills and memory limit hits."""
    found: dict[str, int] = {}
    memory = dirs.get("memory")
    if memory is not None:
        peak = _read_int(os.path.join(memory, "memory.max_usage_in_bytes"))
        if peak is not None:
            found["max_rss_bytes"] = peak
        found["oom_kills"] = _oom_kills(memory)
        failcnt = _read_int(os.path.join(memory, "memory.failcnt"))
        if failcnt is not None:
            found["memory_failcnt"] = failcnt
    cpuacct = dirs.get("cpuacct")
    if cpuacct is not None:
        cpu_ns = _read_int(os.path.join(cpuacct, "cpuacct.usage"))
        if cpu_ns is not None:
            found["cpu_time_ns"] = cpu_ns
    return found


def remove(dirs: Mapping[str, str]) -> list[str]:
    """rmdir every directory of the attempt, children first; return those that could not be removed."""
    left: list[str] = []
    for directory in [cgroup for top in dirs.values() for cgroup in _bottom_up(top)]:
        for _ in range(REMOVE_ATTEMPTS):
            try:
                os.rmdir(directory)
                break
            except FileNotFoundError:
                break
            except OSError as error:
                if error.errno != errno.EBUSY:
                    left.append(directory)
                    break
                time.sleep(EMPTY_POLL_S)
        else:
            left.append(directory)
    return left
