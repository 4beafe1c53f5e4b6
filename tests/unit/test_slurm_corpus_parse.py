"""Real sbatch scripts and srun lines through gsub's and srun's parsers, without a cluster.

tests/data/slurm_corpus/parse_only.toml names the scripts (rewrites of public ones) and what Slurm makes of
them; every script of the full-run corpus (MANIFEST.toml, run end to end by tests/e2e/test_slurm_corpus.py as
root only) is parsed here too, so a parser change that breaks one fails every `make test`. The option-name
tests hold gsub and srun to Slurm's own option table (garrison/cmdline/slurm_names.py): a name Slurm knows
is never read as a different option by getopt's prefix rule, the cause of `sbatch --tasks=14` once failing and
of `--extra` once being taken for `--extra-node-info`.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest

from garrison.cli import gsrun
from garrison.cmdline.argparser import Parser, UsageError
from garrison.cmdline.parsing import parse_constraint_text, parse_node_count, slurm_dependency
from garrison.cmdline.slurm_names import SBATCH_OPTION_NAMES, SRUN_OPTION_NAMES
from garrison.cmdline.submission import _gsub_parser, parse_submission
from garrison.model.resources import resolve

DATA = Path(__file__).resolve().parents[1] / "data"
CORPUS = DATA / "slurm_corpus"
PARSE_ONLY: list[dict[str, Any]] = tomllib.loads((CORPUS / "parse_only.toml").read_text())["script"]
SLURM_OPTIONS = {"sbatch": SBATCH_OPTION_NAMES, "srun": SRUN_OPTION_NAMES}
ENVIRON = {"HOME": "/home/ann", "USER": "ann", "PATH": "/usr/bin"}
# Names Slurm gives one option twice: each stands for the other, as getopt_long's same `val` makes them.
# Names Slurm gives one meaning under two options: --ntasks-per-tres is --ntasks-per-gpu (sbatch's manual says so).
SLURM_ALIASES = {"--tasks-per-node": "--ntasks-per-node", "--cluster": "--clusters", "--cpu_bind": "--cpu-bind",
                 "--ntasks-per-tres": "--ntasks-per-gpu"}


def srun_lines(script: str, environ: dict[str, str]) -> list[list[str]]:
    """The words after ``srun`` of each line that runs it, as the batch shell would pass them: continuation
    lines joined, ``$VAR``/``${VAR}`` from ``environ``, a command substitution as a node name."""
    found = []
    for line in script.replace("\\\n", " ").splitlines():
        words = line.strip()
        if not words.startswith("srun "):
            continue
        words = re.sub(r"\$\(.*?\)", "node1", words.rstrip("& "))
        words = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}?",
                       lambda m: environ.get(m.group(1), m.group(2) or ""), words)
        found.append(shlex.split(words)[1:])
    return found


@pytest.mark.parametrize("entry", PARSE_ONLY, ids=[entry["file"] for entry in PARSE_ONLY])
def test_real_scripts_mean_what_they_mean_under_slurm(entry: dict[str, Any]) -> None:
    path = CORPUS / entry["file"]
    submission = parse_submission([str(path)], ENVIRON, str(path.parent))
    spec = resolve(submission.spec)
    assert {name: getattr(spec, name) for name in entry["expect"]} == entry["expect"]
    assert sorted(submission.ignored) == sorted(entry["ignored"])

    ignored_by_srun: set[str] = set()
    for words in srun_lines(path.read_text(), entry.get("env", {})):
        parser = gsrun._parser()
        args = parser.parse_args(words)
        gsrun.build_spec(args, dict(entry.get("env", {})))
        ignored_by_srun.update(parser.ignored)
    assert sorted(ignored_by_srun) == sorted(entry.get("srun_ignored", []))


FULL_RUN_SCRIPTS = sorted(path for path in CORPUS.rglob("*") if path.is_file() and "harness" not in path.parts
                          and path.suffix in (".sh", ".slurm") and "parse_only" not in path.parts
                          and "#SBATCH" in path.read_text())


@pytest.mark.parametrize("path", FULL_RUN_SCRIPTS, ids=[str(path.relative_to(CORPUS)) for path in FULL_RUN_SCRIPTS])
def test_every_full_run_corpus_script_parses(path: Path) -> None:
    submission = parse_submission([str(path)], ENVIRON, str(path.parent))
    resolve(submission.spec)


def _reading(parser: Parser, name: str) -> str | None:
    """The option ``--name`` stands for in ``parser`` (None: it does not know it), prefix rule included."""
    try:
        word = parser._unabbreviated(f"--{name}")
    except UsageError:
        return None  # ambiguous among our names: refused, as an unknown option would be
    known = {flag for action in parser._actions for flag in action.option_strings}
    known |= {*parser.ignored_values, *parser.ignored_flags, *parser.bare_values}
    return word if word in known else None


@pytest.mark.parametrize("command", ["sbatch", "srun"])
def test_no_slurm_option_name_is_read_as_another_option(command: str) -> None:
    parser = _gsub_parser() if command == "sbatch" else gsrun._parser()
    misread = {}
    for name in sorted(SLURM_OPTIONS[command]):
        reading = _reading(parser, name)
        if reading is not None and reading != f"--{name}" and SLURM_ALIASES.get(f"--{name}") != reading:
            misread[name] = reading
    assert misread == {}


def test_sbatch_options_found_in_real_scripts_are_known() -> None:
    # Each of these failed a real script as an unknown option (parse_only.toml names them).
    parser = _gsub_parser()
    for name in ("wait-all-nodes", "ntasks-per-core", "ntasks-per-socket", "gres-flags", "tasks-per-node", "prefer",
                 "time-min", "extra"):
        assert _reading(parser, name) is not None, name


def test_srun_options_found_in_real_scripts_are_accepted_with_a_warning() -> None:
    parser = gsrun._parser()
    args = parser.parse_args(["--exclusive", "--mpi=pmix", "--overlap", "-k", "--cpu_bind=verbose,cores",
                              "--hint", "nomultithread", "-n", "4", "python", "--exclusive", "train.py"])
    assert parser.ignored == ["--exclusive", "--mpi", "--overlap", "--no-kill", "--hint"]
    assert args.ntasks == 4 and args.command == ["python", "--exclusive", "train.py"]
    spec = gsrun.build_spec(args, {})
    assert (spec["cpu_bind"], spec["cpu_bind_arg"]) == ("cores", [])


def test_srun_exclusive_takes_an_optional_value_only_attached() -> None:
    parser = gsrun._parser()
    args = parser.parse_args(["--exclusive=user", "hostname"])
    assert parser.ignored == ["--exclusive"] and args.command == ["hostname"]
    args = parser.parse_args(["--exclusive", "hostname"])
    assert args.command == ["hostname"]


@pytest.mark.parametrize(("text", "kind", "numbers"), [
    ("v", "", []), ("verbose", "", []), ("quiet,none", "none", []), ("verbose,map_cpu:0,1", "map_cpu", [0, 1]),
    ("cores", "cores", []),
])
def test_srun_bind_reporting_words_bind_nothing_themselves(text: str, kind: str, numbers: list[int]) -> None:
    assert gsrun._binding(text, "--cpu-bind", ("none", "cores"), "map_cpu") == (kind, numbers)


def test_srun_tasks_prefix_is_tasks_per_node_as_in_slurm() -> None:
    args = gsrun._parser().parse_args(["--tasks=2", "true"])
    assert args.ntasks_per_node == 2 and args.ntasks is None


@pytest.mark.parametrize(("text", "expected"), [
    ("12345", "afterany:12345"), ("12,13_2", "afterany:12,afterany:13_2"), ("afterok:12,13", "afterok:12,afterany:13"),
    ("afterok:12?14", "afterok:12?afterany:14"), ("singleton", "singleton"), (" afterok:470301 ", "afterok:470301"),
])
def test_a_bare_job_id_dependency_is_afterany_as_slurmctld_reads_it(text: str, expected: str) -> None:
    assert slurm_dependency(text) == expected


@pytest.mark.parametrize(("text", "nodes"), [("4", 4), ("2-2", 2), ("2-70", 2)])
def test_node_count_ranges_allocate_their_minimum(text: str, nodes: int) -> None:
    assert parse_node_count(text) == nodes


@pytest.mark.parametrize("text", ["4-2", "0-3", "2-", "-2", "a-b"])
def test_bad_node_count_ranges_are_refused(text: str) -> None:
    with pytest.raises(UsageError):
        parse_node_count(text)


def test_an_ignored_flag_takes_an_attached_value_and_warns_once(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --resv-ports=4 --oom-kill-step\n#SBATCH --resv-ports\n#SBATCH -N 1\ntrue\n")
    submission = parse_submission([str(script)], ENVIRON, str(tmp_path))
    assert submission.ignored == ("--resv-ports", "--oom-kill-step")
    assert submission.spec.nodes == 1
    # --get-user-env and --propagate too (their value attached, or none): alone they must not swallow the next option.
    submission = parse_submission(["--get-user-env", "-G", "1", "--get-user-env=10L", "--propagate",
                                   "--propagate=STACK,CORE", str(script)], ENVIRON, str(tmp_path))
    assert {"--get-user-env", "--propagate"} <= set(submission.ignored) and submission.spec.gpus == 1


def test_a_slurm_option_we_lack_is_refused_not_read_as_a_longer_one_of_ours() -> None:
    # With --gres-flags ignored and --gres not declared (srun's parser between two commits of this branch),
    # srun --gres=gpu:1 became --gres-flags: the step silently saw every GPU. Slurm's names keep it --gres.
    parser = Parser(prog="srun")
    parser.add_argument("command", nargs="...")
    parser.ignored_values = {"--gres-flags": "--gres-flags"}
    parser.slurm_names = frozenset({"--gres", "--gres-flags"})
    with pytest.raises(UsageError, match="--gres: Slurm's option is not supported by srun"):
        parser.parse_args(["--gres=gpu:1", "python", "train.py"])
    # A prefix only Slurm's own names make ambiguous is ambiguous, as getopt_long finds it.
    with pytest.raises(UsageError, match="ambiguous"):
        _gsub_parser().parse_args(["--tres=gres/gpu:1", "job.sh"])  # --tres-bind or --tres-per-task


IN_A_JOB = {"SLURM_JOB_ID": "12", "SLURM_GPUS_ON_NODE": "4"}


@pytest.mark.parametrize(("words", "environ", "gpus_per_task"), [
    (["--gres=gpu:4", "python", "train.py"], IN_A_JOB, None),  # the job's GPUs on the node: seen already
    (["--gres=gpu:1", "-n", "1", "python", "run.py"], IN_A_JOB, 1),  # a task farm's step: holds its GPU
    (["--gres=gpu:a100:2", "--ntasks-per-node=1", "python", "run.py"], IN_A_JOB, 2),
    (["--gres=gpu:1", "--pty", "bash"], {}, None),  # outside a job: the allocation's, below
])
def test_srun_gres_is_the_steps_gpus_where_slurm_means_the_same(
        words: list[str], environ: dict[str, str], gpus_per_task: int | None) -> None:
    spec = gsrun.build_spec(gsrun._parser().parse_args(words), dict(environ))
    assert spec.get("gpus_per_task") == gpus_per_task


def test_srun_gres_outside_a_job_shapes_the_allocation() -> None:
    from garrison.cli.gsrun_alloc import allocation_options

    options = allocation_options(gsrun._parser().parse_args(["--gres=gpu:2", "--pty", "bash"]))
    submission = parse_submission(options, ENVIRON, "/tmp")
    assert submission.spec.gpus_per_node == 2


def test_srun_memory_and_cpus_per_gpu_outside_a_job_shape_the_allocation() -> None:
    # srun --mem-per-cpu (often in real srun lines), --mem-per-gpu and --cpus-per-gpu: the allocation's, as
    # sbatch's; inside a job they ask nothing of the step (it runs in the job's memory and CPUs).
    from garrison.cli.gsrun_alloc import allocation_options

    args = gsrun._parser().parse_args(["-n", "2", "-c", "2", "--mem-per-cpu=4G", "python", "x.py"])
    assert parse_submission(allocation_options(args), ENVIRON, "/tmp").spec.mem_per_cpu_mb == 4096
    args = gsrun._parser().parse_args(["-G", "2", "--mem-per-gpu=8G", "--cpus-per-gpu=3", "python", "x.py"])
    spec = parse_submission(allocation_options(args), ENVIRON, "/tmp").spec
    assert (spec.mem_per_gpu_mb, spec.cpus_per_gpu, spec.gpus) == (8192, 3, 2)
    assert gsrun.build_spec(args, dict(IN_A_JOB))["argv"] == ["python", "x.py"]


def test_srun_input_none_is_taken_and_other_inputs_refused() -> None:
    for words in (["--input=none"], ["-i", "none"], ["--input", "/dev/null"]):
        assert gsrun.build_spec(gsrun._parser().parse_args([*words, "true"]), dict(IN_A_JOB))["argv"] == ["true"]
    with pytest.raises(UsageError, match="only --input=none"):
        gsrun.build_spec(gsrun._parser().parse_args(["--input=data.txt", "true"]), dict(IN_A_JOB))


@pytest.mark.parametrize(("words", "problem"), [
    (["--gres=gpu:1", "--ntasks-per-node=4", "python", "x.py"], "several tasks on a node"),
    (["--gres=gpu:1", "--gpus-per-task=1", "-n", "1", "python", "x.py"], "not both"),
    (["--gres=nvme:1", "python", "x.py"], "unknown generic resource"),
])
def test_srun_gres_that_would_mean_something_else_is_refused(words: list[str], problem: str) -> None:
    with pytest.raises(UsageError, match=problem):
        gsrun.build_spec(gsrun._parser().parse_args(words), dict(IN_A_JOB))


@pytest.mark.parametrize(("text", "expected"), [
    ("gpu,ss11", "gpu&ss11"), ("a100|h100", "a100|h100"), (" gpu , a100 ", "gpu & a100"),
])
def test_a_comma_in_a_constraint_is_and_as_slurmctld_reads_it(text: str, expected: str) -> None:
    assert parse_constraint_text(text) == expected
