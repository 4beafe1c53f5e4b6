"""gsub's argument parsing: the value formats, #GSUB directives, and the Submission they produce."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from garrison.cmdline.parsing import (
    MAX_ARRAY_ELEMENTS,
    ArraySpec,
    UsageError,
    expand_hostlist,
    parse_array,
    parse_begin_time,
    parse_export,
    parse_gpu_request,
    parse_memory_mb,
    parse_submit_time_limit,
    parse_time_limit,
    parse_tres_per_task,
    read_directive_lines,
    read_directives,
)
from garrison.cmdline.submission import HelpRequested, parse_submission
from garrison.model.domain import JobSpec, LaunchMode
from garrison.model.hostlist import compress_hostlist
from garrison.model.jobspec import UNLIMITED_TIME_S
from garrison.model.outputpath import expand_output_pattern

# ---------------------------------------------------------------------------------------------- time


def test_host_lists() -> None:
    assert expand_hostlist("node3, gpu[01-03,7]") == ["node3", "gpu01", "gpu02", "gpu03", "gpu7"]
    assert expand_hostlist("n[9-11]x,n10x") == ["n9x", "n10x", "n11x"]  # padding kept, each name once
    for bad, reason in (("n[3-1]", "'3-1' counts down"), ("n[1-2", "unmatched or nested brackets"),
                        ("n[a]", "'a' is not a number or a range of numbers"),
                        ("n[1]x[2]", "'n[1]x[2]' has more than one bracket"),
                        ("n[0-99999]", "more than 10000 names")):
        with pytest.raises(UsageError) as caught:
            expand_hostlist(bad)
        assert str(caught.value) == f"invalid host list {bad!r}: {reason}"


def test_host_lists_compress_back() -> None:
    names = ["gpu01", "gpu02", "gpu03", "node4", "node3", "node9", "login", "node10", "gpu7"]
    assert compress_hostlist(names) == "gpu7,gpu[01-03],login,node[3-4,9-10]"
    assert sorted(expand_hostlist(compress_hostlist(names))) == sorted(names)
    assert compress_hostlist(["node1"]) == "node1" and compress_hostlist([]) == ""


def test_begin_times() -> None:
    import time

    now = time.mktime((2026, 12, 1, 18, 0, 0, 0, 0, -1))  # 18:00 local time
    assert parse_begin_time("now+90", now) == now + 90
    assert parse_begin_time("now+2hours", now) == now + 7200
    assert parse_begin_time("NOW+1d", now) == now + 86400
    assert parse_begin_time("19:30", now) == now + 5400  # later today
    assert parse_begin_time("17:00:00", now) == now + 23 * 3600  # passed today: tomorrow
    assert parse_begin_time("noon", now) == now + 18 * 3600  # 12:00 has passed: tomorrow's
    assert parse_begin_time("Midnight", now) == now + 6 * 3600
    assert parse_begin_time("today", now) == now - 18 * 3600  # in the past: the job may start now
    assert parse_begin_time("tomorrow", now) == now + 6 * 3600
    assert parse_begin_time("2026-12-24", now) == time.mktime((2026, 12, 24, 0, 0, 0, 0, 0, -1))
    assert parse_begin_time("2026-12-24T08:30", now) == time.mktime((2026, 12, 24, 8, 30, 0, 0, 0, -1))
    # The rest of sbatch's forms (Slurm's parse_time), as real scripts use them.
    assert parse_begin_time("now", now) == now
    assert parse_begin_time("now+3", now + 0.25) == now + 3.25  # not truncated to a whole second
    assert parse_begin_time("now-5", now) == now - 5  # in the past: the job may start now
    assert parse_begin_time("now + 1 hour", now) == now + 3600
    assert parse_begin_time("4:00PM", now) == now + 22 * 3600  # 16:00 has passed: tomorrow's
    assert parse_begin_time("7:30 pm", now) == now + 5400
    assert parse_begin_time("12:00AM", now) == now + 6 * 3600
    assert parse_begin_time("elevenses", now) == now + 17 * 3600
    assert parse_begin_time("Today", now) == parse_begin_time("today", now)
    december_24 = time.mktime((2026, 12, 24, 0, 0, 0, 0, 0, -1))
    for same_day in ("12/24", "12.24", "1224", "12/24/26", "122426"):
        assert parse_begin_time(same_day, now) == december_24
    assert parse_begin_time("11/05", now) == time.mktime((2027, 11, 5, 0, 0, 0, 0, 0, -1))  # passed: next year's
    at_16 = time.mktime((2026, 12, 24, 16, 0, 0, 0, 0, -1))
    for together in ("12/24-16:00", "16:00 12/24", "2026-12-24 16:00", "2026-12-24T16:00:00", "4:00PM 12/24"):
        assert parse_begin_time(together, now) == at_16
    assert parse_begin_time("4:00PM tomorrow", now) == now + 22 * 3600
    assert parse_begin_time("uts1767225600", now) == 1767225600
    for bad in ("someday", "now+", "25:00", "2026-13-01", "02/30", "13:00PM", "-", "12/24 now+", "now+5 parsecs"):
        with pytest.raises(UsageError, match=re.escape(f"invalid begin time '{bad}': expected now[+N")):
            parse_begin_time(bad, now)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30 * 60),  # M
        ("90", 90 * 60),  # the leading field is not bounded
        ("5:30", 5 * 60 + 30),  # M:S
        ("2:03:04", 2 * 3600 + 3 * 60 + 4),  # H:M:S
        ("48:00:00", 48 * 3600),
        ("1-0", 86400),  # D-H
        ("2-12", 2 * 86400 + 12 * 3600),
        ("1-2:30", 86400 + 2 * 3600 + 30 * 60),  # D-H:M
        ("1-2:30:15", 86400 + 2 * 3600 + 30 * 60 + 15),  # D-H:M:S
        ("0:1", 1),
        (" 10 ", 600),
        # No field is bounded, as in Slurm's parser: real scripts write 00:60:00 for an hour.
        ("00:60:00", 3600),
        ("00:00:60", 60),
        ("0:90:00", 90 * 60),
        ("1:75", 60 + 75),
        ("1-24", 2 * 86400),
    ],
)
def test_time_limit_formats(text: str, seconds: int) -> None:
    assert parse_time_limit(text) == seconds
    assert parse_submit_time_limit(text) == seconds


@pytest.mark.parametrize("text", ["UNLIMITED", "unlimited", "INFINITE", "0", " Infinite ", "-1"])
def test_sbatch_takes_an_unlimited_time_as_the_partitions_maximum(text: str) -> None:
    assert parse_submit_time_limit(text) == UNLIMITED_TIME_S
    with pytest.raises(UsageError):
        parse_time_limit(text)  # scontrol's and gadmin's: a number of their own


@pytest.mark.parametrize(
    "text",
    [
        "1:2:3:4",
        "-5",
        "abc",
        "1-",
        "-",
        "",
        "1-2-3",
        "1-1:2:3:4",
        "1:",
        ":1",
        "1::2",
        "1.5",
        "0",
        "0:0",
        "-1",  # sbatch's unlimited, which scontrol and gadmin do not take as a limit
        "UNLIMITED",
        "²",  # a Unicode digit is not an ASCII one
        "99999999999999",
    ],
)
def test_bad_time_limits_are_refused(text: str) -> None:
    with pytest.raises(UsageError, match="time limit"):
        parse_time_limit(text)


# ----------------------------------------------------------------------------------------------- gpus


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", (None, 1)),
        ("8", (None, 8)),
        ("a100:8", ("a100", 8)),
        ("h100-80gb:2", ("h100-80gb", 2)),
        ("A100_SXM4.40:4", ("A100_SXM4.40", 4)),
    ],
)
def test_gpu_requests(text: str, expected: tuple[str | None, int]) -> None:
    assert parse_gpu_request(text) == expected


@pytest.mark.parametrize("text", ["0", "-1", "a100:0", "a100:-2", "a100", ":4", "a:b:4", "x y:1", "", "2.5"])
def test_bad_gpu_requests_are_refused(text: str) -> None:
    with pytest.raises(UsageError):
        parse_gpu_request(text)


# --------------------------------------------------------------------------------------------- memory


@pytest.mark.parametrize(
    ("text", "megabytes"),
    [
        ("512", 512),
        ("512M", 512),
        ("512m", 512),
        ("16G", 16 * 1024),
        ("16g", 16 * 1024),
        ("1T", 1024 * 1024),
        ("2048K", 2),
        ("1K", 1),  # rounds up, never to zero
        ("1025K", 2),
    ],
)
def test_memory_sizes(text: str, megabytes: int) -> None:
    assert parse_memory_mb(text) == megabytes


@pytest.mark.parametrize("text", ["0", "0G", "-1G", "16GiB", "1.5G", "G", "", "16 G", "16X", "99999999T"])
def test_bad_memory_sizes_are_refused(text: str) -> None:
    with pytest.raises(UsageError, match="memory size"):
        parse_memory_mb(text)


# --------------------------------------------------------------------------------------------- arrays


@pytest.mark.parametrize(
    ("text", "indices", "max_running"),
    [
        ("1-5", (1, 2, 3, 4, 5), None),
        ("1,3,5", (1, 3, 5), None),
        ("0-15:4", (0, 4, 8, 12), None),
        ("0-14:4", (0, 4, 8, 12), None),
        ("7", (7,), None),
        ("1-3,10,20-24:2", (1, 2, 3, 10, 20, 22, 24), None),
        ("5,1,3", (1, 3, 5), None),  # ascending whatever the order written
        ("1-3,2-4", (1, 2, 3, 4), None),  # overlaps merge
        ("1-10%2", tuple(range(1, 11)), 2),
    ],
)
def test_arrays(text: str, indices: tuple[int, ...], max_running: int | None) -> None:
    assert parse_array(text) == ArraySpec(indices=indices, max_running=max_running)


def test_large_array_with_limit() -> None:
    spec = parse_array("1-1000%50")
    assert spec.indices == tuple(range(1, 1001))
    assert spec.max_running == 50


def test_array_of_exactly_the_maximum_size_is_accepted() -> None:
    assert len(parse_array(f"0-{MAX_ARRAY_ELEMENTS - 1}").indices) == MAX_ARRAY_ELEMENTS


@pytest.mark.parametrize(
    "text",
    [
        "5-1",
        "",
        "1-x",
        "x",
        "-1",
        "1-",
        "1,,2",
        "1,",
        "0-15:0",
        "0-15:x",
        "5:2",
        "1-10%0",
        "1-10%",
        "1-10%x",
        "%4",
        "1 - 3",
        f"0-{MAX_ARRAY_ELEMENTS}",  # one element too many
        "0-999999999999",  # refused without being expanded
        f"0-{MAX_ARRAY_ELEMENTS // 2},{MAX_ARRAY_ELEMENTS}-{MAX_ARRAY_ELEMENTS * 2}",  # too many in total
    ],
)
def test_bad_arrays_are_refused(text: str) -> None:
    with pytest.raises(UsageError, match="array"):
        parse_array(text)


# ----------------------------------------------------------------------------------------- directives


def test_directives_are_read_from_the_leading_comment_block_only() -> None:
    script = (
        "#!/bin/bash\n"
        "# a comment\n"
        "#GSUB -J train\n"
        "\n"
        "#GSUB --nodes=2 --gpus-per-node a100:8\n"
        "##GSUB --time=5  (switched off)\n"
        "#GSUBX --not-ours\n"
        "  #GSUB --indented  (not at column 0: an ordinary comment)\n"
        "#GSUB\n"
        "echo hello\n"
        "#GSUB --partition=after-the-first-command\n"
    )
    assert read_directive_lines(script) == [
        (3, ["-J", "train"]),
        (5, ["--nodes=2", "--gpus-per-node", "a100:8"]),
    ]
    assert read_directives(script) == ["-J", "train", "--nodes=2", "--gpus-per-node", "a100:8"]


def test_directives_are_shell_split_and_may_carry_a_trailing_comment() -> None:
    script = (
        "#!/bin/sh\n"
        "#GSUB -J 'my job' --output=\"out dir/%j.log\"  # where the logs go\n"
        '#GSUB --error=err\\#1.log --export="A=#x" --comment=\'#1\'\n'
        # As sbatch reads it, an unquoted "#" ends the options even inside a word (a real script's line).
        "#GSUB --begin=2023-10-20T09:00:00# job start time, if it later\n"
        "#GSUB --output=out/hash.log#comment\n"
    )
    assert read_directives(script) == [
        "-J",
        "my job",
        "--output=out dir/%j.log",
        "--error=err#1.log",
        "--export=A=#x",
        "--comment=#1",
        "--begin=2023-10-20T09:00:00",
        "--output=out/hash.log",
    ]


def test_directive_with_an_unclosed_quote_names_its_line() -> None:
    with pytest.raises(UsageError, match="line 2"):
        read_directives("#!/bin/sh\n#GSUB -J 'unclosed\n")


def test_custom_directive_prefix() -> None:
    assert read_directives("#!/bin/sh\n#SBATCH -N 2\n#GSUB -N 3\n", directive="#SBATCH") == ["-N", "2"]


# --------------------------------------------------------------------------------------------- export

ENVIRON = {"HOME": "/home/ada", "PATH": "/usr/bin", "FOO": "current"}


def test_export_all_copies_the_environment() -> None:
    exported = parse_export("ALL", ENVIRON)
    assert exported == ENVIRON
    assert exported is not ENVIRON


def test_export_none_is_empty() -> None:
    assert parse_export("NONE", ENVIRON) == {}


def test_export_all_plus_assignments_overrides_the_copy() -> None:
    assert parse_export("ALL,FOO=1,NEW=2", ENVIRON) == {**ENVIRON, "FOO": "1", "NEW": "2"}
    # Wherever ALL is written, explicit values win.
    assert parse_export("FOO=1,ALL", ENVIRON) == {**ENVIRON, "FOO": "1"}


def test_export_names_alone_copy_their_current_values() -> None:
    assert parse_export("FOO,BAR=2", ENVIRON) == {"FOO": "current", "BAR": "2"}
    assert parse_export("HOME,UNSET_VARIABLE", ENVIRON) == {"HOME": "/home/ada"}


def test_export_values_may_be_empty_contain_equals_or_quoted_commas() -> None:
    assert parse_export('EMPTY=,EQ=a=b,LIST="x,y"', ENVIRON) == {"EMPTY": "", "EQ": "a=b", "LIST": "x,y"}


@pytest.mark.parametrize("text", ["", "FOO,,BAR", "NONE,FOO=1", "1BAD=x", "=x", "A-B=1", 'X="unclosed'])
def test_bad_exports_are_refused(text: str) -> None:
    with pytest.raises(UsageError, match="export"):
        parse_export(text, ENVIRON)


# ------------------------------------------------------------------------------------- output pattern


def _expand(pattern: str, **overrides: object) -> str:
    values: dict[str, object] = {
        "job_id": 42,
        "rank": 3,
        "node_rank": 1,
        "array_job_id": 40,
        "array_task_id": 7,
        "user": "ada",
        "job_name": "train",
    }
    values.update(overrides)
    return expand_output_pattern(pattern, **values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("pattern", "expanded"),
    [
        ("slurm-%j.out", "slurm-42.out"),
        ("%x-%u-%j-%t-%n.log", "train-ada-42-3-1.log"),
        ("%A_%a.out", "40_7.out"),
        ("100%%-%j", "100%-42"),
        ("%%j", "%j"),
        ("%4a-%3t-%02j", "0007-003-42"),
        ("%5x", "train"),  # a width is ignored for a text specifier
        ("%q-%", "%q-%"),  # unknown specifiers and a lone % are left as written
        ("plain.log", "plain.log"),
        # sbatch's %J is the batch step's: the job id alone (ARCCA_Python_Tool's `-o output-%A_%a-%J.o`)
        ("output-%A_%a-%J.o", "output-40_7-42.o"),
    ],
)
def test_output_patterns(pattern: str, expanded: str) -> None:
    assert _expand(pattern) == expanded


def test_output_pattern_node_name_stays_as_written_without_a_node() -> None:
    # gjob and scontrol do not know where a job runs (Slurm's scontrol shows %N as written too)
    assert _expand("%x-%j-%N.out") == "train-42-%N.out"
    assert _expand("%N-%J-%s", node_name="node1", step_id=2) == "node1-42.2-2"


_SPECIFIER = re.compile(r"%(%|([0-9]*)([A-Za-z]))")  # the expansion's rule, as a regular expression


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="%%%0123j4aAtnuxXq-_./é ", max_size=16))
def test_output_patterns_expand_as_the_regular_expression_says(pattern: str) -> None:
    """The hand-written scanner (no re: gjob's import budget) against the rule it implements."""
    values = {"j": "42", "t": "3", "n": "1", "A": "40", "a": "7", "u": "ada", "x": "train"}

    def reference(match: re.Match[str]) -> str:
        if match.group(1) == "%":
            return "%"
        width, letter = match.group(2), match.group(3)
        if letter in "jtnAa":
            return values[letter].zfill(min(int(width), 32) if width else 0)  # the cap on a width
        return values.get(letter, match.group(0))

    assert _expand(pattern) == _SPECIFIER.sub(reference, pattern)


def test_output_pattern_for_a_job_outside_an_array() -> None:
    assert _expand("%A_%a", array_job_id=None, array_task_id=None) == "42_0"


# --------------------------------------------------------------------------------------- submissions


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


def _write_script(directory: Path, body: str, name: str = "job.sh") -> Path:
    path = directory / name
    path.write_text(body)
    return path


def test_script_submission_defaults(workdir: Path) -> None:
    body = "#!/bin/bash\necho hi\n"
    _write_script(workdir, body)
    environ = {"PATH": "/usr/bin", "FOO": "1"}

    submission = parse_submission(["job.sh", "--lr", "0.1", "-N", "5"], environ, str(workdir))

    spec = submission.spec
    assert spec.name == "job.sh"
    assert spec.script == body
    assert spec.command == ("--lr", "0.1", "-N", "5")  # words after the script belong to it
    assert spec.workdir == str(workdir)
    assert spec.env == environ
    assert spec.nodes is None
    assert spec.gpus is None and spec.gpus_per_node is None and spec.gpu_type is None
    assert spec.time_limit_s is None
    assert spec.launch is LaunchMode.SINGLE  # as sbatch: the script runs once, on the first node
    assert spec.requeue is True
    assert spec.max_restarts == 0
    assert submission.array is None
    assert submission.parsable is False
    assert submission.qos is None


def test_nice_alone_means_100_and_takes_only_an_attached_value(workdir: Path) -> None:
    def nice(*argv: str) -> int:
        return parse_submission([*argv, "--wrap", "x"], {}, str(workdir)).spec.nice

    assert nice() == 0 and nice("--nice") == 100 and nice("--nice=5") == 5 and nice("--nice=-20") == -20
    (workdir / "job.sh").write_text("#!/bin/sh\n#GSUB --nice\ntrue\n")
    assert parse_submission(["job.sh"], {}, str(workdir)).spec.nice == 100
    assert parse_submission(["--nice=7", "job.sh"], {}, str(workdir)).spec.nice == 7  # the command line wins
    # As sbatch: a separate word after --nice is not its value but the script.
    with pytest.raises(UsageError, match="script not found: 50"):
        parse_submission(["--nice", "50"], {}, str(workdir))
    for bad in ("--nice=abc", "--nice=", "--nice=99999999999"):
        with pytest.raises(UsageError, match="--nice"):
            nice(bad)


def test_input_environment_variables_sit_between_directives_and_the_command_line(workdir: Path) -> None:
    (workdir / "env.sh").write_text("#!/bin/sh\n#GSUB -A from-script\n#GSUB -p script-part\n#GSUB -t 5\ntrue\n")

    def spec(environ: dict[str, str], *argv: str) -> JobSpec:
        return parse_submission([*argv, "env.sh"], environ, str(workdir)).spec

    environ = {"GSUB_ACCOUNT": "from-env", "SBATCH_TIMELIMIT": "1:00:00", "SBATCH_PARTITION": "sb",
               "GSUB_PARTITION": "gs", "GSUB_QOS": ""}
    chosen = spec(environ)
    assert (chosen.account, chosen.partition, chosen.time_limit_s, chosen.qos) == ("from-env", "gs", 3600, None)
    assert spec(environ, "-A", "cli", "-t", "10").account == "cli" and spec(environ, "-t", "10").time_limit_s == 600
    assert spec({}).account == "from-script"
    with pytest.raises(UsageError) as caught:
        spec({"GSUB_TIMELIMIT": "soon"})
    assert str(caught.value).startswith("$GSUB_TIMELIMIT: --time: ")


def test_sbatchs_other_input_variables_constraint_array_exclusive_requeue_and_wait(workdir: Path) -> None:
    # SBATCH_CONSTRAINT, SBATCH_ARRAY_INX, SBATCH_EXCLUSIVE, SBATCH_REQUEUE/NO_REQUEUE and SBATCH_WAIT, as
    # sbatch's man page lists them (a site's wrapper sets them), under the command line as the others are.
    (workdir / "env.sh").write_text("#!/bin/sh\n#SBATCH -C v100\ntrue\n")
    environ = {"SBATCH_CONSTRAINT": "a100&ib", "SBATCH_ARRAY_INX": "1-3%2", "SBATCH_EXCLUSIVE": "1",
               "SBATCH_NO_REQUEUE": "1", "SBATCH_WAIT": "1"}
    submission = parse_submission(["env.sh"], environ, str(workdir))
    spec = submission.spec
    assert (spec.constraint, spec.exclusive, spec.requeue, submission.wait) == ("a100&ib", True, False, True)
    assert submission.array is not None and submission.array.indices == (1, 2, 3) and spec.array_max_running == 2
    assert parse_submission(["-C", "h100", "env.sh"], environ, str(workdir)).spec.constraint == "h100"
    assert parse_submission(["--requeue", "env.sh"], environ, str(workdir)).spec.requeue is True
    assert parse_submission(["env.sh"], {"SBATCH_EXCLUSIVE": "user"}, str(workdir)).spec.exclusive
    plain = parse_submission(["env.sh"], {"SBATCH_WAIT": ""}, str(workdir))
    assert not plain.wait and not plain.spec.exclusive and plain.spec.constraint == "v100"


def test_wrap_submission(workdir: Path) -> None:
    submission = parse_submission(["--wrap", "nvidia-smi -L && hostname"], {"A": "1"}, str(workdir))
    assert submission.spec.name == "wrap"
    assert submission.spec.script == "#!/bin/sh\nnvidia-smi -L && hostname\n"
    assert submission.spec.command == ()


def test_an_option_takes_the_next_word_even_when_it_begins_with_a_dash(workdir: Path) -> None:
    # As with click and sbatch; only the script's own arguments, after its name, are left alone.
    _write_script(workdir, "#!/bin/sh\ntrue\n")
    submission = parse_submission(["-J", "-dash-", "--output", "-x.out", "job.sh", "-J", "--lr"], {}, str(workdir))
    assert submission.spec.name == "-dash-"
    assert submission.spec.output == "-x.out"
    assert submission.spec.command == ("-J", "--lr")
    wrapped = parse_submission(["--wrap", "-x"], {}, str(workdir))
    assert wrapped.spec.script == "#!/bin/sh\n-x\n"
    with pytest.raises(UsageError, match="argument --wrap: expected one argument"):
        parse_submission(["--wrap"], {}, str(workdir))


def test_every_option_reaches_the_spec(workdir: Path) -> None:
    _write_script(workdir, "#!/bin/sh\ntrue\n")
    environ = {"PATH": "/usr/bin", "SECRET": "s"}
    argv = [
        "-J", "train", "-N", "2", "--gpus-per-node", "h100:8", "--cpus-per-gpu", "12", "--mem", "64G",
        "-t", "1-00:00:00", "-A", "ml", "-p", "gpu", "-q", "high", "-o", "out-%j.log", "-e", "err-%j.log",
        "-D", "sub/../run", "--export", "PATH,MODE=fast", "--array", "0-15:4%2", "--parsable",
        "--launch", "node", "--ntasks-per-node", "4", "--no-requeue", "--max-restarts", "3",
        "job.sh",
    ]  # fmt: skip

    submission = parse_submission(argv, environ, str(workdir))

    spec = submission.spec
    assert spec.name == "train"
    assert spec.nodes == 2
    assert (spec.gpu_type, spec.gpus_per_node, spec.gpus) == ("h100", 8, None)
    assert spec.total_gpus() == 16
    assert spec.cpus_per_gpu == 12
    assert spec.mem_mb == 64 * 1024
    assert spec.time_limit_s == 86400
    assert (spec.account, spec.partition, spec.qos) == ("ml", "gpu", "high")
    assert (spec.output, spec.error) == ("out-%j.log", "err-%j.log")
    assert spec.workdir == str(workdir / "run")
    assert spec.env == {"PATH": "/usr/bin", "MODE": "fast"}
    assert spec.launch is LaunchMode.NODE
    assert spec.ntasks_per_node == 4
    assert spec.requeue is False
    assert spec.max_restarts == 3
    assert submission.array == ArraySpec(indices=(0, 4, 8, 12), max_running=2)
    assert spec.array_max_running == 2
    assert submission.parsable is True
    assert submission.qos == "high"


def test_total_gpus_and_typed_per_node_request_combine(workdir: Path) -> None:
    submission = parse_submission(["-G", "16", "--gpus-per-node", "a100:8", "--wrap", "x"], {}, str(workdir))
    assert (submission.spec.gpus, submission.spec.gpus_per_node, submission.spec.gpu_type) == (16, 8, "a100")


def test_absolute_chdir_and_script_path(workdir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    script = _write_script(elsewhere, "#!/bin/sh\ntrue\n", name="run.sh")
    submission = parse_submission(["-D", "/scratch/x", str(script)], {}, str(workdir))
    assert submission.spec.workdir == "/scratch/x"
    assert submission.spec.name == "run.sh"
    # SLURM_SUBMIT_DIR stays where gsub ran (sbatch's getcwd()); kept on the spec only where -D chose another
    assert submission.spec.submit_dir == str(workdir)
    assert parse_submission([str(script)], {}, str(workdir)).spec.submit_dir is None
    assert parse_submission(["-D", ".", str(script)], {}, str(workdir)).spec.submit_dir is None


def test_directives_apply_and_the_command_line_overrides_them(workdir: Path) -> None:
    _write_script(
        workdir,
        "#!/bin/bash\n"
        "#GSUB -J from-directive\n"
        "#GSUB -N 4 --time=2:00:00\n"
        "#GSUB --no-requeue\n"
        "#GSUB -N 3\n"  # a later directive beats an earlier one
        "python train.py\n"
        "#GSUB --partition=ignored\n",
    )

    from_script = parse_submission(["job.sh"], {}, str(workdir)).spec
    assert (from_script.name, from_script.nodes, from_script.time_limit_s) == ("from-directive", 3, 7200)
    assert from_script.requeue is False
    assert from_script.partition is None

    overridden = parse_submission(["-N", "8", "--requeue", "job.sh"], {}, str(workdir)).spec
    assert (overridden.name, overridden.nodes, overridden.time_limit_s) == ("from-directive", 8, 7200)
    assert overridden.requeue is True


def test_a_bad_directive_value_overridden_on_the_command_line_is_not_an_error(workdir: Path) -> None:
    _write_script(workdir, "#!/bin/sh\n#GSUB --time=abc\ntrue\n")
    assert parse_submission(["-t", "10", "job.sh"], {}, str(workdir)).spec.time_limit_s == 600


def test_unknown_directive_option_names_the_line(workdir: Path) -> None:
    _write_script(workdir, "#!/bin/sh\n#GSUB -N 2\n\n#GSUB --frobnicate\ntrue\n")
    with pytest.raises(UsageError, match=r"^job\.sh line 4: .*--frobnicate"):
        parse_submission(["job.sh"], {}, str(workdir))


def test_bad_directive_value_names_the_line_and_option(workdir: Path) -> None:
    _write_script(workdir, "#!/bin/sh\n#GSUB --nodes 0\ntrue\n")
    with pytest.raises(UsageError, match=r"^job\.sh line 2: --nodes: must be at least 1"):
        parse_submission(["job.sh"], {}, str(workdir))


@pytest.mark.parametrize(
    ("directive", "problem"),
    [
        ("#GSUB -N 2 extra", "unexpected argument"),
        ("#GSUB --wrap hostname", "--wrap"),
        ("#GSUB --help", "--help"),
    ],
)
def test_directives_hold_options_only(workdir: Path, directive: str, problem: str) -> None:
    _write_script(workdir, f"#!/bin/sh\n{directive}\ntrue\n")
    with pytest.raises(UsageError, match=f"line 2: .*{problem}"):
        parse_submission(["job.sh"], {}, str(workdir))


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["-N", "0"], "--nodes"),
        (["-N", "-1"], "--nodes"),
        (["-N", "two"], "--nodes"),
        (["-G", "0"], "--gpus"),
        (["--gpus-per-node", "a100:0"], "--gpus-per-node"),
        (["--cpus-per-gpu", "0"], "--cpus-per-gpu"),
        (["--ntasks-per-node", "0"], "--ntasks-per-node"),
        (["--max-restarts", "-1"], "--max-restarts"),
        (["--mem", "lots"], "--mem"),
        (["-t", "1:2:3:4"], "--time"),
        (["--array", "5-1"], "--array"),
        (["--export", "NONE,X=1"], "--export"),
        (["--launch", "everywhere"], "--launch"),
        (["-J", ""], "--job-name"),
        (["-J", "a\nb"], "--job-name"),
        (["-p", ""], "--partition"),
        (["-G", "a100:1", "--gpus-per-node", "h100:1"], "--gpus-per-node"),
        (["--no-such-option"], "--no-such-option"),
        (["-N"], "-N"),
    ],
)
def test_bad_options_name_the_option_on_one_line(workdir: Path, argv: list[str], problem: str) -> None:
    with pytest.raises(UsageError) as raised:
        parse_submission(["--wrap", "true", *argv], {}, str(workdir))
    message = str(raised.value)
    assert problem in message
    assert "\n" not in message


def test_script_and_wrap_together_is_an_error(workdir: Path) -> None:
    _write_script(workdir, "#!/bin/sh\ntrue\n")
    with pytest.raises(UsageError, match="not both"):
        parse_submission(["--wrap", "hostname", "job.sh"], {}, str(workdir))


def test_neither_script_nor_wrap_is_an_error(workdir: Path) -> None:
    with pytest.raises(UsageError, match="no script"):
        parse_submission(["-N", "2"], {}, str(workdir))


def test_empty_wrap_is_an_error(workdir: Path) -> None:
    with pytest.raises(UsageError, match="--wrap"):
        parse_submission(["--wrap", "  "], {}, str(workdir))


def test_missing_script_is_named(workdir: Path) -> None:
    with pytest.raises(UsageError, match="^script not found: nope.sh$"):
        parse_submission(["nope.sh"], {}, str(workdir))


def test_script_is_resolved_against_cwd_not_chdir(workdir: Path) -> None:
    (workdir / "run").mkdir()
    _write_script(workdir / "run", "#!/bin/sh\ntrue\n")
    with pytest.raises(UsageError, match="script not found"):
        parse_submission(["-D", "run", "job.sh"], {}, str(workdir))


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"#!/bin/sh\n\x00\x01\x02", "binary"),
        (b"#!/bin/sh\necho \xff\xfe\n", "not UTF-8"),
        (b"echo no interpreter line\n", "#!"),
    ],
)
def test_unusable_scripts_are_refused(workdir: Path, content: bytes, problem: str) -> None:
    (workdir / "job.sh").write_bytes(content)
    with pytest.raises(UsageError, match=problem):
        parse_submission(["job.sh"], {}, str(workdir))


def test_directory_as_script_is_refused(workdir: Path) -> None:
    (workdir / "adir").mkdir()
    with pytest.raises(UsageError, match="directory"):
        parse_submission(["adir"], {}, str(workdir))


def test_help_is_returned_not_printed(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(HelpRequested) as raised:
        parse_submission(["--help"], {}, str(workdir))
    assert "--gpus-per-node" in raised.value.text
    assert capsys.readouterr().out == ""


def test_usage_error_exit_status_is_two() -> None:
    assert UsageError.exit_status == 2


# ------------------------------------------------------------------------------------- sbatch scripts


def test_sbatch_directives_are_read_and_gsub_directives_beat_them(workdir: Path) -> None:
    _write_script(
        workdir,
        "#!/bin/bash\n"
        "#SBATCH --job-name=from-sbatch\n"
        "#SBATCH -N 2 --time=1:00:00\n"
        "#SBATCH -A sbatch-account\n"
        "#GSUB -A gsub-account\n"
        "#SBATCHX -N 9\n"  # some other tool's comment
        "##SBATCH -N 7\n"  # switched off, the usual way
        "srun python train.py\n"
        "#SBATCH -N 5\n",  # after the first command: not a directive, as in sbatch
    )
    spec = parse_submission(["job.sh"], {}, str(workdir)).spec
    assert (spec.name, spec.nodes, spec.time_limit_s, spec.account) == ("from-sbatch", 2, 3600, "gsub-account")
    # Input variables beat both kinds of directive; the command line beats everything.
    assert parse_submission(["job.sh"], {"SBATCH_ACCOUNT": "env"}, str(workdir)).spec.account == "env"
    assert parse_submission(["-A", "cli", "job.sh"], {"SBATCH_ACCOUNT": "env"}, str(workdir)).spec.account == "cli"


def test_a_gsub_directive_beats_an_sbatch_one_whatever_the_line_order(workdir: Path) -> None:
    _write_script(workdir, "#!/bin/sh\n#GSUB -t 5\n#SBATCH -t 10\ntrue\n")
    assert parse_submission(["job.sh"], {}, str(workdir)).spec.time_limit_s == 300


def test_a_bad_sbatch_directive_names_its_line(workdir: Path) -> None:
    _write_script(workdir, "#!/bin/sh\n#SBATCH --frobnicate=1\ntrue\n")
    with pytest.raises(UsageError, match=r"^job\.sh line 2: .*--frobnicate"):
        parse_submission(["job.sh"], {}, str(workdir))


def test_a_bad_directive_quotes_at_most_a_hundred_characters_of_it(workdir: Path) -> None:
    _write_script(workdir, "#!/bin/sh\n#SBATCH --time=" + "9" * 5000 + "x\ntrue\n")
    with pytest.raises(UsageError) as caught:
        parse_submission(["job.sh"], {}, str(workdir))
    message = str(caught.value)
    assert message.startswith("job.sh line 2: --time:") and "\n" not in message
    assert len(message) < 250 and "9" * 100 in message and "9" * 101 not in message


def test_a_script_on_standard_input_is_read_with_its_directives(workdir: Path) -> None:
    body = b"#!/bin/bash\n#SBATCH -N 2\n#SBATCH --job-name=piped\nhostname\n"
    spec = parse_submission(["-t", "5"], {}, str(workdir), stdin=lambda: body).spec
    assert (spec.script, spec.nodes, spec.name, spec.time_limit_s) == (body.decode(), 2, "piped", 300)
    unnamed = parse_submission([], {}, str(workdir), stdin=lambda: b"#!/bin/sh\ntrue\n").spec
    assert unnamed.name == "gsub"
    with pytest.raises(UsageError, match="no script given"):
        parse_submission([], {}, str(workdir), stdin=lambda: b"")
    with pytest.raises(UsageError, match="standard input"):
        parse_submission([], {}, str(workdir), stdin=lambda: b"echo no interpreter\n")
    with pytest.raises(UsageError, match="no script given"):
        parse_submission([], {}, str(workdir))  # a terminal: nothing is read


def test_a_script_with_dos_line_breaks_is_refused(workdir: Path) -> None:
    _write_script(workdir, "#!/bin/bash\r\n#SBATCH -N 1\r\necho hi\r\n")
    with pytest.raises(UsageError, match=r"DOS line breaks .*job\.sh") as caught:
        parse_submission(["job.sh"], {}, str(workdir))
    assert "\n" not in str(caught.value)
    with pytest.raises(UsageError, match="DOS line breaks"):
        parse_submission([], {}, str(workdir), stdin=lambda: b"#!/bin/sh\r\ntrue\r\n")


def test_sbatch_options_garrison_does_not_act_on_are_accepted_and_named(workdir: Path) -> None:
    _write_script(
        workdir,
        "#!/bin/sh\n#SBATCH --mail-type=END,FAIL\n#SBATCH --mail-user=a@b.c\n#SBATCH --hint=nomultithread\n"
        "#SBATCH -L scratch:1\n#SBATCH --wckey=x --comment='a note'\ntrue\n",
    )
    submission = parse_submission(["--oversubscribe", "job.sh"], {}, str(workdir))
    assert submission.ignored == ("--mail-type", "--mail-user", "--hint", "--licenses", "--wckey",
                                  "--oversubscribe")
    assert submission.spec.comment == "a note"  # --comment has a place: stored, not ignored
    assert parse_submission(["--wrap", "x"], {}, str(workdir)).ignored == ()
    # Unknown options stay errors that name them.
    with pytest.raises(UsageError, match="--mail-typo"):
        parse_submission(["--mail-typo=END", "--wrap", "x"], {}, str(workdir))


def test_ignored_sbatch_options_take_their_values_in_every_spelling(workdir: Path) -> None:
    submission = parse_submission(["--mail-type", "END", "-Lscratch:1", "-M", "other", "-v", "-N", "2",
                                   "--wrap", "x"], {}, str(workdir))
    assert submission.ignored == ("--mail-type", "--licenses", "--clusters", "--verbose")
    assert submission.spec.nodes == 2  # the words around them are read as before
    with pytest.raises(UsageError, match="--mail-user: expected one argument"):
        parse_submission(["--wrap", "x", "--mail-user"], {}, str(workdir))


def test_node_selection_options_from_sbatch_directives_and_the_command_line(workdir: Path) -> None:
    (workdir / "select.sh").write_text(
        "#!/bin/bash\n#SBATCH -C a100&ib\n#SBATCH -w gpu[01-02]\n#SBATCH --exclusive\n#SBATCH -N 3\nsrun x\n"
    )
    spec = parse_submission(["select.sh"], {}, str(workdir)).spec
    assert (spec.constraint, spec.nodelist, spec.exclusive, spec.nodes) == ("a100&ib", ("gpu01", "gpu02"), True, 3)
    override = parse_submission(["--constraint", "v100|h100", "--nodelist=n7", "select.sh"], {}, str(workdir)).spec
    assert (override.constraint, override.nodelist) == ("v100|h100", ("n7",))
    plain = parse_submission(["--wrap", "x"], {}, str(workdir)).spec
    assert (plain.constraint, plain.nodelist, plain.exclusive) == (None, (), False)
    assert parse_submission(["--exclusive=user", "--wrap", "x"], {}, str(workdir)).spec.exclusive is True
    for bad, problem in ((["-C", "a100&"], "--constraint"), (["-w", "gpu[1-"], "host list"),
                         (["--exclusive=everyone"], "--exclusive")):
        with pytest.raises(UsageError, match=re.escape(problem)):
            parse_submission([*bad, "--wrap", "x"], {}, str(workdir))


def test_gsub_never_exports_garrisons_own_credentials(workdir: Path) -> None:
    """A token in a job's environment would be on disk on its nodes and in the queue (issue 20)."""
    environ = {"GARRISON_TOKEN": "v1.secret.signature", "GARRISON_TOKEN_FILE": "/home/a/.config/garrison/token",
               "HOME": "/home/a"}
    for export in ([], ["--export", "ALL"], ["--export", "ALL,GARRISON_TOKEN"], ["--export", "GARRISON_TOKEN=x"]):
        env = parse_submission([*export, "--wrap", "true"], environ, str(workdir)).spec.env
        assert "GARRISON_TOKEN" not in env, export
    assert parse_submission(["--wrap", "true"], environ, str(workdir)).spec.env["HOME"] == "/home/a"


def test_a_long_options_unique_prefix_stands_for_it_as_with_getopt(tmp_path: Path) -> None:
    # sbatch reads its options with getopt_long: real scripts write --depend, for one.
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --ntasks-per-n=2 --time 5\ntrue\n")
    spec = parse_submission(["--depend=afterok:7", "--exclus", "--gpus-per-n", "4", "job.sh", "--depend"], {},
                            str(tmp_path)).spec
    assert (spec.dependency, spec.exclusive, spec.gpus_per_node) == ("afterok:7", True, 4)
    assert (spec.ntasks_per_node, spec.time_limit_s, spec.command) == (2, 300, ("--depend",))  # the script's own
    assert parse_submission(["--gpus", "2", "job.sh"], {}, str(tmp_path)).spec.gpus == 2  # exact beats a prefix
    with pytest.raises(UsageError, match="--cpus is ambiguous: --cpus-per-gpu, --cpus-per-task"):
        parse_submission(["--cpus=2", "job.sh"], {}, str(tmp_path))
    with pytest.raises(UsageError, match="--tim is ambiguous: --time, --time-min"):  # as sbatch finds it
        parse_submission(["--tim=5", "job.sh"], {}, str(tmp_path))


def test_gpus_per_task_takes_a_type_as_sbatch_does(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH -n 4\n#SBATCH --gpus-per-task=a100-80gb:1\ntrue\n")
    spec = parse_submission(["job.sh"], {}, str(tmp_path)).spec
    assert (spec.gpu_type, spec.gpus_per_task, spec.ntasks) == ("a100-80gb", 1, 4)
    assert parse_submission(["-n", "2", "--gpus-per-task", "2", "job.sh"], {}, str(tmp_path)).spec.gpus_per_task == 2
    with pytest.raises(UsageError, match="differs"):
        parse_submission(["--gpus-per-task=v100:1", "--gpus=a100:4", "job.sh"], {}, str(tmp_path))
    with pytest.raises(UsageError, match="--gpus-per-task"):
        parse_submission(["--gpus-per-task=0", "job.sh"], {}, str(tmp_path))


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab-_.0123456789\u00b2\u0663\u00e9["), max_size=10))
def test_host_names_split_before_their_number_as_the_pattern_splits_them(name: str) -> None:
    """compress_hostlist splits a name before the decimal digits it ends in without re (scontrol starts lean):
    as re.fullmatch(r"(.*?)(\\d+)") split it, Unicode decimal digits included, superscripts not; and
    expand_hostlist's ranges take ASCII digits only, as its [0-9]+ did."""
    from garrison.model.hostlist import _ascii_digits, trailing_number

    match = re.fullmatch(r"(.*?)(\d+)", name)
    assert trailing_number(name) == (match.groups() if match else None)
    assert _ascii_digits(name) == (re.fullmatch("[0-9]+", name) is not None)


@pytest.mark.parametrize(("text", "expected"), [
    ("cpu=4", (4, None)), ("cpu:4", (4, None)), ("gres/gpu=2", (None, "2")), ("gres/gpu:2", (None, "2")),
    ("gres/gpu:a100=2", (None, "a100:2")), ("gres/gpu:a100:2", (None, "a100:2")), ("gres:gpu:1", (None, "1")),
    ("gres/gpu", (None, "1")), ("cpu=8,gres/gpu:h100=1", (8, "h100:1")), ("GRES/GPU=1", (None, "1")),
])
def test_tres_per_task(text: str, expected: tuple[int | None, str | None]) -> None:
    assert parse_tres_per_task(text) == expected


@pytest.mark.parametrize("text", ["", "cpu", "cpu=0", "cpu=1,cpu=2", "gres/gpu=1,gres/gpu=1", "license/x=1",
                                  "mem=4G", "gres/shard=1", "cpu=1,", "gres/gpu:a100=x"])
def test_bad_tres_per_task_is_refused(text: str) -> None:
    with pytest.raises(UsageError):
        parse_tres_per_task(text)


def test_tres_per_task_is_c_and_gpus_per_task_as_to_sbatch(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH -n 2\n#SBATCH --tres-per-task=cpu=4,gres/gpu:a100=1\ntrue\n")
    spec = parse_submission(["job.sh"], {}, str(tmp_path)).spec
    assert (spec.cpus_per_task, spec.gpus_per_task, spec.gpu_type) == (4, 1, "a100")
    # The command line overrides a directive, whichever of the two spellings each uses.
    assert parse_submission(["-c", "2", "job.sh"], {}, str(tmp_path)).spec.cpus_per_task == 2
    spec = parse_submission(["job.sh"], {"SBATCH_TRES_PER_TASK": "cpu=6"}, str(tmp_path)).spec
    assert (spec.cpus_per_task, spec.gpus_per_task) == (6, None)
    assert parse_submission(["--tres-per-task=cpu=2", "-c", "2", "job.sh"], {}, str(tmp_path)).spec.cpus_per_task == 2
    with pytest.raises(UsageError, match="--tres-per-task: 'cpu=2' conflicts with --cpus-per-task 3"):
        parse_submission(["--tres-per-task=cpu=2", "-c", "3", "job.sh"], {}, str(tmp_path))
    script.write_text("#!/bin/bash\n#SBATCH -c 2\n#SBATCH --tres-per-task=cpu=4\ntrue\n")
    with pytest.raises(UsageError, match="job.sh line 3: --tres-per-task"):
        parse_submission(["job.sh"], {}, str(tmp_path))


def test_an_sbatch_option_gsub_lacks_is_named_as_sbatch_s(tmp_path: Path) -> None:
    (tmp_path / "job.sh").write_text("#!/bin/bash\n#SBATCH --export-file=vars\ntrue\n")
    with pytest.raises(UsageError, match="job.sh line 2: --export-file: sbatch's option is not supported by gsub"):
        parse_submission(["job.sh"], {}, str(tmp_path))
    with pytest.raises(UsageError, match="--bbf: sbatch's option"):
        parse_submission(["--bbf=stage.conf", "--wrap", "true"], {}, str(tmp_path))


def test_gpus_per_socket_times_sockets_per_node_is_gpus_per_node(tmp_path: Path) -> None:
    # A real cluster's template: one socket's two GPUs.
    (tmp_path / "job.sh").write_text("#!/bin/bash\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-socket=2\n"
                                     "#SBATCH --sockets-per-node=1\ntrue\n")
    submission = parse_submission(["job.sh"], {}, str(tmp_path))
    assert (submission.spec.gpus_per_node, submission.ignored) == (2, ())
    spec = parse_submission(["--gpus-per-socket=a100:2", "--sockets-per-node=2", "--wrap", "x"], {}, "/").spec
    assert (spec.gpus_per_node, spec.gpu_type) == (4, "a100")
    # The same count given as --gpus-per-node too is one request; another is a conflict.
    assert parse_submission(["--gpus-per-node=4", "--gpus-per-socket=2", "--sockets-per-node=2", "--wrap", "x"], {},
                            "/").spec.gpus_per_node == 4
    with pytest.raises(UsageError, match="conflicts with --gpus-per-node 8"):
        parse_submission(["--gpus-per-node=8", "--gpus-per-socket=2", "--sockets-per-node=2", "--wrap", "x"], {}, "/")
    with pytest.raises(UsageError, match="--gpus-per-socket: needs --sockets-per-node"):  # as Slurm requires
        parse_submission(["--gpus-per-socket=2", "--wrap", "x"], {}, "/")
    # Alone, --sockets-per-node is accepted and named as not acted on.
    assert parse_submission(["--sockets-per-node=2", "--wrap", "x"], {}, "/").ignored == ("--sockets-per-node",)


@pytest.mark.parametrize("given", [["--input=none"], ["-i", "/dev/null"], ["--input", "none"]])
def test_input_none_is_what_a_batch_script_reads_anyway(given: list[str]) -> None:
    assert parse_submission([*given, "--wrap", "x"], {}, "/").spec.command == ()


def test_an_input_file_is_refused_in_one_line() -> None:
    with pytest.raises(UsageError, match="--input: 'data.txt': only none is taken"):
        parse_submission(["--input=data.txt", "--wrap", "x"], {}, "/")


@pytest.mark.parametrize(("gres", "per_node", "gpu_mem_mb"), [
    ("gpu:1,vmem:10G", 1, 10240), ("gpu:1,VRAM:12G", 1, 12288), ("gpu:a100:2,gpu_mem:48000", 2, 48000),
    ("gpu:1,gpumem:11G", 1, 11264), ("gpu:2,VramPerGpu:20G", 2, 20480),
])
def test_a_sites_gpu_memory_gres_is_gpu_mem(gres: str, per_node: int, gpu_mem_mb: int) -> None:
    spec = parse_submission([f"--gres={gres}", "--wrap", "x"], {}, "/").spec
    assert (spec.gpus_per_node, spec.gpu_mem_mb) == (per_node, gpu_mem_mb)


def test_gpu_memory_gres_gives_way_to_gpu_mem_and_is_checked(tmp_path: Path) -> None:
    (tmp_path / "job.sh").write_text("#!/bin/bash\n#SBATCH --gres=gpu:1,vmem:10G\ntrue\n")
    assert parse_submission(["--gpu-mem=20G", "job.sh"], {}, str(tmp_path)).spec.gpu_mem_mb == 20480
    alone = parse_submission(["--gres=vmem:3g", "-G", "1", "--wrap", "x"], {}, "/").spec
    assert (alone.gpus, alone.gpus_per_node, alone.gpu_mem_mb) == (1, None, 3072)
    with pytest.raises(UsageError, match="vmem takes a memory size"):
        parse_submission(["--gres=gpu:1,vmem:lots", "--wrap", "x"], {}, "/")
    with pytest.raises(UsageError, match="unknown generic resource 'tmpfs'"):  # other resources stay refused
        parse_submission(["--gres=gpu:1,tmpfs:100G", "--wrap", "x"], {}, "/")


def test_a_node_file_is_a_node_list(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("node[1-2]\nnode4 node3,node3\n")
    (tmp_path / "job.sh").write_text("#!/bin/sh\n#SBATCH -F hosts\ntrue\n")
    assert parse_submission(["job.sh"], {}, str(tmp_path)).spec.nodelist == ("node1", "node2", "node4", "node3")
    assert parse_submission(["-w", "node9", "job.sh"], {}, str(tmp_path)).spec.nodelist == ("node9",)  # higher
    for argv, message in ((["-F", "missing", "--wrap", "x"], "--nodefile: no such file: missing"),
                          (["-F", "hosts", "-w", "node1", "--wrap", "x"], "give either --nodelist or --nodefile"),
                          (["--nodefile=/dev/null", "--wrap", "x"], "/dev/null names no node")):
        with pytest.raises(UsageError, match=message):
            parse_submission(argv, {}, str(tmp_path))
