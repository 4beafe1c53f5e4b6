"""Starting a rank without forking the supervisor's Python: _rankexec.c's vfork + exec where it was built.

os.fork() of the supervisor copies its page tables, and every object the child touches before exec costs a
page copied, all torn down again by exec: about a fifth of a trivial job's CPU end to end. The compiled
module does what core._become_rank does (the same system calls in the same order, the same messages and
exit codes) from C, on the parent's memory, so none of that is paid. Where it was not built (no compiler
at install time: it is optional) or cannot express a rank (an environment the exec would refuse), the
supervisor forks as before, and core._become_rank reports what is wrong.

Standard library only, and importable both as part of the package and as the top-level module the
supervisor's fast start uses (see core.py).
"""

from __future__ import annotations

import os

try:
    from . import _rankexec  # type: ignore[attr-defined]
except ImportError:
    try:
        import _rankexec  # type: ignore[no-redef]
    except ImportError:
        _rankexec = None

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# The job control stage names of core._become_rank, with its message format: "<stage> '<target>': <reason>".
JOIN_STAGE = "join the attempt's cgroup"


def available() -> bool:
    """Whether the compiled module was built and imported."""
    return _rankexec is not None


def can_spawn(rank: Any) -> bool:
    """Whether spawn() can start this rank. An environment variable whose name is empty or holds '=', or any
    NUL byte in a string it passes on, is refused by Python: the fork path then says so, as it always has."""
    if _rankexec is None:
        return False
    if any("\0" in text for text in (*rank.argv, rank.cwd, rank.stdout, rank.stderr)):
        return False  # C would cut the string at the NUL (the working directory is not refused before this)
    return all(name and "=" not in name and "\0" not in name and "\0" not in value
               for name, value in rank.env.items())


def spawn(rank: Any, launch: Any, error_fd: int, cgroup_procs: list[str] | None) -> int:
    """Start ``rank`` (a core.RankProcess) of ``launch`` (a core.Launch) as core._become_rank would in a forked
    child; its one-line reason goes to ``error_fd`` if it cannot exec. Returns the rank's pid once it has
    exec'd or failed (vfork returns then). Raises OSError where vfork itself fails."""
    assert _rankexec is not None
    encode = os.fsencode
    argv = [encode(arg) for arg in rank.argv]
    envp = [encode(name) + b"=" + encode(value) for name, value in rank.env.items()]
    path_dirs = None if "/" in rank.argv[0] else [encode(d) for d in os.get_exec_path(rank.env)]
    procs = list(cgroup_procs or ())
    cpus = rank.cpus or launch.cpus or []
    switch_user = launch.uid != os.getuid()
    same_file = rank.stderr == rank.stdout
    prefixes = (
        f"switch to uid {launch.uid} gid {launch.gid}: ".encode(),
        encode(f"chdir {rank.cwd!r}: "),
        encode(f"open stdout {rank.stdout!r}: "),
        encode(f"open stderr {rank.stderr!r}: "),
        encode(f"exec {rank.argv[0]!r}: "),
        encode(f"exec {rank.argv[0]!r}: command not found"),
        encode(rank.stderr) if os.path.isabs(rank.stderr) else None,
    )
    return int(_rankexec.spawn(
        argv,
        envp,
        path_dirs,
        [encode(path) for path in procs],
        [encode(f"{JOIN_STAGE} {path!r}: ") for path in procs],
        [int(cpu) for cpu in cpus],
        switch_user,
        launch.uid,
        launch.gid,
        [int(group) for group in launch.groups],
        -1 if launch.umask is None else launch.umask,
        encode(rank.cwd),
        encode(rank.stdout),
        rank.stdout in rank.truncate,
        None if same_file else encode(rank.stderr),
        rank.stderr in rank.truncate,
        error_fd,
        rank.rank,
        prefixes,
    ))
