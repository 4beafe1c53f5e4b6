"""galloc's command line: gsub's resource options, then the command to run on this host."""

from __future__ import annotations

import pytest

from garrison.cli.galloc import input_environment, parse_allocation, waiting_line
from garrison.cmdline.parsing import UsageError
from garrison.model.jobspec import LaunchMode

ENV = {"SHELL": "/bin/bash", "HOME": "/home/alice", "PATH": "/usr/bin"}


def test_options_then_the_command_with_its_own_options() -> None:
    request = parse_allocation(["-N", "2", "-G", "2", "-t", "30", "python", "-u", "train.py", "-N", "9"], ENV, "/w")
    assert request.command == ("python", "-u", "train.py", "-N", "9")
    spec = request.spec
    assert (spec.nodes, spec.gpus, spec.time_limit_s) == (2, 2, 1800)
    assert spec.launch == LaunchMode.ALLOCATION and spec.script is None and spec.command == ()
    assert spec.name == "python" and spec.workdir == "/w" and spec.env == ENV


def test_no_command_is_the_users_shell_and_a_double_dash_ends_the_options() -> None:
    assert parse_allocation(["-G", "1"], ENV, "/w").command == ()
    assert parse_allocation(["-G", "1"], ENV, "/w").spec.name == "bash"
    request = parse_allocation(["-G", "1", "--", "-weird-program"], ENV, "/w")
    assert request.command == ("-weird-program",) and request.spec.gpus == 1
    assert parse_allocation(["-J", "dev", "sleep", "1"], ENV, "/w").spec.name == "dev"


def test_sallocs_input_variables_are_read_and_sbatchs_are_not() -> None:
    env = {**ENV, "SALLOC_PARTITION": "debug", "SBATCH_ACCOUNT": "batchonly", "SALLOC_TIMELIMIT": "5"}
    spec = parse_allocation(["true"], env, "/w").spec
    assert (spec.partition, spec.account, spec.time_limit_s) == ("debug", None, 300)
    assert input_environment({"GALLOC_QOS": "high", "SALLOC_QOS": "low"})["GSUB_QOS"] == "high"


@pytest.mark.parametrize("option", [["--array", "1-3"], ["--wrap", "true"], ["--launch", "node"], ["-o", "x"],
                                    ["--test-only"]])
def test_batch_only_options_are_refused_in_one_line(option: list[str]) -> None:
    with pytest.raises(UsageError, match="is not a galloc option"):
        parse_allocation([*option, "true"], ENV, "/w")


def test_bad_values_get_gsubs_errors() -> None:
    with pytest.raises(UsageError, match="--gpus"):
        parse_allocation(["-G", "nine", "true"], ENV, "/w")


def test_the_waiting_line() -> None:
    import time

    from garrison.protos.v1 import garrison_pb2 as pb

    waiting = pb.AllocationStatusReply(position=3, estimated_start=1_000_060.0, now=1_000_000.0, reason="Resources")
    clock = time.strftime("%H:%M", time.localtime(1_000_060))
    assert waiting_line(waiting) == f"waiting for resources: position 3, estimated start {clock}"
    unplanned = pb.AllocationStatusReply(position=1, now=1_000_000.0, reason="Priority")
    assert waiting_line(unplanned) == "waiting for resources: position 1, no estimated start yet (Priority)"


def test_help_is_gallocs_usage_over_gsubs_options() -> None:
    from garrison.cli.galloc import allocation_help
    from garrison.cmdline.submission import HelpRequested

    with pytest.raises(HelpRequested) as asked:
        parse_allocation(["--help"], ENV, "/w")
    text = allocation_help(asked.value.text)
    assert text.startswith("usage: galloc [OPTIONS] [COMMAND [ARGS...]]\n")
    assert "--gpus-per-node" in text and "SCRIPT" not in text and "script_args" not in text
