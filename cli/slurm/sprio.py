"""sprio under its own name: pending jobs' priorities and their weighted factors, in Slurm's layout.

The same data as ``gqueue --priority`` (the Admin service's QueueDetails, from the last scheduling cycle). As in
sprio, each factor is shown weighted (what it adds to the priority), ``-n`` shows them normalised to [0, 1],
``-w`` prints the weights alone, and a factor whose weight is 0 gets no column unless ``-o`` asks for it.
Slurm's SITE is the admin's adjustment (``gcontrol update --priority``) and NICE the owner's ``--nice``;
Garrison's own time-limit factor has the column TIMELIMIT (format letter ``%L``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from garrison.cli.client import EXIT_FAILURE, Client, CliError, fail, run_command
from garrison.cli.slurm import answer_version
from garrison.cli.slurm.fields import PercentFormat, sort_by_letters, split_list
from garrison.cmdline.argparser import Parser, UsageError

PROG = "sprio"
# Slurm 22.05's default and -l formats, Garrison's time-limit factor after QOS
DEFAULT_FORMAT = "%.15i %9r %.10Y %.10S %.10A %.10F %.10J %.10P %.10Q %.10L %.6N"
LONG_FORMAT = "%.15i %9r %.8u %.10Y %.10S %.10A %.10F %.10J %.10P %.10Q %.10L %.11N"
HEADERS = {
    "i": "JOBID", "r": "PARTITION", "u": "USER", "Y": "PRIORITY", "y": "PRIORITY", "S": "SITE", "A": "AGE",
    "a": "AGE", "F": "FAIRSHARE", "f": "FAIRSHARE", "J": "JOBSIZE", "j": "JOBSIZE", "P": "PARTITION",
    "p": "PARTITION", "Q": "QOS", "q": "QOS", "L": "TIMELIMIT", "l": "TIMELIMIT", "N": "NICE", "c": "ACCOUNT",
}
# The weighted factor letters (upper case, as sprio's) and the PriorityFactors field each shows; the lower-case
# letter of each is the factor normalised, as sprio's.
FACTORS = {"A": "age", "F": "fair_share", "J": "job_size", "P": "partition", "Q": "qos", "L": "time_limit"}
WEIGHT_LETTERS = tuple(FACTORS)


def parser() -> Parser:
    p = Parser(prog=PROG, add_help=False,
               description="Pending jobs' priority factors, as Slurm's sprio shows them (docs/reference.md).")
    p.add_argument("--help", action="help", help="Show this message and exit.")
    p.add_argument("-j", "--jobs", dest="jobs", action="append", default=[])
    p.add_argument("-u", "--user", dest="users", action="append", default=[])
    p.add_argument("-p", "--partition", dest="partitions", action="append", default=[])
    p.add_argument("-A", "--account", dest="accounts", action="append", default=[])
    p.add_argument("-o", "--format", dest="format", default=None)
    p.add_argument("-h", "--noheader", action="store_true")
    p.add_argument("-l", "--long", action="store_true")
    p.add_argument("-n", "--norm", action="store_true")
    p.add_argument("-w", "--weights", action="store_true")
    p.add_argument("-S", "--sort", default=None)
    p.add_argument("-M", "--clusters", default=None)  # one cluster here
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def _layout(args: Any, weights: Any) -> PercentFormat:
    if args.format is not None:
        return PercentFormat(args.format, HEADERS)
    text = LONG_FORMAT if args.long else DEFAULT_FORMAT
    for letter, name in FACTORS.items():  # as sprio: no column for a factor that weighs nothing
        if not getattr(weights, name):
            text = " ".join(part for part in text.split(" ") if not part.endswith(letter))
    return PercentFormat(text, HEADERS)


def _value(detail: Any, weights: Any, normalised: bool) -> Callable[[str], str]:
    job, factors = detail.job, detail.factors
    known = detail.HasField("factors")

    def value(key: str) -> str:
        if key == "i":
            return job.display_id
        if key == "r":
            return job.partition
        if key == "u":
            return job.user
        if key == "c":
            return job.account
        if key in ("Y", "y"):
            return str(detail.priority) if detail.HasField("priority") else "N/A"
        if not known:
            return "N/A"
        if key == "S":
            return str(factors.admin)
        if key == "N":
            return str(factors.nice)
        name = FACTORS.get(key.upper())
        if name is None:
            return ""
        factor = getattr(factors, name)
        if normalised or key.islower():
            return f"{factor:.7f}"
        return str(round(getattr(weights, name) * factor))

    return value


def weights_line(layout: PercentFormat, weights: Any) -> str:
    """``-w``: the line sprio prints under the header, ``Weights`` in the JOBID column."""
    def value(key: str) -> str:
        if key == "i":
            return "Weights"
        name = FACTORS.get(key.upper())
        return str(getattr(weights, name)) if name is not None else ""

    return layout.line(value)


def sprio_lines(response: Any, args: Any) -> list[str]:
    layout = _layout(args, response.weights)
    if args.weights:
        return ([layout.header()] if not args.noheader else []) + [weights_line(layout, response.weights)]
    details = list(response.jobs)
    if args.sort:
        details = _sorted(details, args.sort)
    return layout.render([_value(d, response.weights, args.norm) for d in details], header=not args.noheader)


def _sorted(details: Sequence[Any], spec: str) -> list[Any]:
    """-S [-]LETTER,...: i (job id), u (user), r (partition), y/Y (priority); ``-`` descending."""
    keys: dict[str, Callable[[Any], Any]] = {
        "i": lambda d: d.job.job_id, "u": lambda d: d.job.user, "r": lambda d: d.job.partition,
        "y": lambda d: d.priority, "Y": lambda d: d.priority,
    }
    return sort_by_letters(details, spec, keys, lambda letter: f"-S: cannot sort by {letter!r} (i, u, r or y)")


def sprio(argv: list[str]) -> None:
    try:
        args = parser().parse_args(argv)
        if args.format is not None:
            PercentFormat(args.format, HEADERS)  # a bad format is a usage error before asking anything
        if args.sort:
            _sorted([], args.sort)
    except UsageError as exc:
        fail(PROG, CliError(str(exc), EXIT_FAILURE))
    from garrison.protos.v1 import admin_pb2 as adminpb
    from garrison.protos.v1 import admin_pb2_grpc

    request = adminpb.QueueDetailsRequest(users=split_list(args.users), job_ids=split_list(args.jobs),
                                          partitions=split_list(args.partitions), accounts=split_list(args.accounts))
    try:
        with Client() as client:
            response = client.service_call(admin_pb2_grpc.AdminStub, "QueueDetails", request)
    except CliError as exc:
        fail(PROG, exc)
    try:
        lines = sprio_lines(response, args)
    except UsageError as exc:
        fail(PROG, CliError(str(exc), EXIT_FAILURE))
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    answer_version(argv)
    run_command(sprio, argv)


if __name__ == "__main__":
    main()
