"""gsub's fast path (cli/fastpath.py -> SubmitCommandLine, controller/rpc/commandline.py) against its full path.

The controller parses a command line sent whole; whatever the command line, the job it submits and the
message it refuses with are the ones gsub's own parse gives (garrison/cmdline/submission.py), and the
controller reads no file: a script is asked for, and read by the client. Then, against a real controller,
the installed launcher: it submits, prints and exits as gsub does, and imports none of the parser.
"""

from __future__ import annotations

import ast
import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from security_helpers import running_controller

from garrison.cmdline.submission import (
    HelpRequested,
    UsageError,
    parse_submission,
    submit_request,
    with_default_output,
)
from garrison.controller.rpc.commandline import Parsed, parse_command_line
from garrison.plainmsg import from_plain
from garrison.protos.v1 import garrison_pb2 as pb
from garrison.wire.convert import InvalidRequest

UMASK = 0o027
SBATCH_DEFAULTS = ("slurm-%j.out", "slurm-%A_%a.out")
SCRIPT = (
    "#!/bin/bash\n#SBATCH -J from-directive\n#SBATCH --gpus-per-node=2 -N 2\n#SBATCH --array=0-9%3\n"
    "#SBATCH --mail-type=END\n#GSUB --time 2:00:00\nsrun hostname\n"
)


def full_path(argv: list[str], environ: dict[str, str], cwd: str, prog: str = "gsub", stdin: bytes | None = None,
              defaults: tuple[str | None, str | None] = (None, None)) -> object:
    """What gsub's own parse makes of the command line: the SubmitJob request, or the message refusing it."""
    try:
        submission = parse_submission(argv, environ, cwd, stdin=(lambda: stdin) if stdin is not None else None,
                                      prog=prog, umask=UMASK)
    except HelpRequested as help_text:  # printed under the command's name (cli/gsub.py's submit)
        return ("help", help_text.text.replace("gsub", prog))
    except UsageError as mistake:
        return ("usage", str(mistake))
    submission = with_default_output(submission, *defaults)
    return (from_plain(submit_request(submission), pb.SubmitJobRequest), submission.ignored, submission.parsable)


def fast_path(argv: list[str], environ: dict[str, str], cwd: str, prog: str = "gsub", stdin: bytes | None = None,
              defaults: tuple[str | None, str | None] = (None, None), asked: list[str] | None = None) -> object:
    """The same command line through SubmitCommandLine, answering its requests for files as the client does."""
    request = pb.SubmitCommandLineRequest(argv=argv, environment=environ, cwd=cwd, umask=UMASK, prog=prog,
                                          default_output=defaults[0] or "", default_array_output=defaults[1] or "",
                                          stdin_readable=stdin is not None)
    for _ in range(3):
        outcome = parse_command_line(request)
        if isinstance(outcome, Parsed):
            return (outcome.request, outcome.submission.ignored, outcome.submission.parsable)
        which = outcome.WhichOneof("outcome")
        if which == "need_script":
            (asked if asked is not None else []).append(outcome.need_script)
            request.script_path = outcome.need_script
            try:
                request.script = Path(outcome.need_script).read_bytes()
            except OSError as error:
                request.script_errno = error.errno or errno.EIO
        elif which == "need_file":
            (asked if asked is not None else []).append(outcome.need_file)
            try:
                request.files[outcome.need_file] = Path(outcome.need_file).read_bytes()
            except OSError as error:
                request.file_errnos[outcome.need_file] = error.errno or errno.EIO
        elif which == "need_stdin":
            assert stdin is not None, "stdin asked for where the client said there is none"
            request.stdin = stdin
        elif which == "help":
            return ("help", outcome.help)
        else:
            return ("usage", outcome.usage_error)
    raise AssertionError("more than two questions for one command line")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "job.sh").write_text(SCRIPT)
    (tmp_path / "dos.sh").write_bytes(b"#!/bin/sh\r\ntrue\r\n")
    (tmp_path / "plain.sh").write_text("#!/bin/sh\necho hi\n")
    (tmp_path / "adir").mkdir()
    (tmp_path / "nodes.txt").write_text("node[1-2]\nnode4\n")
    (tmp_path / "listed.sh").write_text("#!/bin/sh\n#SBATCH --nodefile=nodes.txt\nhostname\n")
    return tmp_path


CASES = [
    ["--wrap", "true"],
    ["-N2", "--gpus-per-node=4", "-t", "1:00:00", "--mem=4G", "-J", "x", "--wrap", "hostname"],
    ["job.sh"],
    ["job.sh", "a", "b c"],
    ["--array", "1-3", "-o", "out-%A_%a.log", "plain.sh"],
    ["-p", "debug", "--export=NONE,FOO=1", "--parsable", "-H", "--wrap", "env"],
    ["--part=debug", "--gres=gpu:a100:2", "-c", "4", "--wrap", "x"],  # getopt-style prefix
    ["-Q", "--mail-user=x@y", "--wrap", "x"],
    ["--bogus", "--wrap", "x"],
    ["-t", "forever", "--wrap", "x"],
    ["missing.sh"],
    ["adir"],
    ["dos.sh"],
    ["plain.sh", "--wrap", "x"],
    ["--wrap", "  "],
    ["--help"],
    [],
    ["-F", "nodes.txt", "--wrap", "x"],
    ["listed.sh"],
    ["-F", "missing.txt", "plain.sh"],
]


@pytest.mark.parametrize("argv", CASES, ids=lambda argv: " ".join(argv) or "(none)")
@pytest.mark.parametrize("prog", ["gsub", "sbatch"])
def test_the_controller_parses_as_gsub_does(workdir: Path, argv: list[str], prog: str) -> None:
    environ = {"PATH": "/usr/bin", "HOME": "/home/u", "SBATCH_ACCOUNT": "physics", "GSUB_QOS": "high"}
    defaults = SBATCH_DEFAULTS if prog == "sbatch" else (None, None)
    assert fast_path(argv, environ, str(workdir), prog, defaults=defaults) == \
        full_path(argv, environ, str(workdir), prog, defaults=defaults)


def test_a_script_on_standard_input_is_asked_for_only_when_needed(workdir: Path) -> None:
    environ = {"PATH": "/usr/bin"}
    script = b"#!/bin/sh\n#SBATCH -J piped\ntrue\n"
    assert fast_path([], environ, str(workdir), stdin=script) == full_path([], environ, str(workdir), stdin=script)
    request = pb.SubmitCommandLineRequest(argv=["--wrap", "x"], environment=environ, cwd=str(workdir), prog="gsub",
                                          stdin_readable=True)
    assert isinstance(parse_command_line(request), Parsed)  # --wrap: standard input is never read
    request = pb.SubmitCommandLineRequest(argv=[], environment=environ, cwd=str(workdir), prog="gsub")
    outcome = parse_command_line(request)  # a terminal: nothing to read, as gsub says
    assert isinstance(outcome, pb.SubmitCommandLineResponse) and "no script given" in outcome.usage_error


def test_the_controller_reads_no_file_and_asks_for_the_script_by_its_full_path(workdir: Path) -> None:
    asked: list[str] = []
    fast_path(["job.sh"], {}, str(workdir), asked=asked)
    assert asked == [str(workdir / "job.sh")]
    # A script sent for another path than the one the parse reached is not taken for it.
    request = pb.SubmitCommandLineRequest(argv=["job.sh"], cwd=str(workdir), prog="gsub",
                                          script_path="/etc/other", script=b"#!/bin/sh\nevil\n")
    outcome = parse_command_line(request)
    assert isinstance(outcome, pb.SubmitCommandLineResponse) and outcome.need_script == str(workdir / "job.sh")
    request = pb.SubmitCommandLineRequest(argv=["/etc/shadow"], cwd=str(workdir), prog="gsub",
                                          script_path="/etc/shadow", script_errno=errno.EACCES)
    outcome = parse_command_line(request)
    assert isinstance(outcome, pb.SubmitCommandLineResponse)
    assert outcome.usage_error == "cannot read script /etc/shadow: Permission denied"


def test_a_node_file_is_asked_for_after_the_script_and_read_by_the_client(workdir: Path) -> None:
    asked: list[str] = []
    outcome = fast_path(["listed.sh"], {}, str(workdir), asked=asked)
    assert asked == [str(workdir / "listed.sh"), str(workdir / "nodes.txt")]
    assert isinstance(outcome, tuple) and list(outcome[0].spec.nodelist) == ["node1", "node2", "node4"]
    # One the client cannot read is refused as the full path refuses it.
    request = pb.SubmitCommandLineRequest(argv=["-F", "/etc/secret", "--wrap", "x"], cwd=str(workdir), prog="gsub",
                                          script_path="/etc/other", file_errnos={"/etc/secret": errno.EACCES})
    refused = parse_command_line(request)
    assert isinstance(refused, pb.SubmitCommandLineResponse)
    assert refused.usage_error == "--nodefile: cannot read /etc/secret: Permission denied"


@pytest.mark.parametrize(("field", "value", "message"), [
    ("prog", "srun", "prog must be one of"),
    ("cwd", "relative/dir", "cwd must be an absolute path"),
    ("umask", 0o1000, "umask must be at most 0777"),
    ("argv", ["x"] * 5000, "too many arguments"),
])
def test_a_malformed_request_is_refused(field: str, value: object, message: str) -> None:
    fields: dict[str, object] = {"argv": ["--wrap", "x"], "cwd": "/tmp", "prog": "gsub", field: value}
    with pytest.raises(InvalidRequest, match=message):
        parse_command_line(pb.SubmitCommandLineRequest(**fields))  # type: ignore[arg-type]


FRAGMENTS = [
    ["-N", "2"], ["-n4"], ["--gpus=3"], ["-G", "1"], ["--gpus-per-node", "8"], ["-t", "30"], ["--time=1-00:00"],
    ["--mem", "10G"], ["--mem-per-gpu=20G"], ["-c", "6"], ["-J", "name"], ["--array=0-4"], ["--array", "1,3,5%1"],
    ["-p", "main"], ["-A", "acct"], ["--qos=low"], ["--nice=10"], ["--dependency=afterok:1"], ["-w", "node[1-2]"],
    ["--exclusive"], ["--no-requeue"], ["--requeue"], ["--signal=B:USR1@60"], ["-o", "o-%j"], ["-e", "e-%j"],
    ["--open-mode=append"], ["--constraint=a100"], ["-x", "node3"], ["--export=ALL,A=1"], ["--comment", "c"],
    ["-D", "sub"], ["--chdir=/abs"], ["--mail-type=ALL"], ["--hint=nomultithread"], ["--ntasks-per-node=2"],
    ["--cpus-per-gpu=4"], ["--launch", "rank"], ["--launch=bogus"], ["-t", "bad"], ["--mem=lots"], ["--gpus=-1"],
    ["--parsable"], ["-H"], ["--wait"], ["--test-only"], ["-Q"], ["--unknown-option"], ["--", "x"],
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chosen=st.lists(st.sampled_from(FRAGMENTS), max_size=6),
       tail=st.sampled_from([["--wrap", "true"], ["job.sh"], ["plain.sh", "arg"], []]),
       prog=st.sampled_from(["gsub", "sbatch"]))
def test_any_command_line_parses_alike_on_both_paths(workdir: Path, chosen: list[list[str]], tail: list[str],
                                                     prog: str) -> None:
    argv = [word for fragment in chosen for word in fragment] + tail
    defaults = SBATCH_DEFAULTS if prog == "sbatch" else (None, None)
    environ = {"PATH": "/usr/bin"}
    assert fast_path(argv, environ, str(workdir), prog, defaults=defaults) == \
        full_path(argv, environ, str(workdir), prog, defaults=defaults)


# ---------------------------------------------------------------------------------------------------------------
# The installed launchers against a real controller


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    root = tmp_path_factory.mktemp("fastpath")
    with running_controller(root, extra="request_rate_per_s = 0\n", local_socket=True) as process:
        yield process


def launcher(name: str) -> str:
    path = Path(sys.executable).parent / name
    assert path.is_file(), f"{path}: not installed (pip install -e . installs bin/{name})"
    return str(path)


def run(controller: object, tmp_path: Path, argv: list[str], stdin: str | None = None,
        extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "GARRISON_CONTROLLER": controller.address, **(extra_env or {})}  # type: ignore[attr-defined]
    return subprocess.run(argv, env=env, cwd=tmp_path, input=stdin, capture_output=True, text=True, timeout=60,
                          stdin=None if stdin is not None else subprocess.DEVNULL)


def get_job(controller: object, job_id: str) -> pb.JobInfo:
    from garrison.cli.client import Client

    with Client(controller.address) as client:  # type: ignore[attr-defined]
        return client.call("GetJob", pb.GetJobRequest(job_id=job_id))  # type: ignore[no-any-return]


def test_the_launchers_submit_print_and_exit_as_gsub_does(controller, tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "job.sh").write_text(SCRIPT)
    gsub, sbatch = launcher("gsub"), launcher("garrison-sbatch")
    first = run(controller, tmp_path, [gsub, "--wrap", "true"])  # learns the local socket (Hello over gRPC)
    assert first.returncode == 0 and first.stdout.startswith("Submitted batch job "), first.stderr

    submitted = run(controller, tmp_path, [gsub, "-p", "main", "job.sh", "arg"])
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stderr == "gsub: warning: ignoring --mail-type: Garrison does not act on it\n"
    job = get_job(controller, submitted.stdout.split()[-1])
    assert job.name == "from-directive" and job.spec.time_limit_s == 7200 and list(job.spec.command) == ["arg"]
    assert job.spec.script == SCRIPT and job.spec.workdir == str(tmp_path)

    parsable = run(controller, tmp_path, [sbatch, "--parsable", "-Q", "--wrap", "true"])
    assert parsable.returncode == 0 and parsable.stderr == "" and parsable.stdout.strip().isdigit()
    assert get_job(controller, parsable.stdout.strip()).spec.output == "slurm-%j.out"

    piped = run(controller, tmp_path, [gsub], stdin="#!/bin/sh\n#SBATCH -J piped\ntrue\n")
    assert piped.returncode == 0, piped.stderr
    assert get_job(controller, piped.stdout.split()[-1]).name == "piped"

    for argv, status, message in (
        ([gsub, "missing.sh"], 2, "gsub: error: script not found: missing.sh\n"),
        ([sbatch, "--bogus"], 1, "sbatch: error: unrecognized arguments: --bogus\n"),
        ([gsub, "--gpus=99999", "--wrap", "x"], 2, None),  # refused by the controller's validation, not the parse
    ):
        refused = run(controller, tmp_path, argv)
        assert refused.returncode == status, refused.stderr
        assert refused.stderr.startswith(argv[0].rsplit("/", 1)[-1].replace("garrison-", "") + ": error: ")
        if message is not None:
            assert refused.stderr == message
    helped = run(controller, tmp_path, [sbatch, "--help"])
    assert helped.returncode == 0 and helped.stdout.startswith("usage: sbatch")


def test_the_script_offered_with_the_first_request_is_only_a_guess(controller, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """gsub sends the first argument that names a ``#!`` file with its first request, so the controller need
    not ask for it; where the parse names another file, that one is asked for and run, never the guess."""
    from garrison.cli.fastpath import _offered_script

    (tmp_path / "job.sh").write_text(SCRIPT)
    (tmp_path / "decoy.sh").write_text("#!/bin/sh\n#SBATCH -J decoy\nfalse\n")
    (tmp_path / "data.txt").write_text("not a script\n")
    assert _offered_script(["-p", "main", "job.sh", "arg"], str(tmp_path)) == {
        "script_path": str(tmp_path / "job.sh"), "script": SCRIPT.encode()}
    assert _offered_script(["data.txt", "--wrap", "true"], str(tmp_path)) == {}
    assert _offered_script(["-J", "nosuch", str(tmp_path / "job.sh")], "/") == {
        "script_path": str(tmp_path / "job.sh"), "script": SCRIPT.encode()}
    gsub = launcher("gsub")
    # -J's value names a script too: the guess is decoy.sh, the job is job.sh's.
    submitted = run(controller, tmp_path, [gsub, "-J", "decoy.sh", "job.sh"])
    assert submitted.returncode == 0, submitted.stderr
    job = get_job(controller, submitted.stdout.split()[-1])
    assert job.spec.script == SCRIPT and job.name == "decoy.sh"


def test_the_launcher_imports_none_of_the_parser(controller, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """What keeps gsub near 20 ms (docs/performance.md): no site, and nothing of the parser, protobuf or re;
    not even os (and its _collections_abc), a quarter of a bare interpreter's start-up."""
    gsub = launcher("gsub")
    run(controller, tmp_path, [gsub, "--wrap", "true"])  # warm the endpoint cache
    timed = run(controller, tmp_path, [gsub, "--wrap", "true"], extra_env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert timed.returncode == 0, timed.stderr
    imported = {line.split("|")[-1].strip() for line in timed.stderr.splitlines() if line.startswith("import time:")}
    assert "garrison.cli.fastpath" in imported
    heavy = {"site", "re", "enum", "argparse", "dataclasses", "garrison.cmdline.submission", "google.protobuf", "grpc",
             "os", "_collections_abc"}
    assert not heavy & imported, sorted(heavy & imported)
    assert os.path.basename(gsub) == "gsub"


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["", "/", "/a", "/a/", "a", "a/b/", "//x"]) | st.text(alphabet="ab/. ", max_size=8),
       st.sampled_from(["", "x", "/x", "x/", "../y"]) | st.text(alphabet="ab/. ", max_size=8))
def test_the_fast_paths_join_is_os_path_join(directory: str, name: str) -> None:
    """cli/fastpath.py does without os (and posixpath): its join is os.path.join, for any two parts."""
    from garrison.cli.fastpath import _join

    assert _join(directory, name) == os.path.join(directory, name)


def test_the_fast_paths_environment_and_home_are_os_s(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Where os is loaded (the full path imports the fast path's module too) its environment is os.environ
    itself, changes included; the home directory is os.path.expanduser's, with and without $HOME; the cache
    directory is made with its parents, and making it again is no error."""
    from garrison.cli import fastpath

    monkeypatch.setenv("GARRISON_TEST_VARIABLE", "set after start-up")
    assert fastpath._environ().get("GARRISON_TEST_VARIABLE") == "set after start-up"
    for home in ("/home/someone/", "/", ""):
        monkeypatch.setenv("HOME", home)
        assert fastpath._home() == os.path.expanduser("~")
    monkeypatch.delenv("HOME")
    assert fastpath._home() == os.path.expanduser("~")
    deep = tmp_path / "a" / "b" / "c"
    fastpath._make_directories(str(deep), 0o700)
    fastpath._make_directories(str(deep), 0o700)
    assert deep.is_dir() and (deep.stat().st_mode & 0o777) == 0o700


def test_without_os_the_environment_is_decoded_as_os_decodes_it(tmp_path: Path) -> None:
    """In a launcher's interpreter (no site, no os) the environment comes from posix's bytes: the same
    strings os.environ holds, undecodable bytes included (surrogateescape)."""
    probe = ("import sys; sys.path[:0] = [sys.argv[1]]; from garrison.cli import fastpath; "
             "env = fastpath._environ(); assert 'os' not in sys.modules; print(ascii(sorted(env.items())))")
    env = {"PATH": "/usr/bin:/bin", "ODD": "caf\udce9", "PLAIN": "x=y"}
    bytes_env = {key.encode(): os.fsencode(value) for key, value in env.items()}
    out = subprocess.run([sys.executable, "-S", "-c", probe, str(Path(__file__).resolve().parents[2])],
                         env=bytes_env, capture_output=True, text=True, timeout=60, check=True).stdout  # type: ignore[arg-type]
    seen = dict(ast.literal_eval(out))
    for key, value in env.items():
        assert seen[key] == value


def test_the_address_from_the_configuration_file_is_cached_until_the_file_changes(controller, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Without GARRISON_CONTROLLER the address is in the configuration file, whose TOML the fast path cannot
    afford to read: the full path caches it (keyed by the file's identity), and a changed file is read again."""
    config = tmp_path / "garrison.toml"
    config.write_text(controller.config.read_text())
    env = {"PATH": "/usr/bin:/bin", "XDG_CACHE_HOME": str(tmp_path / "cache"), "GARRISON_CONFIG": str(config),
           "PYTHONPROFILEIMPORTTIME": "1"}
    gsub = launcher("gsub")

    def submit() -> subprocess.CompletedProcess[str]:
        return subprocess.run([gsub, "--wrap", "true"], env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)

    first, second = submit(), submit()
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert "garrison.config" in first.stderr  # the full path read the file (and learnt the local socket)
    assert "garrison.config" not in second.stderr and "garrison.cli.fastpath" in second.stderr
    # The file changes (here: an address nobody serves): the cached address is not believed any more.
    config.write_text(controller.config.read_text().replace(controller.address, "127.0.0.1:1"))
    moved = submit()
    assert moved.returncode != 0 and "127.0.0.1:1" in moved.stderr


_JSON_VALUES = st.recursive(
    st.booleans() | st.integers(min_value=-(2**63), max_value=2**64) | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(_JSON_VALUES)
def test_the_fast_paths_json_reads_and_writes_as_json_does(value: object) -> None:
    """cli/fastpath.py writes and reads JSON without the json module (it imports re): the same text, the same
    values, any unicode (surrogates included) escaped as json.dumps escapes it."""
    import json

    from garrison.cli.fastpath import _dumps, _loads

    assert _dumps(value) == json.dumps(value, separators=(",", ":"))
    assert _loads(json.dumps({"v": value}).encode()) == {"v": value}


def test_a_loop_past_the_request_rate_waits_instead_of_failing(tmp_path: Path) -> None:
    """A user's shell loop of sbatch never fails on a rate under Slurm. Past the controller's per-user rate
    (here 5/s, bursts of 2) each command waits as the refusal says and asks again (nothing was done by the
    refused request): every submission lands once, on the fast path, the full path and over gRPC alike."""
    import time

    root = tmp_path / "ctl"
    with running_controller(root, extra="request_rate_per_s = 5\nrequest_burst = 2\n", local_socket=True) as ctl:
        started = time.monotonic()
        fast = [run(ctl, tmp_path, [launcher("gsub"), "-H", "--parsable", "--wrap", "true"]) for _ in range(4)]
        full = [run(ctl, tmp_path, [launcher("gsub"), "-H", "--parsable", "--comment", "full", "--wrap", "true"],
                    extra_env={"GARRISON_TRANSPORT": "grpc"}) for _ in range(2)]
        listed = run(ctl, tmp_path, [launcher("garrison-scontrol"), "show", "job"])
        elapsed = time.monotonic() - started
    for done in [*fast, *full, listed]:
        assert done.returncode == 0, done.stderr
    ids = [int(done.stdout) for done in fast + full]
    assert len(set(ids)) == 6
    assert listed.stdout.count("JobId=") == 6  # each submitted once: a refused request did nothing
    requests = len(ids) + 1 + 6  # a request a submission at least; scontrol's ListJobs and a GetJob a job
    assert elapsed >= (requests - 2) / 5 - 0.2  # the rate held them back: past a burst of 2, 5 a second
