"""gsub's command line: the parser that declares its options, and ``parse_submission``, which turns argv
plus the batch script's ``#GSUB`` directives into a JobSpec without needing a terminal or a network.

As in sbatch, directives are read first and the command line overrides them, option by option. argparse
does the word-level parsing (both of argv and of each directive line, so the two accept exactly the same
spellings); the values are then checked by the pure parsers in ``parsing``, with errors that name the
option and, for a directive, the script line it came from. argparse (garrison/cmdline/argparser.py), not click as in the
other commands: gsub runs in loops and must start fast.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from garrison.cmdline.argparser import Parser
from garrison.cmdline.slurm_names import SBATCH_OPTION_NAMES
from garrison.model.jobspec import JobSpec, LaunchMode, without_credentials
from garrison.model.resources import resolve as resolve_resources

from .parsing import (
    ArraySpec,
    UsageError,
    expand_hostlist,
    parse_array,
    parse_begin_time,
    parse_constraint_text,
    parse_count,
    parse_exclusive,
    parse_export,
    parse_gpu_request,
    parse_gres,
    parse_memory_mb,
    parse_nice,
    parse_node_count,
    parse_submit_time_limit,
    parse_tres_per_task,
    read_directive_lines,
    slurm_dependency,
    split_gpu_memory,
)

__all__ = ["HelpRequested", "Submission", "UsageError", "option_strings", "parse_submission", "submit_request",
           "with_default_output"]

TYPE_CHECKING = False  # not typing's: importing typing costs gsub ~5 ms
if TYPE_CHECKING:
    from typing import Any, TypeVar

    _Value = TypeVar("_Value")

WRAP_JOB_NAME = "wrap"
STDIN_JOB_NAME = "gsub"  # a script read from standard input is named after the command, as sbatch names it "sbatch"
DIRECTIVE_QUOTE_LIMIT = 100  # a bad directive's error quotes at most this much of it

# sbatch options real scripts carry that Garrison accepts and does not act on: each is named once in a
# warning, never an error, so a script written for Slurm runs unchanged. (value-taking, flag)
IGNORED_VALUE_OPTIONS = (
    ("--mail-type",), ("--mail-user",), ("--wckey",), ("--hint",), ("-L", "--licenses"),
    ("--profile",), ("--acctg-freq",), ("-m", "--distribution"), ("--switches",), ("--reservation",),
    ("--threads-per-core",), ("--cores-per-socket",), ("--mincpus",), ("--tmp",),
    ("--gpu-bind",), ("--gpu-freq",), ("--cpu-freq",), ("--network",), ("--mcs-label",), ("--deadline",),
    ("--delay-boot",), ("-M", "--clusters"), ("--power",),
    ("-S", "--core-spec"), ("--thread-spec",), ("--cpu-bind",), ("--mem-bind",), ("--priority",),
    ("--kill-on-invalid-dep",), ("--container",), ("--uid",), ("--gid",), ("-B", "--extra-node-info"),
    # Found in real scripts (docs/slurm.md, "A corpus of real scripts"): placement hints Garrison's own placement
    # makes moot (a multi-node job starts once every node has launched, as --wait-all-nodes=1 asks), and
    # Slurm's soft requests (--prefer, --time-min), which the job meets by getting its --constraint and --time.
    ("--wait-all-nodes",), ("--gres-flags",), ("--ntasks-per-core",), ("--ntasks-per-socket",), ("--time-min",),
    ("--prefer",), ("--tres-bind",), ("--extra",), ("--batch",), ("--segment",),
)
IGNORED_FLAG_OPTIONS = (
    ("-O", "--overcommit"), ("-s", "--oversubscribe"), ("--contiguous",), ("--spread-job",),
    ("-k", "--no-kill"), ("--use-min-nodes",), ("-Q", "--quiet"), ("-v", "--verbose"), ("-I", "--immediate"),
    ("--ignore-pbs",), ("--reboot",), ("--spread-segments",), ("--consolidate-segments",), ("--stepmgr",),
    # These take an optional value, attached (--resv-ports=4, --get-user-env=10L): alone, they are flags.
    ("--oom-kill-step",), ("--resv-ports",), ("--get-user-env",), ("--propagate",),
)
# Other names Slurm gives an option (getopt_long reads a prefix of these as the option too: sbatch --tasks=14 is
# --tasks-per-node=14, its deprecated spelling of --ntasks-per-node; --ntasks-per-tres is tasks per GPU).
OPTION_ALIASES = {"--tasks-per-node": "--ntasks-per-node", "--cluster": "--clusters",
                  "--ntasks-per-tres": "--ntasks-per-gpu"}
WRAP_SHEBANG = "#!/bin/sh\n"


class HelpRequested(Exception):
    """-h/--help was given: the caller prints ``text`` and exits 0 instead of submitting anything."""

    def __init__(self, text: str) -> None:
        super().__init__("help requested")
        self.text = text


@dataclass(frozen=True)
class Submission:
    """Everything gsub will send: the job, its array indices and how to print the result.

    ``qos`` is also copied into ``spec.qos`` (and the array's %limit into ``spec.array_max_running``);
    it stays here too because the Submission's API promised it before JobSpec had the field.
    """

    spec: JobSpec
    array: ArraySpec | None
    parsable: bool
    qos: str | None
    hold: bool = False  # -H: submitted held
    test_only: bool = False  # --test-only: only estimate when and where it would start
    ignored: tuple[str, ...] = ()  # sbatch options given that Garrison does not act on (gsub warns once)
    wait: bool = False  # -W/--wait: block until the job ends, exit with its exit code


def _option(parser: argparse.ArgumentParser, *flags: str, metavar: str, help_text: str) -> None:
    parser.add_argument(*flags, metavar=metavar, help=help_text)


@functools.cache  # one parser for the command line and every #GSUB line: argparse parsers are reusable
def _gsub_parser() -> Parser:
    parser = Parser(
        prog="gsub",
        usage="gsub [OPTIONS] SCRIPT [ARGS...] | gsub [OPTIONS] < SCRIPT | gsub [OPTIONS] --wrap CMD",
        description=(
            "Submit a batch job. #GSUB lines at the top of SCRIPT are read as options; the command line "
            "overrides them."
        ),
        add_help=False,
        # Only what the words set explicitly shows up: the command line overrides directives option by option.
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument("-h", "--help", action="store_true", help="Show this message and exit.")
    _option(parser, "-J", "--job-name", metavar="NAME", help_text="Job name (default: the script's file name).")
    _option(parser, "-N", "--nodes", metavar="N", help_text="Number of nodes (default: the scheduler chooses).")
    _option(parser, "-G", "--gpus", metavar="[TYPE:]N", help_text="GPUs for the whole job, e.g. 16 or h100:16.")
    _option(parser, "--gpus-per-node", metavar="[TYPE:]N", help_text="GPUs on each node, e.g. 8 or a100:8.")
    _option(parser, "--cpus-per-gpu", metavar="N", help_text="CPU cores per allocated GPU.")
    _option(parser, "--mem", metavar="SIZE",
            help_text="Memory per node: 512M, 16G, 90GB, 1T; a plain number is MB; 0 means all of each node's.")
    _option(parser, "--mem-per-gpu", metavar="SIZE", help_text="Host memory per allocated GPU, e.g. 64G.")
    _option(parser, "--mem-per-cpu", metavar="SIZE", help_text="Host memory per allocated CPU, e.g. 4G.")
    _option(parser, "-n", "--ntasks", metavar="N", help_text="Tasks for the whole job (sbatch's meaning).")
    _option(parser, "-c", "--cpus-per-task", metavar="N", help_text="CPUs per task, also for a job without GPUs.")
    _option(parser, "--gpus-per-task", metavar="[TYPE:]N", help_text="GPUs per task: -n 8 --gpus-per-task 1 is 8 GPUs.")
    _option(parser, "--ntasks-per-gpu", metavar="N", help_text="Tasks per GPU: with -G 4, 2 makes 8 tasks.")
    _option(parser, "--tres-per-task", metavar="cpu=N,gres/gpu[:TYPE]=N",
            help_text="Resources per task, as -c N and --gpus-per-task [TYPE:]N.")
    _option(parser, "--gres", metavar="gpu[:TYPE]:N", help_text="GPUs on each node, as --gpus-per-node [TYPE:]N.")
    _option(parser, "--gpus-per-socket", metavar="[TYPE:]N",
            help_text="GPUs per socket, with --sockets-per-node S: --gpus-per-node N x S.")
    _option(parser, "--sockets-per-node", metavar="S",
            help_text="Sockets per node: read with --gpus-per-socket (alone, not acted on).")
    _option(parser, "-i", "--input", metavar="none",
            help_text="The batch script's standard input: none (/dev/null), as it is anyway.")
    _option(parser, "--comment", metavar="TEXT", help_text="A comment stored with the job (gjob shows it).")
    parser.add_argument("--open-mode", choices=["append", "truncate"],
                        help="Output files: truncate on the first attempt and append on later ones (the default), "
                             "or always append or truncate.")
    _option(parser, "--gpu-mem", metavar="SIZE", help_text="The least memory each GPU must have, e.g. 40G.")
    _option(parser, "-t", "--time", metavar="TIME", help_text="Time limit: M, M:S, H:M:S, D-H, D-H:M or D-H:M:S; UNLIMITED (or 0): the partition's maximum.")
    _option(parser, "-A", "--account", metavar="NAME", help_text="Account to charge.")
    _option(parser, "-p", "--partition", metavar="NAME", help_text="Partition to run in; a comma list (a,b): the first of them that can start the job.")
    _option(parser, "-q", "--qos", metavar="NAME", help_text="Quality of service.")
    _option(parser, "-o", "--output", metavar="PATTERN", help_text="stdout file; %%j %%t %%n %%A %%a %%u %%x expand.")
    _option(parser, "-e", "--error", metavar="PATTERN", help_text="stderr file (default: with stdout).")
    _option(parser, "-D", "--chdir", metavar="DIR", help_text="Working directory (default: the current one).")
    _option(parser, "--export", metavar="ALL|NONE|VARS",
            help_text="Environment to pass: ALL (default), NONE, or NAME[=VALUE],... with optional ALL.")
    _option(parser, "-a", "--array", metavar="INDICES", help_text="Job array: 1-1000%%50, 1,3,5 or 0-15:4.")
    parser.add_argument("--parsable", action="store_true", help="Print only the job id.")
    parser.add_argument("-W", "--wait", action="store_true",
                        help="Wait until the job has ended and exit with its exit code (an array's highest).")
    parser.add_argument("-H", "--hold", action="store_true", help="Submit held: it starts once released (gcontrol release).")
    parser.add_argument("--test-only", action="store_true",
                        help="Check the job and say when and where it would start, without submitting it.")
    _option(parser, "--wrap", metavar="CMD", help_text="Run CMD with /bin/sh instead of a script.")
    parser.add_argument("--launch", choices=[mode.value for mode in LaunchMode if mode != LaunchMode.ALLOCATION],
                        help="rank: a process per GPU; node: one per node; single: once, like an sbatch script.")
    _option(parser, "--ntasks-per-node", metavar="N", help_text="Processes per node in rank mode.")
    parser.add_argument("--requeue", dest="requeue", action="store_const", const=True,
                        help="The job may be requeued after a node failure (the default).")
    parser.add_argument("--no-requeue", dest="requeue", action="store_const", const=False,
                        help="The job is not requeued after a node failure.")
    _option(parser, "--max-restarts", metavar="N", help_text="Times a failed job is restarted (default: 0).")
    _option(parser, "-x", "--exclude", metavar="NODES", help_text="Nodes not to run on, e.g. node3,gpu[01-04].")
    _option(parser, "-w", "--nodelist", metavar="NODES",
            help_text="Nodes to run on, all of them, e.g. node[1-2] (with a larger -N, others are added).")
    _option(parser, "-F", "--nodefile", metavar="FILE",
            help_text="As --nodelist, the nodes named in FILE (whitespace, commas or lines between them).")
    _option(parser, "-C", "--constraint", metavar="FEATURES",
            help_text="Node features the job needs: a100, a100&ib (and), a100|h100 (or).")
    _option(parser, "--exclusive", metavar="[=user|mcs|topo]",
            help_text="Whole nodes: every GPU, CPU and MB of each, shared with no other job.")
    parser.bare_values["--exclusive"] = "node"
    _option(parser, "--nice", metavar="[=N]",
            help_text="Lower the job's priority by N (100 if alone; only admins may give a negative N). "
                      "The value must be attached: --nice=500.")
    parser.bare_values["--nice"] = "100"
    _option(parser, "-b", "--begin", metavar="TIME",
            help_text="Not before TIME: now+N[s|m|h|d|w], HH:MM[:SS], YYYY-MM-DD[THH:MM[:SS]], noon, tomorrow...")
    _option(parser, "-d", "--dependency", metavar="TYPE:JOB[:JOB...][,...]",
            help_text="Start only after these jobs: after (after:12+5: 5 minutes after 12 started), afterany, afterok, afternotok or aftercorr (an array task by task), or singleton, e.g. afterok:12,afterany:13.")
    _option(parser, "--signal", metavar="[R:]SIG@SECS",
            help_text="Send SIG (e.g. USR1) SECS seconds before the time limit and before preemption.")
    parser.ignored_values = {flag: flags[-1] for flags in IGNORED_VALUE_OPTIONS for flag in flags}
    parser.ignored_flags = {flag: flags[-1] for flags in IGNORED_FLAG_OPTIONS for flag in flags}
    parser.aliases = dict(OPTION_ALIASES)
    parser.slurm_names = frozenset(f"--{name}" for name in SBATCH_OPTION_NAMES)
    parser.slurm_command = "sbatch"
    parser.epilog = ("Accepted from sbatch scripts and not acted on (a warning names them): "
                     + ", ".join(flags[-1] for flags in IGNORED_VALUE_OPTIONS + IGNORED_FLAG_OPTIONS) + ".")
    parser.add_argument("script", nargs="?",
                        help="The batch script (it starts with #!); read from standard input when not given.")
    # Everything after the script name belongs to the script, even words that look like options.
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="Arguments for the script.")
    return parser


def option_strings() -> list[str]:
    """Every option gsub takes (docs/reference.md must describe each)."""
    return [flag for action in _gsub_parser()._actions for flag in action.option_strings]


def _given_options(words: Sequence[str]) -> dict[str, object]:
    """Parse ``words`` as gsub's options; return only what they set explicitly, by parameter name."""
    parser = _gsub_parser()
    given = vars(parser.parse_args(list(words)))
    if parser.ignored:
        given["ignored"] = tuple(parser.ignored)
    if given.pop("help", False):
        raise HelpRequested(parser.format_help())
    if not given.get("script_args", True):
        del given["script_args"]  # argparse always fills the remainder, with [] when there is none
    if "script_args" in given:
        given["script_args"] = tuple(given["script_args"])
    return given


class _ChosenOptions:
    """The winning value of each option and where it came from, so an error can point at the right line."""

    def __init__(self) -> None:
        self._values: dict[str, tuple[object, str]] = {}
        self._precedence: dict[str, int] = {}  # of the source each value came from: a higher one overrides
        self._ignored: dict[str, None] = {}

    def text(self, name: str) -> str | None:
        value, _ = self._values.get(name, (None, ""))
        assert value is None or isinstance(value, str), name
        return value

    def flag(self, name: str) -> bool | None:
        value, _ = self._values.get(name, (None, ""))
        assert value is None or isinstance(value, bool), name
        return value

    def apply(self, values: Mapping[str, object], origin: str, precedence: int) -> None:
        for name, value in values.items():
            if name == "ignored":  # collected from every source, not overridden
                assert isinstance(value, tuple)
                self._ignored.update(dict.fromkeys(value))
            else:
                self._values[name] = (value, origin)
                self._precedence[name] = precedence

    def precedence(self, name: str) -> int:
        return self._precedence.get(name, -1)

    def ignored(self) -> tuple[str, ...]:
        """The options given that Garrison accepts and does not act on, as their long flags."""
        return tuple(self._ignored)

    def origin(self, name: str) -> str:
        return self._values.get(name, (None, ""))[1]

    def error(self, name: str, problem: str) -> UsageError:
        _, origin = self._values.get(name, (None, ""))
        return UsageError(_quoted_briefly(f"{origin}--{name.replace('_', '-')}: {problem}"))

    def converted(self, name: str, parse: Callable[[str], _Value]) -> _Value | None:
        """The option's value through ``parse`` (None where not given); parse's UsageError names the option."""
        value = self.text(name)
        if value is None:
            return None
        try:
            return parse(value)
        except UsageError as problem:
            raise self.error(name, str(problem)) from None

    def nonempty_text(self, name: str) -> str | None:
        value = self.text(name)
        if value is not None and not value.strip():
            raise self.error(name, "must not be empty")
        return value

    def count(self, name: str, *, minimum: int = 1) -> int | None:
        value = self.text(name)
        if value is None:
            return None
        try:
            return parse_count(value.strip(), minimum=minimum)
        except UsageError as problem:
            raise self.error(name, str(problem)) from None


def read_local_file(path: str) -> bytes:
    with open(path, "rb") as script_file:
        return script_file.read()


def _read_script(path: str, cwd: str, read_file: Callable[[str], bytes]) -> str:
    """The script's text, refused early when it could never run as a batch script."""
    try:
        data = read_file(os.path.join(cwd, path))
    except FileNotFoundError:
        raise UsageError(f"script not found: {path}") from None
    except IsADirectoryError:
        raise UsageError(f"script is a directory: {path}") from None
    except OSError as error:
        raise UsageError(f"cannot read script {path}: {error.strerror}") from None
    return _checked_script(data, path)


def _checked_script(data: bytes, path: str) -> str:
    if not data.strip():
        raise UsageError(f"script is empty: {path}")
    if b"\0" in data:
        raise UsageError(f"script is a binary file, not text: {path}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"script is not UTF-8 text: {path}") from None
    # Like sbatch, which refuses them: "/bin/bash^M: bad interpreter" on the node would be a worse message.
    if "\r\n" in text:
        raise UsageError(
            f"script contains DOS line breaks (\\r\\n) instead of UNIX line breaks (\\n): {path} "
            "(convert it with dos2unix)"
        )
    # Like sbatch: the agent executes the script file directly, which needs an interpreter line.
    if not text.startswith("#!"):
        raise UsageError(
            f"script does not start with #! and an interpreter: {path} (for a command, use --wrap)"
        )
    return text


def _job_name(chosen: _ChosenOptions, script: str | None, from_stdin: bool, prog: str) -> str:
    name = chosen.nonempty_text("job_name")
    if name is None:
        if from_stdin:
            return prog if prog else STDIN_JOB_NAME
        return os.path.basename(script) if script is not None else WRAP_JOB_NAME
    if any(not char.isprintable() for char in name):
        raise chosen.error("job_name", f"contains a control character: {name!r}")
    return name


def _gpu_request(chosen: _ChosenOptions) -> tuple[str | None, int | None, int | None, int | None]:
    """(gpu type, total gpus, gpus per node, gpus per task) from --gpus, --gpus-per-node, --gpus-per-task
    (each N or TYPE:N, as sbatch takes them) and --gres."""
    gpu_type: str | None = None
    counts: dict[str, int | None] = {"gpus": None, "gpus_per_node": None, "gpus_per_task": None}
    for name in counts:
        value = chosen.text(name)
        if value is None:
            continue
        try:
            requested_type, counts[name] = parse_gpu_request(value)
        except UsageError as problem:
            raise chosen.error(name, str(problem)) from None
        if requested_type is not None and gpu_type is not None and requested_type != gpu_type:
            raise chosen.error(name, f"GPU type {requested_type!r} differs from --gpus type {gpu_type!r}")
        gpu_type = requested_type or gpu_type
    gres = chosen.text("gres")
    if gres is not None:
        gres, _ = split_gpu_memory(gres)  # its GPU memory: _apply_gres_gpu_memory
    if gres:
        try:
            requested_type, per_node = parse_gres(gres)
        except UsageError as problem:
            raise chosen.error("gres", str(problem)) from None
        if per_node == 0:  # --gres=none or gpu:0 asks for nothing; with --gpus as well, Slurm gives those
            return gpu_type, counts["gpus"], counts["gpus_per_node"], counts["gpus_per_task"]
        # --gres=gpu:N is --gpus-per-node=N: the same count given both ways is accepted, as Slurm does.
        if counts["gpus_per_node"] is not None and counts["gpus_per_node"] != per_node:
            raise chosen.error("gres", f"gpu:{per_node} conflicts with --gpus-per-node {counts['gpus_per_node']}")
        counts["gpus_per_node"] = per_node
        if requested_type is not None and gpu_type is not None and requested_type != gpu_type:
            raise chosen.error("gres", f"GPU type {requested_type!r} differs from --gpus type {gpu_type!r}")
        gpu_type = requested_type or gpu_type
    return gpu_type, counts["gpus"], counts["gpus_per_node"], counts["gpus_per_task"]


MAX_NODEFILE_BYTES = 1 << 20


def _apply_nodefile(chosen: _ChosenOptions, cwd: str, read_file: Callable[[str], bytes]) -> None:
    """-F/--nodefile FILE as --nodelist with the names in FILE, which sbatch reads the same way (the names, or
    host lists, on one line or many). Given with --nodelist, the higher source wins, as for any option; from
    the same one they are refused."""
    path = chosen.nonempty_text("nodefile")
    if path is None or chosen.precedence("nodelist") > chosen.precedence("nodefile"):
        return
    if chosen.text("nodelist") is not None and chosen.precedence("nodelist") == chosen.precedence("nodefile"):
        raise chosen.error("nodefile", "give either --nodelist or --nodefile, not both")
    try:
        data = read_file(os.path.join(cwd, path))
    except FileNotFoundError:
        raise chosen.error("nodefile", f"no such file: {path}") from None
    except OSError as error:
        raise chosen.error("nodefile", f"cannot read {path}: {error.strerror}") from None
    if len(data) > MAX_NODEFILE_BYTES:
        raise chosen.error("nodefile", f"{path} is larger than {MAX_NODEFILE_BYTES} bytes")
    try:
        names = ",".join(data.decode("utf-8").replace(",", " ").split())
    except UnicodeDecodeError:
        raise chosen.error("nodefile", f"{path} is not UTF-8 text") from None
    if not names:
        raise chosen.error("nodefile", f"{path} names no node")
    chosen.apply({"nodelist": names}, chosen.origin("nodefile"), chosen.precedence("nodefile"))


def _apply_tres_per_task(chosen: _ChosenOptions) -> None:
    """--tres-per-task's cpu and gres/gpu given as -c and --gpus-per-task, which they are to Slurm. Where both
    are given, the one from the higher source wins (the command line over a directive, as for any option); from
    the same one, the same count is accepted and different ones refused."""
    text = chosen.text("tres_per_task")
    parsed = chosen.converted("tres_per_task", parse_tres_per_task)
    if text is None or parsed is None:
        return
    cpus, gpus = parsed
    for name, value in (("cpus_per_task", None if cpus is None else str(cpus)), ("gpus_per_task", gpus)):
        given = chosen.text(name)
        if value is None or given == value or chosen.precedence(name) > chosen.precedence("tres_per_task"):
            continue
        if given is not None and chosen.precedence(name) == chosen.precedence("tres_per_task"):
            raise chosen.error("tres_per_task", f"{text!r} conflicts with --{name.replace('_', '-')} {given}")
        chosen.apply({name: value}, chosen.origin("tres_per_task"), chosen.precedence("tres_per_task"))


def _apply_gres_gpu_memory(chosen: _ChosenOptions) -> None:
    """A site's GPU-memory gres (``--gres=gpu:1,vmem:10G``: parsing.split_gpu_memory) as --gpu-mem, unless that
    is given from a higher source."""
    _, memory_mb = chosen.converted("gres", split_gpu_memory) or ("", None)
    if memory_mb is not None and chosen.precedence("gpu_mem") < chosen.precedence("gres"):
        chosen.apply({"gpu_mem": f"{memory_mb}M"}, chosen.origin("gres"), chosen.precedence("gres"))


def _apply_gpus_per_socket(chosen: _ChosenOptions) -> None:
    """--gpus-per-socket N with --sockets-per-node S as --gpus-per-node N x S (its type kept): the GPUs every
    node of the job holds, as Slurm counts them. Slurm needs the socket count for it; so does gsub. Given with
    --gpus-per-node or --gres too, the counts must agree."""
    text = chosen.text("gpus_per_socket")
    if text is None:
        return
    sockets = chosen.count("sockets_per_node")
    if sockets is None:
        raise chosen.error("gpus_per_socket", "needs --sockets-per-node (as in Slurm): how many sockets' GPUs")
    gpu_type, per_socket = chosen.converted("gpus_per_socket", parse_gpu_request) or (None, 0)
    per_node = f"{gpu_type}:{per_socket * sockets}" if gpu_type else str(per_socket * sockets)
    given = chosen.converted("gpus_per_node", parse_gpu_request)
    if given is not None:
        given_type, given_count = given
        if given_count != per_socket * sockets or (gpu_type and given_type and gpu_type != given_type):
            raise chosen.error("gpus_per_socket", f"{text} x {sockets} sockets conflicts with --gpus-per-node "
                                                  f"{chosen.text('gpus_per_node')}")
        return
    chosen.apply({"gpus_per_node": per_node}, chosen.origin("gpus_per_socket"), chosen.precedence("gpus_per_socket"))


def _current_umask() -> int:
    """The caller's umask (reading it means setting it; set it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# sbatch's input environment variables, under gsub's name or sbatch's (GSUB_ACCOUNT, else SBATCH_ACCOUNT):
# as in sbatch, they override the script's directives, and the command line overrides them.
ENVIRONMENT_OPTIONS = {
    "ACCOUNT": "account", "PARTITION": "partition", "QOS": "qos", "TIMELIMIT": "time", "JOB_NAME": "job_name",
    "OUTPUT": "output", "ERROR": "error", "GPUS": "gpus", "GPUS_PER_NODE": "gpus_per_node",
    "CPUS_PER_GPU": "cpus_per_gpu", "MEM_PER_NODE": "mem", "EXPORT": "export", "SIGNAL": "signal",
    "MEM_PER_GPU": "mem_per_gpu", "MEM_PER_CPU": "mem_per_cpu", "GPUS_PER_TASK": "gpus_per_task", "GRES": "gres",
    "OPEN_MODE": "open_mode", "CONSTRAINT": "constraint", "ARRAY_INX": "array", "EXCLUSIVE": "exclusive",
    "TRES_PER_TASK": "tres_per_task",
}
# The flags among them: set to anything, they give the option (SBATCH_NO_REQUEUE=1 is --no-requeue).
ENVIRONMENT_FLAGS = {"REQUEUE": ("requeue", True), "NO_REQUEUE": ("requeue", False), "WAIT": ("wait", True)}


def _environment_options(environ: Mapping[str, str]) -> list[tuple[str, dict[str, object]]]:
    """(the variable, the option it sets) for each input variable set to something."""
    found: list[tuple[str, dict[str, object]]] = []
    for suffix, option in ENVIRONMENT_OPTIONS.items():
        for variable in (f"GSUB_{suffix}", f"SBATCH_{suffix}"):
            value = environ.get(variable, "")
            if value:
                # SBATCH_EXCLUSIVE=1 (or anything but a kind) is --exclusive alone
                if option == "exclusive" and value not in ("user", "mcs", "topo"):
                    value = "node"
                found.append((variable, {option: value}))
                break
    for suffix, (name, flag) in ENVIRONMENT_FLAGS.items():
        for variable in (f"GSUB_{suffix}", f"SBATCH_{suffix}"):
            if environ.get(variable, ""):
                found.append((variable, {name: flag}))
                break
    return found


def _quoted_briefly(message: str) -> str:
    """``message`` with every quoted part cut to DIRECTIVE_QUOTE_LIMIT characters: a directive line can be
    kilobytes long, and its error must stay one readable line."""

    def cut(match: re.Match[str]) -> str:
        quote, body = match.group(1), match.group(2)
        if len(body) <= DIRECTIVE_QUOTE_LIMIT:
            return match.group(0)
        return f"{quote}{body[:DIRECTIVE_QUOTE_LIMIT]}...{quote}"

    return re.sub(r"(['\"])(.*?)\1", cut, message)


_ENVIRONMENT_PRECEDENCE = 2  # above #SBATCH (0) and #GSUB (1) lines
_COMMAND_LINE_PRECEDENCE = 3


def _directive_options(script: str, script_text: str, directive: str) -> list[tuple[dict[str, object], str]]:
    """Each directive line's options, with the origin its errors name (``train.sh line 3: ``)."""
    found = []
    try:
        lines = read_directive_lines(script_text, directive)
    except UsageError as problem:
        raise UsageError(_quoted_briefly(f"{script} {problem}")) from None
    for line_number, words in lines:
        origin = f"{script} line {line_number}: "
        try:
            options = _given_options(words)
        except UsageError as problem:
            raise UsageError(_quoted_briefly(f"{origin}{problem}")) from None
        except HelpRequested:
            raise UsageError(f"{origin}--help is not a directive") from None
        if "script" in options:
            raise UsageError(_quoted_briefly(
                f"{origin}unexpected argument {options['script']!r}: directives hold options only"
            ))
        if "wrap" in options:
            raise UsageError(f"{origin}--wrap cannot be used in a script")
        found.append((options, origin))
    return found


def parse_submission(
    argv: list[str], environ: Mapping[str, str], cwd: str, stdin: Callable[[], bytes] | None = None,
    prog: str = "gsub", read_file: Callable[[str], bytes] = read_local_file, umask: int | None = None,
    read_other_file: Callable[[str], bytes] | None = None,
) -> Submission:
    """Build the Submission for ``gsub ARGV`` run in directory ``cwd`` with environment ``environ``.

    Reads the script file (relative paths against ``cwd``), or, with neither a script nor --wrap, the script
    from ``stdin`` when one is given (as sbatch reads standard input), but nothing else. Raises UsageError
    with a one-line message for any mistake, and HelpRequested for -h/--help.

    Precedence, highest first, option by option: the command line, the GSUB_*/SBATCH_* input variables,
    ``#GSUB`` directives, ``#SBATCH`` directives.

    ``prog`` is the command's name (gsub, sbatch): a script read from standard input is named after it.
    ``read_file`` reads the script (an absolute path) and raises OSError as ``open`` does, and
    ``read_other_file`` (default: ``read_file``) any other file an option names (-F/--nodefile); ``umask`` is the
    caller's (default: this process's). The controller passes both for a command line it parses for a client
    (controller/rpc/commandline.py), and reads no file itself.
    """
    command_line = _given_options(argv)
    script = command_line.get("script")
    wrap = command_line.get("wrap")
    script_args = command_line.get("script_args", ())
    assert script is None or isinstance(script, str)
    assert wrap is None or isinstance(wrap, str)
    assert isinstance(script_args, tuple)

    if script is not None and wrap is not None:
        raise UsageError("give either a script or --wrap, not both")
    from_stdin = script is None and wrap is None
    stdin_data = stdin() if from_stdin and stdin is not None else b""
    if from_stdin and not stdin_data:
        raise UsageError(f"no script given: use {prog} [OPTIONS] SCRIPT [ARGS...], {prog} [OPTIONS] < SCRIPT "
                         f"or {prog} [OPTIONS] --wrap CMD")

    chosen = _ChosenOptions()
    if script is not None or from_stdin:
        if from_stdin:
            script_text = _checked_script(stdin_data, "standard input")
            script_name = "standard input"
        else:
            assert script is not None
            script_text = _read_script(script, cwd, read_file)
            script_name = script
        for precedence, directive in enumerate(("#SBATCH", "#GSUB")):  # lowest first: each later one overrides
            for options, origin in _directive_options(script_name, script_text, directive):
                chosen.apply(options, origin, precedence)
        command = tuple(str(word) for word in script_args)
    else:
        assert wrap is not None
        if not wrap.strip():
            raise UsageError("--wrap: the command is empty")
        script_text = WRAP_SHEBANG + wrap + "\n"
        command = ()
    for variable, option in _environment_options(environ):
        chosen.apply(option, f"${variable}: ", _ENVIRONMENT_PRECEDENCE)
    chosen.apply(command_line, "", _COMMAND_LINE_PRECEDENCE)

    converted = chosen.converted
    _apply_nodefile(chosen, cwd, read_other_file or read_file)
    _apply_tres_per_task(chosen)
    _apply_gpus_per_socket(chosen)
    _apply_gres_gpu_memory(chosen)
    gpu_type, gpus, gpus_per_node, gpus_per_task = _gpu_request(chosen)
    input_file = chosen.text("input")
    if input_file is not None and input_file.strip() not in ("none", os.devnull):
        # A file as the script's standard input is not carried to the node: refused rather than left unread.
        raise chosen.error("input", f"{input_file[:60]!r}: only none is taken (the script reads {os.devnull})")
    chdir = chosen.nonempty_text("chdir")
    launch = chosen.text("launch")
    requeue = chosen.flag("requeue")
    export = converted("export", lambda text: parse_export(text, environ))
    array = converted("array", parse_array)
    qos = chosen.nonempty_text("qos")
    mem = converted("mem", lambda text: parse_memory_mb(text, zero_allowed=True))
    comment = chosen.text("comment")
    if comment is not None and any(not char.isprintable() for char in comment):
        raise chosen.error("comment", f"contains a control character: {comment!r}")

    spec = JobSpec(
        name=_job_name(chosen, script, from_stdin, prog),
        command=command,
        script=script_text,
        nodes=converted("nodes", parse_node_count),
        gpus=gpus,
        gpus_per_node=gpus_per_node,
        gpu_type=gpu_type,
        cpus_per_gpu=chosen.count("cpus_per_gpu") or 0,
        mem_mb=mem or 0,
        gpu_mem_mb=converted("gpu_mem", parse_memory_mb) or 0,
        time_limit_s=converted("time", parse_submit_time_limit),
        account=chosen.nonempty_text("account"),
        partition=chosen.nonempty_text("partition"),
        workdir=os.path.normpath(os.path.join(cwd, chdir)) if chdir is not None else cwd,
        # SLURM_SUBMIT_DIR is where gsub ran, whatever -D says (sbatch's getcwd()): only kept where they differ
        submit_dir=cwd if chdir is not None and os.path.normpath(os.path.join(cwd, chdir)) != cwd else None,
        env=without_credentials(export if export is not None else environ),
        output=chosen.nonempty_text("output"),
        error=chosen.nonempty_text("error"),
        # As sbatch: the batch script runs once, on the first node; per-rank launches are asked for.
        launch=LaunchMode(launch) if launch is not None else LaunchMode.SINGLE,
        ntasks_per_node=chosen.count("ntasks_per_node"),
        requeue=requeue if requeue is not None else True,
        max_restarts=chosen.count("max_restarts", minimum=0) or 0,
        qos=qos,
        signal=chosen.nonempty_text("signal"),
        dependency=converted("dependency", slurm_dependency),
        exclude=tuple(converted("exclude", expand_hostlist) or ()),
        begin_time=converted("begin", lambda text: parse_begin_time(text, time.time())),
        nice=converted("nice", parse_nice) or 0,
        umask=_current_umask() if umask is None else umask,
        array_max_running=array.max_running if array is not None else None,
        submit_host=os.uname().nodename or None,  # socket.gethostname()'s answer, without importing socket
        constraint=converted("constraint", parse_constraint_text),
        nodelist=tuple(converted("nodelist", expand_hostlist) or ()),
        exclusive=bool(converted("exclusive", parse_exclusive)),
        ntasks=chosen.count("ntasks"),
        cpus_per_task=chosen.count("cpus_per_task"),
        gpus_per_task=gpus_per_task,
        ntasks_per_gpu=chosen.count("ntasks_per_gpu"),
        mem_per_gpu_mb=converted("mem_per_gpu", parse_memory_mb) or 0,
        mem_per_cpu_mb=converted("mem_per_cpu", parse_memory_mb) or 0,
        mem_whole_node=mem == 0,
        comment=comment or None,
        open_mode=chosen.text("open_mode"),
    )
    try:
        resolve_resources(spec)  # only to refuse a conflict here; the controller maps the options itself
    except ValueError as problem:
        raise UsageError(str(problem)) from None
    return Submission(spec=spec, array=array, parsable=bool(chosen.flag("parsable")), qos=qos,
                      hold=bool(chosen.flag("hold")), test_only=bool(chosen.flag("test_only")),
                      ignored=_ignored(chosen), wait=bool(chosen.flag("wait")))


def _ignored(chosen: _ChosenOptions) -> tuple[str, ...]:
    """The options given and not acted on: those the parser dropped, and --sockets-per-node without
    --gpus-per-socket (the one option that reads it)."""
    ignored = chosen.ignored()
    if chosen.text("sockets_per_node") is not None and chosen.text("gpus_per_socket") is None:
        ignored = (*ignored, "--sockets-per-node")
    return ignored


def submit_request(submission: Submission) -> dict[str, Any]:
    """The SubmitJobRequest message in its plain form (garrison/plainmsg.py): gsub never imports protobuf."""
    from garrison.wire.convert_spec import spec_to_plain

    request: dict[str, Any] = {"spec": spec_to_plain(submission.spec)}
    if submission.hold:
        request["hold"] = True
    if submission.test_only:
        request["test_only"] = True
    if submission.array is not None:
        request["array_indices"] = list(submission.array.indices)
        if submission.array.max_running is not None:
            request["array_max_running"] = submission.array.max_running
    return request


def with_default_output(submission: Submission, default: str | None, array_default: str | None) -> Submission:
    """``submission`` writing to ``default`` (``array_default`` for an array) when it names no -o file."""
    if submission.spec.output is not None or default is None:
        return submission
    pattern = array_default if submission.array is not None and array_default else default
    return replace(submission, spec=replace(submission.spec, output=pattern))
