"""gsub's and srun's parsers on arbitrary option lines: every input is a job or a one-line UsageError, never a
traceback. Hypothesis draws options from Slurm's own option table (garrison/cmdline/slurm_names.py), both
spellings (``--opt=value``, ``--opt value``, ``-Xvalue``), in directives and on the command line, with values
chosen to break parsers ("--", empty, huge, unclosed host lists, NUL, non-ASCII)."""

from __future__ import annotations

import contextlib
import io

from hypothesis import given, settings
from hypothesis import strategies as st

from garrison.cli import gsrun
from garrison.cmdline.argparser import UsageError
from garrison.cmdline.slurm_names import SBATCH_OPTION_NAMES, SRUN_OPTION_NAMES
from garrison.cmdline.submission import HelpRequested, parse_submission

SHORT = list("JtApqoeDadHbxNGncCwWSskOmBLMiFQvI")
VALUES = ["", "0", "1", "-1", "99999999999999999999", "1-3", "a,b", "gpu:0", "none", "gpu:a100:2", "10:00",
          "1-00:00:00", "now+1h", "afterok:1", "%j", "x" * 300, "é", "\x00", "1G", "0-5%2", "[a|b]", "USR1@60", ":",
          "=", "--", "-", "a b", "1.5", "node[1-", "node[3-1]", "1,", ",1", "single:0", "map_gpu:"]


def option_words(names: list[str]) -> st.SearchStrategy[list[str]]:
    def spelled(name: str, value: str, attached: bool) -> list[str]:
        flag = ("-" if len(name) == 1 else "--") + name
        if attached:
            return [f"{flag}{value}" if len(name) == 1 else f"{flag}={value}"]
        return [flag, value]

    one = st.builds(spelled, st.sampled_from(names), st.sampled_from(VALUES), st.booleans())
    return st.lists(one, min_size=1, max_size=4).map(lambda parts: [w for part in parts for w in part])


@settings(max_examples=200, deadline=None)
@given(option_words(sorted(SBATCH_OPTION_NAMES) + SHORT), st.integers(0, 8), st.integers(0, 8))
def test_any_sbatch_line_is_a_job_or_a_one_line_error(words: list[str], in_script: int, on_line: int) -> None:
    script = "#!/bin/bash\n" + "".join(f"#SBATCH {word}\n" for word in words[:in_script]) + "true\n"
    argv = [*words[min(on_line, len(words)):], "job.sh"]
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            parse_submission(argv, {}, "/tmp", read_file=lambda _path: script.encode())
    except UsageError as problem:
        assert "\n" not in str(problem)
    except HelpRequested:
        pass


@settings(max_examples=200, deadline=None)
@given(option_words(sorted(SRUN_OPTION_NAMES) + list("NnGcwJDtpAqoeKluiWmTQvXEkOsCgB")),
       st.sampled_from([{}, {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_GPUS_ON_NODE": "4"},
                        {"SLURM_JOB_ID": "7", "SRUN_CPUS_PER_TASK": "x", "SLURM_NTASKS": "0"}]))
def test_any_srun_line_is_a_step_or_a_one_line_error(words: list[str], environ: dict[str, str]) -> None:
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            parser = gsrun._parser()
            gsrun.build_spec(parser.parse_args([*words, "true"]), dict(environ))
    except UsageError as problem:
        assert "\n" not in str(problem)
    except SystemExit as done:  # --help
        assert done.code == 0


def test_a_double_dash_is_an_options_value_as_getopt_takes_it() -> None:
    # argparse dropped it ("--time=--" left --time an empty list, and gsub died of an assertion).
    script = b"#!/bin/bash\ntrue\n"
    submission = parse_submission(["-o", "--", "--wrap", "--"], {}, "/tmp", read_file=lambda _path: script)
    assert submission.spec.output == "--" and submission.spec.script == "#!/bin/sh\n--\n"
    for argv in (["--time=--", "job.sh"], ["-x--", "job.sh"]):
        try:
            parse_submission(argv, {}, "/tmp", read_file=lambda _path: script)
        except UsageError as problem:
            assert "--" in str(problem) and "\n" not in str(problem)
