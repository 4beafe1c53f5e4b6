"""gsrun: run a job step in an allocation (Slurm's srun), its tasks' output streamed back here.

Inside a job (SLURM_JOB_ID or GARRISON_JOB_ID in the environment, or --jobid), ``gsrun [options] CMD ...``
asks the controller for a step of that job; the nodes' agents start its tasks, and their stdout and
stderr come back on the same RunStep stream, so gsrun works from any host that reaches the controller.
The exit status is the step's: the highest exit code of its tasks (128+N for a task killed by signal N).

Signals, as srun's: one Ctrl-C reports the step's state, a second within a second sends SIGINT to the
tasks and cancels the step, a third leaves at once. SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCONT and
SIGALRM are passed on to every task. With --pty, task 0 runs on a pseudo-terminal on its node: this
terminal goes raw, every byte (Ctrl-C too) goes to it, and window size changes follow.
"""

from __future__ import annotations

import _socket  # the local stream is a _socket.socket (cli/client.py says why)
import os
import queue
import signal
import sys
import threading
import time

from garrison.cli.client import EXIT_USAGE, HEADER, OK, Client, CliError, fail
from garrison.cmdline.argparser import Parser, UsageError
from garrison.cmdline.slurm_names import SRUN_OPTION_NAMES

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping, Sequence
    from typing import Any

    from garrison.cli.gsrun_alloc import Granted

PROG = "gsrun"
# srun options real scripts carry that Garrison accepts and does not act on: gsrun names them once in a warning
# (unless -Q), as gsub does sbatch's, so a script written for Slurm runs unchanged. Each is a placement, MPI or
# accounting hint whose absence leaves the step's tasks, GPUs and environment as they would be without it:
# --exclusive/--exact/--overlap/--whole decide whether steps may share CPUs (Garrison's steps hold only what -c
# asks), --mpi picks a PMI plugin (Garrison's tasks get torch's rendezvous variables, not PMI), -k/--no-kill
# keeps a step going after a node fails (Garrison requeues the job). Not srun's --signal (a requeue hangs on it):
# its absence would change what the tasks get. (value-taking, flag)
IGNORED_VALUE_OPTIONS = (
    ("--mpi",), ("--hint",), ("-m", "--distribution"), ("--accel-bind",), ("--comment",), ("--mem-bind",),
    ("--cpu-freq",), ("--gpu-freq",), ("--threads-per-core",), ("--ntasks-per-core",), ("--ntasks-per-socket",),
    ("--network",), ("--profile",), ("--acctg-freq",), ("--wckey",), ("--mail-type",), ("--mail-user",),
    ("--reservation",), ("--gres-flags",), ("--tres-bind",), ("--mcs-label",), ("--msg-timeout",),
    ("--slurmd-debug",), ("-T", "--threads"), ("--switches",),
    ("--cores-per-socket",), ("--sockets-per-node",), ("--mincpus",), ("--tmp",),
    # Scheduling hints for a job, which a step inside one does not have (Slurm ignores them there too).
    ("--time-min",), ("--prefer",), ("--priority",), ("--deadline",), ("--delay-boot",), ("--extra",),
)
IGNORED_FLAG_OPTIONS = (
    ("--exclusive",), ("--exact",), ("--overlap",), ("--whole",), ("-k", "--no-kill"), ("-Q", "--quiet"),
    ("-v", "--verbose"), ("-O", "--overcommit"), ("-s", "--oversubscribe"), ("--quit-on-interrupt",),
    ("-X", "--disable-status"), ("-E", "--preserve-env"), ("--propagate",), ("--contiguous",), ("--spread-job",),
    ("--use-min-nodes",), ("--send-libs",), ("--wait-for-children",),
    # These take an optional value, attached: --resv-ports=4 (ports for an MPI library's own wire-up, which
    # Garrison's tasks do without: they get torch's rendezvous variables), --nice=10 (a step has no priority).
    ("--resv-ports",), ("--nice",), ("--reboot",),
)
# --cpu_bind: the spelling Open MPI's launchers still pass, which Slurm keeps for them.
OPTION_ALIASES = {"--cpu_bind": "--cpu-bind", "--tasks-per-node": "--ntasks-per-node"}
BIND_REPORTING = ("verbose", "v", "quiet", "q")  # --cpu-bind/--gpu-bind's [verbose,]TYPE prefix: reporting only
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT,
             signal.SIGALRM)
INTERRUPT_WINDOW_S = 1.0
STREAM_END = 255  # controller/rpc/local.py's last frame of a stream
RESOURCE_EXHAUSTED = 8  # grpc.StatusCode's: the local socket's limits refused us
# grpc.StatusCode values after which a step's stream is tried again: the controller is away (UNAVAILABLE,
# CANCELLED and UNKNOWN as it shuts down, INTERNAL for a reset link), or an older controller still has the old
# stream (FAILED_PRECONDITION: busy; this one lets the new stream take over).
TRANSIENT_STATUSES = frozenset({1, 2, 9, 13, 14})
REATTACH_S = 600.0  # how long a broken step stream is tried again: a controller restart takes seconds
REATTACH_FIRST_DELAY_S = 0.25
REATTACH_MAX_DELAY_S = 2.0


def _parser() -> Parser:
    parser = Parser(prog=PROG, description="Run a job step (srun) in a running job of yours.")
    add = parser.add_argument
    add("-n", "--ntasks", type=int, help="Tasks to run (default: one per node, or SLURM_NTASKS).")
    add("-N", "--nodes", type=int, help="Nodes of the job's allocation to use.")
    add("--ntasks-per-node", type=int, help="Tasks on each node.")
    add("--gpus-per-task", metavar="[TYPE:]N",
        help="GPUs each task holds (out of the job's, whose type they have: srun's TYPE: is taken as given).")
    add("-c", "--cpus-per-task", type=int, help="CPUs each task holds (out of the job's).")
    add("--ntasks-per-gpu", type=int, help="Tasks per GPU of the job on each node, each bound to its GPU "
        "(job packing: 2 runs the command twice per GPU).")
    add("--tres-per-task", metavar="cpu=N,gres/gpu[:TYPE]=N", help="Resources per task, as -c and --gpus-per-task.")
    add("-w", "--nodelist", default="", help="Nodes the step must use (comma list or host list).")
    add("--gpu-bind", default="", help="none, closest, single:N, map_gpu:A,B,...")
    add("--cpu-bind", default="", help="none, cores, map_cpu:A,B,...")
    add("-l", "--label", action="store_true", help='Prefix each output line with its task number ("3: ").')
    # srun's -K[0|1]: the value only attached (--kill-on-bad-exit=1), as scripts write it; alone it means 1.
    add("-K", "--kill-on-bad-exit", choices=["0", "1"], help="A task exiting non-zero stops the others (=0: not).")
    # --wait's grace after the first task ends is left to -K: accepted, not acted on.
    add("-W", "--wait", type=int, help="Accepted for srun's scripts; not acted on.")
    add("-u", "--unbuffered", action="store_true",
        help="Send the tasks' output as it is written, not held back to whole lines.")
    add("--export", default="ALL", help="ALL (default), NONE, or a comma list of NAME and NAME=VALUE (with ALL,...).")
    add("--pty", action="store_true", help="Run task 0 on a pseudo-terminal, connected to this one.")
    add("--multi-prog", action="store_true",
        help="COMMAND is a file of 'RANKS PROGRAM ARGS' lines: each task runs its own (%%t, %%o expand).")
    add("--jobid", default="", help="The job to run the step in (default: SLURM_JOB_ID / GARRISON_JOB_ID).")
    add("-J", "--job-name", default="", help="The step's name (default: the command's).")
    add("-D", "--chdir", default="", help="The tasks' working directory (default: this one).")
    add("-o", "--output", default="", help="Write the tasks' stdout to this file instead of gsrun's stdout "
        "(%%t: a file per task; %%j %%J %%s %%n %%N %%u %%x %%A %%a %%%% expand as srun's).")
    add("-e", "--error", default="", help="Write the tasks' stderr to this file instead of gsrun's stderr "
        "(the same patterns).")
    add("--open-mode", choices=["append", "truncate"], default=None,
        help="-o/-e files: emptied first (truncate, srun's default) or appended to; default: the job's "
             "--open-mode (SLURM_OPEN_MODE), else truncate.")
    # Outside a job, gsrun first asks for an allocation (cli/gsrun_alloc.py); these shape it as sbatch's do.
    add("-t", "--time", default="", help="Outside a job: the allocation's time limit.")
    add("-p", "--partition", default="", help="Outside a job: the allocation's partition.")
    add("-A", "--account", default="", help="Outside a job: the account to charge.")
    add("-q", "--qos", default="", help="Outside a job: the allocation's QoS.")
    add("-G", "--gpus", default="", help="GPUs in all: outside a job the allocation's; inside one the step's, "
        "shared out over its nodes (-n1 -G1: one GPU for the step's task).")
    add("--gpus-per-node", default="", help="GPUs on each node: outside a job the allocation's; inside one the "
        "step's, as --gres=gpu:N.")
    add("--mem", default="", help="Outside a job: memory on each node of the allocation.")
    add("--mem-per-cpu", default="", help="Outside a job: memory per CPU of the allocation.")
    add("--mem-per-gpu", default="", help="Outside a job: memory per GPU of the allocation.")
    add("--cpus-per-gpu", default="", help="Outside a job: CPUs per GPU of the allocation.")
    add("-i", "--input", default="", help="none: the tasks read /dev/null, as they do anyway (the only form "
        "taken; srun's default, its stdin to task 0, is not forwarded but under --pty).")
    add("--gres", default="", help="gpu[:TYPE]:N, GPUs on each node: outside a job the allocation's; inside one, "
        "the job's GPUs on the node (nothing to do) or, for one task per node, --gpus-per-task N.")
    add("command", nargs="...", help="The program and its arguments.")
    parser.bare_values.update({"-K": "1", "--kill-on-bad-exit": "1"})
    parser.ignored_values = {flag: flags[-1] for flags in IGNORED_VALUE_OPTIONS for flag in flags}
    parser.ignored_flags = {flag: flags[-1] for flags in IGNORED_FLAG_OPTIONS for flag in flags}
    parser.aliases = dict(OPTION_ALIASES)
    parser.slurm_names = frozenset(f"--{name}" for name in SRUN_OPTION_NAMES)
    parser.slurm_command = "srun"
    return parser


def _multi_prog(command: list[str], ntasks: int | None, pty: bool) -> list[str]:
    """srun --multi-prog FILE: the one command that runs each task's own line (garrison/cmdline/multiprog.py)."""
    from garrison.cmdline.multiprog import dispatcher

    if pty:
        raise UsageError("--multi-prog and --pty cannot go together")
    if len(command) != 1:
        raise UsageError("--multi-prog takes one configuration file and nothing after it")
    try:
        with open(command[0], encoding="utf-8") as config:
            text = config.read(1 << 20)
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"--multi-prog {command[0]}: cannot read it: {getattr(error, 'strerror', None) or error}") \
            from None
    return dispatcher(text, command[0], ntasks)


def _positive(value: int | None, option: str) -> int | None:
    if value is not None and value < 1:
        raise UsageError(f"{option} must be at least 1")
    return value


def _gpus_per_task(text: str | None) -> int | None:
    """--gpus-per-task N or TYPE:N (srun's spelling, as in sbatch): a step's GPUs are the job's, of its type."""
    if text is None:
        return None
    from garrison.cmdline.parsing import parse_gpu_request

    try:
        return parse_gpu_request(text)[1]
    except UsageError as problem:
        raise UsageError(f"--gpus-per-task: {problem}") from None


def _apply_tres_per_task(args: argparse.Namespace) -> None:
    """--tres-per-task's cpu and gres/gpu as -c and --gpus-per-task (the same to srun): given both ways, the
    counts must agree."""
    if args.tres_per_task is None:
        return
    from garrison.cmdline.parsing import parse_tres_per_task

    try:
        cpus, gpus = parse_tres_per_task(args.tres_per_task)
    except UsageError as problem:
        raise UsageError(f"--tres-per-task: {problem}") from None
    if cpus is not None:
        if args.cpus_per_task not in (None, cpus):
            raise UsageError(f"--tres-per-task: cpu={cpus} conflicts with -c {args.cpus_per_task}")
        args.cpus_per_task = cpus
    if gpus is not None:
        if args.gpus_per_task is not None and _gpus_per_task(args.gpus_per_task) != _gpus_per_task(gpus):
            raise UsageError(f"--tres-per-task: gres/gpu {gpus} conflicts with --gpus-per-task {args.gpus_per_task}")
        args.gpus_per_task = args.gpus_per_task or gpus


def _gres_gpus_per_task(args: argparse.Namespace, environ: dict[str, str], ntasks: int | None, nodes: int | None,
                        per_node: int | None) -> int | None:
    """srun's --gres=gpu[:TYPE]:N (N GPUs on each node of the step, shared by its tasks there; or its
    --gpus-per-node N or -G N, _step_gpus_per_node) as the step's --gpus-per-task, where the two mean the same:
    None when N is every GPU the job has on the node (a step without --gpus-per-task sees those already) or when
    there is no job yet (the allocation gets --gres); N when the step runs one task per node. Otherwise refused:
    a task would see fewer GPUs than under srun."""
    inside_job = bool(args.jobid or environ.get("SLURM_JOB_ID") or environ.get("GARRISON_JOB_ID"))
    option, given, gres_text = (_step_gpus_per_node(args, environ, ntasks, nodes) if inside_job
                                else ("--gres", args.gres, args.gres))
    if not gres_text:
        return None
    from garrison.cmdline.parsing import parse_gres, split_gpu_memory

    try:
        gres, _ = split_gpu_memory(gres_text)  # GPU memory: the allocation's (gsrun_alloc passes --gres on)
        if not gres:
            return None
        count = parse_gres(gres)[1]
    except UsageError as problem:
        raise UsageError(f"{option}: {problem}") from None
    if not inside_job or (count and environ.get("SLURM_GPUS_ON_NODE") == str(count)):
        return None
    if args.gpus_per_task is not None:
        raise UsageError(f"give either {option} or --gpus-per-task, not both")
    if count == 0:
        return 0  # --gres=none or gpu:0: a step that holds and sees no GPUs, beside those that do
    one_per_node = per_node == 1 or ntasks == 1 or (ntasks is not None and ntasks == nodes) or (
        ntasks is None and per_node is None)
    if not one_per_node:
        raise UsageError(f"{option}={given} with several tasks on a node: Garrison gives GPUs to tasks, not to "
                         f"nodes; give --gpus-per-task (or leave {option} out to see all of the job's GPUs)")
    return count


def _step_gpus_per_node(args: argparse.Namespace, environ: dict[str, str], ntasks: int | None,
                        nodes: int | None) -> tuple[str, str, str]:
    """(the option, its value, its request as --gres's gpu[:TYPE]:N) of a step's GPUs per node inside a job:
    --gres, or --gpus-per-node N, or -G/--gpus N shared out over the step's nodes (``srun -n1 -G1 python a.py &``,
    a GPU for each of several steps side by side, is the common case). ("--gres", "", "") when none is given."""
    given = [(name, value) for name, value in (("--gres", args.gres), ("--gpus-per-node", args.gpus_per_node),
                                               ("--gpus", args.gpus)) if value]
    if not given:
        return "--gres", "", ""
    if len(given) > 1:
        raise UsageError(f"give one of {' and '.join(name for name, _ in given)} for a step's GPUs")
    option, value = given[0]
    if option == "--gres":
        return option, value, value
    from garrison.cmdline.parsing import parse_gpu_request

    try:
        gpu_type, count = parse_gpu_request(value)
    except UsageError as problem:
        raise UsageError(f"{option}: {problem}") from None
    if option == "--gpus":
        step_nodes = nodes or (1 if ntasks == 1 else _env_int(environ, "SLURM_JOB_NUM_NODES") or 1)
        if count % step_nodes:
            raise UsageError(f"--gpus={value} over {step_nodes} nodes: give a multiple of the nodes, or "
                             "--gpus-per-task")
        count //= step_nodes
    return option, value, f"gpu:{gpu_type}:{count}" if gpu_type else f"gpu:{count}"


def _binding(text: str, option: str, names: tuple[str, ...], mapped: str) -> tuple[str, list[int]]:
    """--gpu-bind/--cpu-bind's value as (kind, numbers); ("", []) for srun's reporting words alone
    (``--cpu-bind=verbose``), which bind nothing."""
    reporting, comma, rest = text.partition(",")
    while reporting.strip().lower() in BIND_REPORTING:  # "verbose,cores" binds as "cores" does
        if not comma:
            return "", []
        text = rest
        reporting, comma, rest = text.partition(",")
    kind, _, arg = text.partition(":")
    kind = kind.strip().lower()
    if kind == mapped or kind == "single":
        try:
            numbers = [int(part) for part in arg.split(",") if part.strip()]
        except ValueError:
            raise UsageError(f"{option}={text}: expected numbers after {kind}:") from None
        if not numbers or any(n < 0 for n in numbers) or (kind == "single" and (len(numbers) != 1 or numbers[0] < 1)):
            raise UsageError(f"{option}={text}: expected {kind}:N{',N...' if kind == mapped else ''}")
        return kind, numbers
    if kind in names and not arg:
        return kind, []
    raise UsageError(f"{option}={text}: expected one of {', '.join(names)}, {mapped}:LIST"
                     + (", single:N" if option == "--gpu-bind" else ""))


def exported_environment(spec: str, environ: dict[str, str]) -> dict[str, str]:
    """--export: ALL (this environment), NONE (only SLURM_* and GARRISON_* variables, as srun keeps its own),
    or NAMES and NAME=VALUEs, with or without ALL."""
    parts = [part for part in spec.split(",") if part]
    if not parts:
        raise UsageError("--export: expected ALL, NONE or a list of variables")
    everything = parts[0].upper() == "ALL"
    if parts[0].upper() in ("ALL", "NONE"):
        parts = parts[1:]
    env = dict(environ) if everything else {k: v for k, v in environ.items() if k.startswith(("SLURM_", "GARRISON_"))}
    for part in parts:
        name, equals, value = part.partition("=")
        if not name or not (name[0].isalpha() or name[0] == "_") or not name.replace("_", "a").isalnum():
            raise UsageError(f"--export: {name!r} is not a variable name")
        if equals:
            env[name] = value
        elif name in environ:
            env[name] = environ[name]
    return env


def _job_id(given: str) -> int | None:
    """The job to run in, or None outside a job (gsrun then asks for an allocation first)."""
    text = given or os.environ.get("SLURM_JOB_ID") or os.environ.get("GARRISON_JOB_ID") or ""
    if not text:
        return None
    if not text.isdigit():
        raise CliError(f"--jobid {text!r}: expected a job number", EXIT_USAGE)
    return int(text)


def _env_int(environ: dict[str, str], name: str) -> int | None:
    value = environ.get(name, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def build_spec(args: argparse.Namespace, environ: dict[str, str]) -> dict[str, Any]:
    """The StepSpec's fields from the options, with srun's defaults from the job's environment."""
    if not args.command:
        raise UsageError("no command to run (gsrun [options] COMMAND [ARGS...])")
    if args.input not in ("", "none", os.devnull):
        raise UsageError(f"--input {args.input[:60]!r}: only --input=none is taken (the tasks read {os.devnull})")
    _apply_tres_per_task(args)
    ntasks = _positive(args.ntasks, "-n")
    nodes = _positive(args.nodes, "-N")
    per_node = _positive(args.ntasks_per_node, "--ntasks-per-node")
    per_gpu_given = _positive(args.ntasks_per_gpu, "--ntasks-per-gpu")
    if per_gpu_given is not None:
        if args.pty:
            raise UsageError("--pty runs one task: leave out --ntasks-per-gpu")
        gpus_here = _env_int(environ, "SLURM_GPUS_ON_NODE")
        if not gpus_here:
            raise UsageError("--ntasks-per-gpu: the job has no GPUs here (SLURM_GPUS_ON_NODE)")
        if ntasks is None and per_node is None:
            per_node = per_gpu_given * gpus_here  # as many tasks per node as N per GPU: every node's GPUs alike
    if ntasks is None and nodes is None and per_node is None and not args.pty:
        # Inside a job srun takes the job's -n and --ntasks-per-node as its own defaults (SLURM_NTASKS).
        ntasks, per_node = _env_int(environ, "SLURM_NTASKS"), _env_int(environ, "SLURM_NTASKS_PER_NODE")
    if args.pty and ntasks not in (None, 1):
        raise UsageError("--pty runs one task: leave out -n or give -n 1")
    if args.pty:
        ntasks, nodes, per_node = 1, 1, None
    from garrison.model.hostlist import expand_hostlist

    try:
        nodelist = expand_hostlist(args.nodelist) if args.nodelist else []
    except ValueError as exc:
        raise UsageError(f"-w: {exc}") from None
    gpu_bind, gpu_args = _binding(args.gpu_bind, "--gpu-bind", ("none", "closest"), "map_gpu") if args.gpu_bind \
        else ("", [])
    cpu_bind, cpu_args = _binding(args.cpu_bind, "--cpu-bind", ("none", "cores"), "map_cpu") if args.cpu_bind \
        else ("", [])
    cwd = os.path.abspath(args.chdir) if args.chdir else os.getcwd()
    argv = _multi_prog(args.command, ntasks, args.pty) if args.multi_prog else list(args.command)
    spec: dict[str, Any] = {
        "argv": argv, "env": exported_environment(args.export, environ), "cwd": cwd,
        "nodelist": list(nodelist), "gpu_bind": gpu_bind, "gpu_bind_arg": gpu_args, "cpu_bind": cpu_bind,
        "cpu_bind_arg": cpu_args, "label": args.label, "kill_on_bad_exit": args.kill_on_bad_exit == "1", "pty": args.pty,
        "unbuffered": args.unbuffered, "name": args.job_name,
    }
    gres_per_task = _gres_gpus_per_task(args, environ, ntasks, nodes, per_node)
    # Since Slurm 22.05 srun takes -c from SRUN_CPUS_PER_TASK, not from the job's SLURM_CPUS_PER_TASK.
    cpus_per_task = _positive(args.cpus_per_task, "-c")
    if cpus_per_task is None and environ.get("SRUN_CPUS_PER_TASK"):
        cpus_per_task = _env_int(environ, "SRUN_CPUS_PER_TASK")
        if cpus_per_task is None:
            raise UsageError(f"SRUN_CPUS_PER_TASK: expected a whole number of at least 1, got "
                             f"{environ['SRUN_CPUS_PER_TASK'][:40]!r}")
    if cpus_per_task is not None:
        spec["env"]["SLURM_CPUS_PER_TASK"] = str(cpus_per_task)  # the step's, as slurmstepd sets it
    per_gpu = per_gpu_given or _env_int(environ, "SLURM_NTASKS_PER_GPU")
    if not per_gpu and environ.get("SLURM_GPUS_PER_TASK") == "1":
        per_gpu = 1
    if per_gpu and not args.gpu_bind and gres_per_task is None and args.gpus_per_task is None:
        # A job of --ntasks-per-gpu N or --gpus-per-task=1 (sbatch exports SLURM_NTASKS_PER_GPU and
        # SLURM_GPUS_PER_TASK, srun's defaults) binds each task to its GPU, as srun does: CT_NVAE's
        # `--gpus-per-node=4 --ntasks-per-gpu=1` then `srun python ...` gave every task all four GPUs here, one
        # each under Slurm 22.05. The binding holds no GPUs, so steps started side by side still run.
        spec["gpu_bind"], spec["gpu_bind_arg"] = "single", [per_gpu]
    for name, value in (("ntasks", ntasks), ("nodes", nodes), ("ntasks_per_node", per_node),
                        ("gpus_per_task", gres_per_task if gres_per_task is not None
                         else _gpus_per_task(args.gpus_per_task)),
                        ("cpus_per_task", cpus_per_task)):
        if value is not None:
            spec[name] = value
    umask = os.umask(0)
    os.umask(umask)
    spec["umask"] = umask
    return spec


def task_failures(nodes: Sequence[str], ntasks: int, per_node: int | None, codes: Sequence[int]) -> list[str]:
    """srun's lines for the tasks that failed, once the step has ended: per node, the tasks alike on one line,
    ``node1: task 0: Exited with exit code 2``, ``node2: tasks 2-3: Killed`` (a task that died of signal N,
    recorded as 128+N, is named by the signal as strsignal names it)."""
    from garrison.model.arrayfold import index_ranges
    from garrison.model.taskblocks import block_counts

    if not nodes or len(codes) != ntasks:
        return []
    counts = block_counts(ntasks, len(nodes), per_node)
    lines: list[str] = []
    first = 0
    for node, count in zip(nodes, counts, strict=False):
        alike: dict[str, list[int]] = {}
        for task in range(first, first + count):
            code = codes[task]
            if code == 0:
                continue
            name = signal.strsignal(code - 128) if 128 < code < 128 + 65 else None
            alike.setdefault(name or f"Exited with exit code {code}", []).append(task)
        for outcome, tasks in alike.items():
            label = f"task {tasks[0]}" if len(tasks) == 1 else f"tasks {index_ranges(tasks)}"
            lines.append(f"{node}: {label}: {outcome}")
        first += count
    return lines


def _truncates(open_mode: str | None, environ: Mapping[str, str]) -> bool:
    """Whether -o/-e files are emptied first: --open-mode, else the job's (sbatch exports SLURM_OPEN_MODE "a" or
    "t", as srun reads it), else truncate, srun's default (Slurm's JobFileAppend=0), but on a rerun of a
    requeued job (SLURM_RESTART_COUNT), whose files are appended to as its batch log is (slurmstepd's rule)."""
    if open_mode is not None:
        return open_mode == "truncate"
    mode = environ.get("SLURM_OPEN_MODE", "").lower()
    if mode:
        return not mode.startswith("a")
    return environ.get("SLURM_RESTART_COUNT", "0") in ("", "0")


def _emptied(path: str) -> None:
    """Truncate (or create) ``path`` before it is opened for appending: every writer of it then appends (O_APPEND),
    so -o and -e naming one file, or several tasks' output in one, never overwrite each other."""
    with open(path, "wb"):
        pass


class OutputWriter:
    """The tasks' bytes onto our stdout/stderr (or -o/-e files), each line prefixed "N: " with --label.

    A -o/-e name with srun's patterns (``%j_%t_log.out``, as submitit gives it) is expanded once the step has
    started and its id is known; with %t (or %n, %N) each task gets a file of its own, all of them made then,
    as srun makes them. A plain name is opened at once, so a bad one fails before the step is asked for."""

    def __init__(self, label: bool, output: str, error: str, truncate: bool = False) -> None:
        self.label = label
        self.truncate = truncate  # --open-mode=truncate: each file emptied when it is opened (once per name)
        self.patterns = {1: output, 2: error}
        if truncate:
            for name in {output, error}:
                if name and "%" not in name:
                    _emptied(name)
        self.files: dict[int, Any] = {
            1: sys.stdout.buffer if not output else None if "%" in output else open(output, "ab"),  # noqa: SIM115
            2: sys.stderr.buffer if not error else None if "%" in error else open(error, "ab"),  # noqa: SIM115
        }
        self.task_files: dict[tuple[int, int], Any] = {}  # (task, stream) -> file, for per-task patterns
        self.opened: list[Any] = []  # the files begin() opened, each once
        self.at_line_start: dict[tuple[int, int], bool] = {}

    def begin(self, job_id: int, step_id: int, nodes: list[str], ntasks: int, per_node: int | None) -> None:
        """The step has started: expand the patterns and open their files (appending, as gsrun's plain -o)."""
        import pwd

        from garrison.model.outputpath import expand_output_pattern
        from garrison.model.taskblocks import block_counts

        counts = block_counts(ntasks, max(len(nodes), 1), per_node)
        node_of = [index for index, count in enumerate(counts) for _ in range(count)]
        try:
            user = pwd.getpwuid(os.getuid()).pw_name
        except KeyError:
            user = str(os.getuid())
        array_job, array_task = os.environ.get("SLURM_ARRAY_JOB_ID", ""), os.environ.get("SLURM_ARRAY_TASK_ID", "")
        opened: dict[str, Any] = {}

        def open_once(path: str) -> Any:
            if path not in opened:
                try:
                    if self.truncate:
                        _emptied(path)
                    opened[path] = open(path, "ab")  # noqa: SIM115 - closed by close()
                except OSError as exc:
                    raise CliError(f"cannot open {path}: {exc.strerror}") from None
                self.opened.append(opened[path])
            return opened[path]

        for stream, pattern in self.patterns.items():
            if self.files[stream] is not None:
                continue
            paths = []
            for task in range(ntasks if ntasks > 0 else 1):
                node = node_of[task] if task < len(node_of) else 0
                paths.append(expand_output_pattern(
                    pattern, job_id=job_id, rank=task, node_rank=node,
                    array_job_id=int(array_job) if array_job.isdigit() else None,
                    array_task_id=int(array_task) if array_task.isdigit() else None,
                    user=user, job_name=os.environ.get("SLURM_JOB_NAME", ""), step_id=step_id,
                    node_name=nodes[node] if node < len(nodes) else "",
                ))
            if len(set(paths)) == 1:
                self.files[stream] = open_once(paths[0])
                continue
            for task, path in enumerate(paths):
                self.task_files[(task, stream)] = open_once(path)

    def write(self, task: int, stream: int, data: bytes) -> None:
        out = self.task_files.get((task, stream)) or self.files.get(stream) or self.files[1]
        if out is None:  # output before the step's start (never sent): keep it rather than lose it
            out = sys.stdout.buffer if stream == 1 else sys.stderr.buffer
        if self.label:
            prefix = f"{task}: ".encode()
            key = (task, stream)
            pieces = []
            start = self.at_line_start.get(key, True)
            for line in data.splitlines(keepends=True):
                pieces.append(prefix + line if start else line)
                start = line.endswith(b"\n")
            self.at_line_start[key] = start
            data = b"".join(pieces)
        out.write(data)
        out.flush()

    def close(self) -> None:
        for handle in self.opened:
            handle.close()
        for stream, handle in self.files.items():
            if handle is None or handle in self.opened:
                continue
            if handle not in (sys.stdout.buffer, sys.stderr.buffer):
                handle.close()
            elif stream == 1:
                handle.flush()


class StepSession:
    """One step's streams: requests from a queue, answers read by a thread, signals handled here.

    The step outlives a stream: when the stream breaks after the step has started (the controller restarted,
    the link reset), the session opens another and takes the step up again (StepAttach), saying how far it has
    each stream's output, so that output is neither lost nor printed twice, and goes on as before. Signals and
    input that arrive meanwhile wait for the new stream. It gives up after ``REATTACH_S``."""

    def __init__(self, client: Client, start: Any, pb: Any) -> None:
        self.pb = pb
        self.start = pb.StepClientMessage(start=start)
        self.requests: queue.Queue[Any] = queue.Queue()
        # (stream generation, kind, answer): what an older stream's threads put here after it broke is dropped
        self.answers: queue.Queue[tuple[int, str, Any]] = queue.Queue()
        self.generation = 0
        self.client = client
        self.interrupts: list[float] = []
        self.step_name = ""
        self.step_key: tuple[int, int] | None = None
        self.done = False
        self.have: dict[tuple[int, int], int] = {}  # (task, stream) -> how far its output has been written
        self.have_unknown = False  # output came without offsets: how far cannot be said
        self.lost_since: float | None = None
        self.retry_at: float | None = None
        self.retries = 0

    def _outgoing(self, first: Any, requests: queue.Queue[Any]) -> Any:
        yield first
        while True:
            message = requests.get()
            if message is None:
                return
            yield message

    def _read(self, generation: int, call: Any) -> None:
        import grpc

        try:
            for answer in call:
                self.answers.put((generation, "message", answer))
            self.answers.put((generation, "end", None))
        except grpc.RpcError as exc:
            self.answers.put((generation, "error", exc))

    def _read_local(self, generation: int, sock: _socket.socket) -> None:
        from garrison.cli.client import _error_for

        def exactly(count: int) -> bytes:
            data = b""
            while len(data) < count:
                chunk = sock.recv(count - len(data))
                if not chunk:
                    raise ConnectionResetError
                data += chunk
            return data

        try:
            while True:
                (length,) = HEADER.unpack(exactly(HEADER.size))
                frame = exactly(length)
                status, body = frame[0], frame[1:]
                if status == OK:
                    self.answers.put((generation, "message", self.pb.StepServerMessage.FromString(body)))
                elif status == STREAM_END:
                    self.answers.put((generation, "end", None))
                    return
                else:
                    error = _error_for(status, body.decode(errors="replace"), self.client.address)
                    kind = "local-busy" if status == RESOURCE_EXHAUSTED else "refused"
                    self.answers.put((generation, kind, (status, error)))
                    return
        except OSError:
            self.answers.put((generation, "lost", CliError("the controller closed the step's stream before the step ended")))

    def _over_grpc(self, first: Any) -> None:
        from garrison.protos.v1 import garrison_pb2_grpc

        call = self.client.stream_call(garrison_pb2_grpc.ControllerStub, "RunStep", self._outgoing(first, self.requests))
        threading.Thread(target=self._read, args=(self.generation, call), daemon=True).start()

    def _write_local(self, sock: _socket.socket, requests: queue.Queue[Any]) -> None:
        while True:
            message = requests.get()
            if message is None:
                return
            body = message.SerializeToString()
            try:
                sock.sendall(HEADER.pack(len(body)) + body)
            except OSError:
                return

    def _open(self, first: Any) -> None:
        """A new stream whose first message is ``first``; the requests not yet sent on the last one go on it."""
        self._new_requests()
        # On the controller's host the local socket (no grpc to import: a fast start); elsewhere gRPC.
        local = self.client.open_local_stream("RunStep", first.SerializeToString())
        if local is not None:
            threading.Thread(target=self._read_local, args=(self.generation, local), daemon=True).start()
            threading.Thread(target=self._write_local, args=(local, self.requests), daemon=True).start()
        else:
            self._over_grpc(first)

    def _new_requests(self) -> None:
        """A request queue for a new stream: what the last one had not sent moves to it, and the last one's writer
        (gRPC's request iterator, or the local socket's thread) is told to end."""
        self.generation += 1
        old, self.requests = self.requests, queue.Queue()
        while True:
            try:
                message = old.get_nowait()
            except queue.Empty:
                break
            if message is not None:
                self.requests.put(message)
        old.put(None)

    def _attach_message(self) -> Any:
        assert self.step_key is not None
        attach = self.pb.StepAttach(job_id=self.step_key[0], step_id=self.step_key[1], have_unknown=self.have_unknown)
        for (task, stream), offset in sorted(self.have.items()):
            attach.have.append(self.pb.StepStreamOffset(task=task, stream=stream, offset=offset))
        return self.pb.StepClientMessage(attach=attach)

    def _stream_lost(self, error: CliError) -> None:
        """The stream broke: before the step started, that is the step's failure; after, try again shortly."""
        if self.step_key is None or self.done:
            raise error
        now = time.monotonic()
        if self.lost_since is None:
            self.lost_since = now
            self._say(f"lost the controller's stream of step {self.step_name} ({error}); taking it up again")
        elif now - self.lost_since > REATTACH_S:
            raise CliError(f"could not take step {self.step_name} up again within {REATTACH_S:.0f} s: {error}")
        self.retries += 1
        self.retry_at = now + min(REATTACH_MAX_DELAY_S, REATTACH_FIRST_DELAY_S * 2 ** min(self.retries - 1, 6))

    def _retry_due(self) -> None:
        if self.retry_at is None or time.monotonic() < self.retry_at:
            return
        self.retry_at = None
        try:
            self._open(self._attach_message())
        except CliError as error:  # the controller is not back yet (its endpoints could not be asked)
            self._stream_lost(error)

    def run(self, writer: OutputWriter, pty_mode: bool) -> int:
        self._open(self.start)
        while True:
            try:
                generation, kind, answer = self.answers.get(timeout=0.2)
            except queue.Empty:
                self._retry_due()
                continue
            if generation != self.generation:
                continue  # from a stream given up already
            if kind == "local-busy" and not self.step_name:
                # The local socket's per-user limits (many gsruns at once): gRPC takes the step instead.
                self._new_requests()
                self._over_grpc(self.start)
                continue
            if kind in ("local-busy", "refused"):
                status, error = answer
                if self.lost_since is not None and status in TRANSIENT_STATUSES:
                    self._stream_lost(error)
                    continue
                raise error
            if kind == "error":
                if self.step_key is not None and answer.code().value[0] in TRANSIENT_STATUSES:
                    self._stream_lost(self.client.error_of(answer))
                    continue
                raise self.client.error_of(answer)
            if kind == "lost":
                self._stream_lost(answer)
                continue
            if kind == "end":
                self._stream_lost(CliError("the controller ended the step's stream before the step ended"))
                continue
            which = answer.WhichOneof("kind")
            if which == "started":
                started = answer.started
                if started.attached:
                    self.lost_since, self.retries = None, 0
                    self._say(f"took step {self.step_name} up again")
                    continue
                self.step_name = f"{started.job_id}.{started.step_id}"
                self.step_key = (started.job_id, started.step_id)
                self.step_shape = (list(started.nodes), started.ntasks)
                writer.begin(started.job_id, started.step_id, list(started.nodes), started.ntasks,
                             self.start.start.ntasks_per_node or None)
                if pty_mode:
                    self._start_terminal()
            elif which == "output":
                output = answer.output
                if output.HasField("offset"):
                    self.have[(output.task, output.stream)] = output.offset + len(output.data)
                else:
                    self.have_unknown = True
                writer.write(output.task, output.stream, output.data)
            elif which == "notice":
                self._say(answer.notice)
            elif which == "ended":
                self.done = True
                self.requests.put(None)
                ended = answer.ended
                if ended.state == "CANCELLED" or ended.reason:
                    self._say(f"step {self.step_name} {ended.state.lower()}"
                              + (f": {ended.reason}" if ended.reason else ""))
                elif self.step_shape is not None:
                    nodes, ntasks = self.step_shape
                    for line in task_failures(nodes, ntasks, self.start.start.ntasks_per_node or None,
                                              list(ended.task_exit_codes)):
                        self._say(f"error: {line}")
                return int(ended.exit_code)

    def _say(self, text: str) -> None:
        sys.stderr.write(f"{PROG}: {text}\r\n" if self.raw else f"{PROG}: {text}\n")
        sys.stderr.flush()

    raw = False
    step_shape: tuple[list[str], int] | None = None  # the step's nodes and task count, once it has started

    # -- signals --------------------------------------------------------------------------------------

    def on_signal(self, signum: int, frame: object) -> None:
        if signum == signal.SIGINT:
            now = time.monotonic()
            self.interrupts = [t for t in self.interrupts if now - t < INTERRUPT_WINDOW_S] + [now]
            if len(self.interrupts) == 1:
                self._say(f"interrupt (one more within 1 sec to abort): step {self.step_name or '?'} is running")
            elif len(self.interrupts) == 2:
                self._say(f"sending Ctrl-C to step {self.step_name or '?'} and cancelling it")
                self.requests.put(self.pb.StepClientMessage(signal=int(signal.SIGINT)))
                self.requests.put(self.pb.StepClientMessage(cancel=True))
            else:
                self._say("abort: not waiting for the step's tasks")
                os._exit(128 + int(signal.SIGINT))
            return
        if signum == signal.SIGWINCH:
            self._send_window()
            return
        self.requests.put(self.pb.StepClientMessage(signal=int(signum)))

    # -- --pty ----------------------------------------------------------------------------------------

    def _send_window(self) -> None:
        try:
            size = os.get_terminal_size(0)
        except OSError:
            return
        self.requests.put(self.pb.StepClientMessage(window=self.pb.StepWindowSize(rows=size.lines, cols=size.columns)))

    def _start_terminal(self) -> None:
        import termios
        import tty

        if os.isatty(0):
            self.saved = termios.tcgetattr(0)
            tty.setraw(0, termios.TCSADRAIN)  # not TCSAFLUSH: keep what was typed ahead
            self.raw = True
            self._send_window()
        threading.Thread(target=self._pump_stdin, daemon=True).start()

    def _pump_stdin(self) -> None:
        while not self.done:
            try:
                data = os.read(0, 4096)
            except OSError:
                return
            if not data:
                return
            self.requests.put(self.pb.StepClientMessage(stdin=data))

    def restore_terminal(self) -> None:
        if self.raw:
            import termios

            termios.tcsetattr(0, termios.TCSADRAIN, self.saved)
            self.raw = False


def main(argv: list[str] | None = None) -> None:
    args_list = sys.argv[1:] if argv is None else argv
    try:
        parser = _parser()
        args = parser.parse_args(args_list)
        spec_fields = build_spec(args, dict(os.environ))
        if parser.ignored and "--quiet" not in parser.ignored:
            print(f"{PROG}: warning: ignoring {', '.join(parser.ignored)}: Garrison does not act on "
                  f"{'it' if len(parser.ignored) == 1 else 'them'}", file=sys.stderr)
        job_id = _job_id(args.jobid)
    except UsageError as exc:
        fail(PROG, CliError(str(exc), EXIT_USAGE))
    except CliError as exc:
        fail(PROG, exc)
    from garrison.protos.v1 import garrison_pb2 as pb

    writer = OutputWriter(args.label, args.output, args.error, truncate=_truncates(args.open_mode, os.environ))
    session: StepSession | None = None
    allocation: Granted | None = None
    code = 1
    try:
        with Client() as client:
            if job_id is None:
                from garrison.cli.gsrun_alloc import AllocationInterrupted, interruptible, request_allocation

                interruptible()
                try:
                    allocation = request_allocation(client, args)
                except AllocationInterrupted:
                    raise CliError("interrupted while waiting for an allocation") from None
                job_id = allocation.job_id
                # The tasks get the allocation's job variables, as srun's tasks get those of the one it made
                # (what the step's own variables name, per node, is set over them on each node).
                spec_fields["env"] = {**spec_fields["env"], **allocation.environment}
                allocation.keep_renewed()
            start = pb.StepSpec(job_id=job_id, **spec_fields)
            session = StepSession(client, start, pb)
            handlers = [signal.SIGINT, *FORWARDED] + ([signal.SIGWINCH] if args.pty else [])
            for signum in handlers:
                signal.signal(signum, session.on_signal)
            code = session.run(writer, args.pty)
    except CliError as exc:
        if session is not None:
            session.restore_terminal()
        fail(PROG, exc)
    finally:
        if session is not None:
            session.restore_terminal()
        writer.close()
        if allocation is not None:
            from garrison.cli.gsrun_alloc import release_allocation

            allocation.stop_renewing()
            with Client() as releasing:
                release_allocation(releasing, allocation.job_id, code)
    sys.exit(code)
