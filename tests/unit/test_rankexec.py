"""The compiled rank start (nodeagent/supervisor/_rankexec.c, vfork + exec) against the forked one it replaces
(core._become_rank): for each case, both start the same rank in a fresh process and must give the same exit
code, the same reason, the same output files and the same process state (identity, signals, CPUs, umask,
directory, session)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from garrison.nodeagent.supervisor import rankexec

# Optional where it cannot build, never in CI (which has a compiler): a silent skip there would hide a broken build.
pytestmark = pytest.mark.skipif(not rankexec.available() and not os.environ.get("CI"),
                                reason="the compiled _rankexec was not built")

# Runs in a fresh interpreter: start one rank by the named path, wait for it, print what became of it.
STARTER = r"""
import json, os, signal, sys
from garrison.nodeagent.supervisor import core, rankexec
how, document, ignore = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
for number in ignore:
    signal.signal(number, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1, signal.SIGHUP])  # as the supervisor's sigwait does
launch = core.Launch(document)
rank = launch.ranks[0]
procs = document.get("procs")
read_end, write_end = os.pipe()
if how == "vfork":
    assert rankexec.can_spawn(rank)
    pid = rankexec.spawn(rank, launch, write_end, procs)
else:
    pid = os.fork()
    if pid == 0:
        core._become_rank(rank, launch, write_end, core._ignored_signals(), procs)
os.close(write_end)
chunks = []
while chunk := os.read(read_end, 4096):
    chunks.append(chunk)
_, status = os.waitpid(pid, 0)
print(json.dumps({"exit": os.waitstatus_to_exitcode(status), "error": b"".join(chunks).decode()}))
"""

# What a rank that starts reports of itself (one line each, compared between the two paths). Its own status
# is read by the shell itself (a builtin loop): a child such as grep reads it while the shell waits for that
# child, and a shell may block its signals around a fork and a wait (SigBlk fffffffe7ffbfeff, seen once).
REPORT = (
    "id -u; id -g; id -G; pwd; umask; cat; echo \"FOO=$FOO\"; "
    "while IFS= read -r line; do case \"$line\" in SigIgn*|SigBlk*|Cpus_allowed_list*) echo \"$line\";; esac; "
    "done < /proc/$$/status; "
    "ps -o sid= -o pgid= -p $$ | awk -v me=$$ '{print ($1 == me), ($2 == me)}'"
)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """Outside tmp_path, whose parents only root may enter: for ranks run as nobody."""
    directory = Path(tempfile.mkdtemp(prefix="garrison-rankexec-"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory)


def launch_document(tmp_path: Path, **rank: Any) -> dict[str, Any]:
    ranks = {
        "rank": 0, "argv": ["/bin/sh", "-c", REPORT], "env": {"FOO": "bar", "PATH": "/usr/bin:/bin"},
        "cwd": str(tmp_path), "stdout": str(tmp_path / "out"), "stderr": str(tmp_path / "out"),
    }
    ranks.update(rank)
    return {
        "job_id": 1, "attempt": 0, "uid": os.getuid(), "gid": os.getgid(), "groups": [], "user": "u",
        "ranks": [ranks], "kill_wait_s": 1.0, "umask": 0o027,
    }


def start(how: str, document: dict[str, Any], ignore: list[int] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    result = subprocess.run([sys.executable, "-c", STARTER, how, json.dumps(document), json.dumps(list(ignore))],
                            capture_output=True, text=True, timeout=60, check=True)
    return json.loads(result.stdout)


def both(tmp_path: Path, make: Any, ignore: list[int] = ()) -> list[tuple[dict[str, Any], dict[str, str]]]:  # type: ignore[assignment]
    """Each path in a directory of its own, the same case: (outcome, files it left)."""
    results = []
    for how in ("fork", "vfork"):
        directory = tmp_path / how
        directory.mkdir()
        directory.chmod(0o777)
        outcome = start(how, make(directory), ignore)
        files = {path.name: path.read_text().replace(str(directory), "DIR") for path in directory.iterdir()
                 if path.is_file()}
        outcome["error"] = outcome["error"].replace(str(directory), "DIR")
        results.append((outcome, files))
    return results


def test_a_rank_that_starts_is_set_up_alike(tmp_path: Path) -> None:
    fork, vfork = both(tmp_path, lambda d: launch_document(d), ignore=[signal.SIGINT, signal.SIGQUIT])
    assert fork == vfork
    outcome, files = vfork
    assert outcome == {"exit": 0, "error": ""}
    lines = files["out"].splitlines()
    assert lines[:5] == [str(os.getuid()), str(os.getgid()), lines[2], "DIR", "0027"]
    assert "FOO=bar" in lines
    assert lines[-1] == "1 1"  # its own session and process group


def test_a_rank_starts_with_no_signal_ignored_or_blocked(tmp_path: Path) -> None:
    """Ignored dispositions survive exec, and the supervisor blocks the signals it waits for: the rank itself
    (here `cat`, exec'd directly, reading its own status) starts with none ignored and none blocked.

    Save signals 32 and 33, which glibc keeps for itself (thread cancellation, set*id) and whose disposition
    neither path can change through it (sigaction refuses them): they keep whatever the supervisor inherited.
    CI's full run had 32 ignored in pytest's process, from something earlier in it."""
    glibc_internal = (1 << 31) | (1 << 32)  # bit N-1 is signal N
    results = both(tmp_path, lambda d: launch_document(d, argv=["/bin/cat", "/proc/self/status"]),
                   ignore=[signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR2])
    for outcome, files in results:
        assert outcome == {"exit": 0, "error": ""}
        masks = dict(line.split(":\t") for line in files["out"].splitlines() if line.startswith(("SigIgn", "SigBlk")))
        assert int(masks["SigBlk"], 16) == 0, masks
        assert int(masks["SigIgn"], 16) & ~glibc_internal == 0, masks


@pytest.mark.parametrize("case", [
    "command not found", "not executable", "no such path", "no cwd", "no stdout dir", "no stderr dir",
    "cgroup", "separate files truncated", "cpus", "path search",
])
def test_the_two_paths_agree(tmp_path: Path, case: str) -> None:
    def make(directory: Path) -> dict[str, Any]:
        script = directory / "script"
        script.write_text("#!/bin/sh\necho run\n")
        script.chmod(0o644)
        cases: dict[str, dict[str, Any]] = {
            "command not found": {"argv": ["no-such-command-for-garrison"]},
            "not executable": {"argv": [str(script)]},
            "no such path": {"argv": ["./nope"]},
            "no cwd": {"cwd": str(directory / "missing"), "stderr": str(directory / "err")},
            "no stdout dir": {"stdout": str(directory / "missing" / "out"), "stderr": str(directory / "err")},
            "no stderr dir": {"stderr": str(directory / "missing" / "err")},
            "cgroup": {},
            "separate files truncated": {"argv": ["/bin/sh", "-c", "echo o; echo e >&2"], "stderr": str(directory / "err"),
                                         "truncate": [str(directory / "out")]},
            "cpus": {"argv": ["/bin/sh", "-c", "grep Cpus_allowed_list /proc/self/status"], "cpus": [0, 4096]},
            "path search": {"argv": ["sh", "-c", "echo found"], "env": {"PATH": f"{directory}/nothing::/usr/bin:/bin"}},
        }
        rank = cases[case]
        document = launch_document(directory, **rank)
        if case == "cgroup":
            document["procs"] = [str(directory / "no-cgroup" / "cgroup.procs")]
        if case == "separate files truncated":
            (directory / "out").write_text("old\n")
            (directory / "err").write_text("old\n")
        return document

    fork, vfork = both(tmp_path, make)
    assert fork == vfork
    outcome, files = vfork
    expected_exit = {"not executable": 126, "separate files truncated": 0, "cpus": 0, "path search": 0}.get(case, 127)
    assert outcome["exit"] == expected_exit
    if expected_exit:
        assert outcome["error"]  # a reason, and the same one (above)
    if case == "no cwd":
        assert files["err"] == f"garrison: rank 0: {outcome['error']}\n"
    if case == "separate files truncated":
        assert files["out"] == "o\n" and files["err"] == "old\ne\n"
    if case == "cpus":
        assert files["out"].split() == ["Cpus_allowed_list:", "0"]


@pytest.mark.skipif(os.getuid() != 0, reason="switching users needs root")
def test_a_rank_runs_as_its_user_alike(shared_dir: Path) -> None:
    def make(directory: Path) -> dict[str, Any]:
        document = launch_document(directory)
        document.update(uid=65534, gid=65534, groups=[65534])
        return document

    fork, vfork = both(shared_dir, make)
    assert fork == vfork
    lines = vfork[1]["out"].splitlines()
    assert lines[:3] == ["65534", "65534", "65534"]
    owner = (shared_dir / "vfork" / "out").stat()
    assert owner.st_uid == 65534 and stat.S_IMODE(owner.st_mode) == 0o640  # created as the user, with its umask


@pytest.mark.skipif(os.getuid() != 0, reason="switching users needs root")
def test_a_user_cannot_reach_what_it_may_not_alike(shared_dir: Path) -> None:
    def make(directory: Path) -> dict[str, Any]:
        private = directory / "private"
        private.mkdir(mode=0o700)
        document = launch_document(directory, cwd=str(private), stderr=str(directory / "err"))
        document.update(uid=65534, gid=65534, groups=[65534])
        return document

    fork, vfork = both(shared_dir, make)
    assert fork == vfork
    assert vfork[0]["exit"] == 126 and "Permission denied" in vfork[0]["error"]


def test_a_path_search_reports_the_first_error_that_is_not_absence(tmp_path: Path) -> None:
    """os.execvpe's rule: a PATH entry holding the name but not executable wins over the entries without it
    (the path is then shown as a str, where os.execvpe's error shows bytes: the one known difference)."""
    first = tmp_path / "first"
    first.mkdir()
    (first / "tool").write_text("#!/bin/sh\n")
    (first / "tool").chmod(0o644)
    document = launch_document(tmp_path, argv=["tool"], env={"PATH": f"{tmp_path}/none:{first}:/usr/bin"})
    outcome = start("vfork", document)
    assert outcome == {"exit": 126, "error": f"exec '{first}/tool': Permission denied"}


def test_a_nul_in_a_path_leaves_the_rank_to_the_forked_path(tmp_path: Path) -> None:
    """C would end the string at the NUL and use what comes before it; the forked path refuses it, as before."""
    from garrison.nodeagent.supervisor import core

    for field in ("cwd", "stdout", "stderr"):
        document = launch_document(tmp_path, **{field: f"{tmp_path}/a\0b"})
        assert not rankexec.can_spawn(core.Launch(document).ranks[0])
    assert rankexec.can_spawn(core.Launch(launch_document(tmp_path)).ranks[0])
