"""srun --multi-prog (garrison/cmdline/multiprog.py): the file's lines become one sh program that execs each
task's own line; run here with sh for each task number, as the step's tasks run it."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from garrison.cmdline.argparser import UsageError
from garrison.cmdline.multiprog import dispatcher

CONFIG = """\
# task 0 is the server; '*' covers whatever the other lines do not name
0      echo server "%t" 'with spaces'
1-3,6  echo worker=%t offset=%o
*      echo rest-%t-%o
"""


def run_task(argv: list[str], task: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env={**os.environ, "SLURM_PROCID": str(task)}, capture_output=True, text=True,
                          timeout=30)


@pytest.mark.parametrize(("task", "line"), [
    (0, "server 0 with spaces"),
    (1, "worker=1 offset=0"),
    (3, "worker=3 offset=2"),
    (6, "worker=6 offset=3"),  # the offset counts on across the line's ranges
    (4, "rest-4-4"),
])
def test_each_task_runs_its_own_line(task: int, line: str) -> None:
    done = run_task(dispatcher(CONFIG, "mp.conf", ntasks=8), task)
    assert (done.returncode, done.stdout) == (0, line + "\n"), done.stderr


def test_a_task_no_line_names_fails_with_a_message_and_a_step_that_would_have_one_is_refused() -> None:
    argv = dispatcher("0-1 true\n", "mp.conf")  # no -n known: checked when the task runs
    done = run_task(argv, 2)
    assert done.returncode == 1 and done.stderr == "srun: error: --multi-prog mp.conf: no program for task 2\n"
    with pytest.raises(UsageError, match="no program for task 2 of 4"):
        dispatcher("0-1 true\n3 true\n", "mp.conf", ntasks=4)


def test_the_program_is_execd_so_its_exit_code_is_the_tasks() -> None:
    argv = dispatcher("0 sh -c 'exit 7'\n1 /bin/true\n", "mp.conf", ntasks=2)
    assert run_task(argv, 0).returncode == 7 and run_task(argv, 1).returncode == 0


@pytest.mark.parametrize(("text", "message"), [
    ("0-1 a\n1 b\n", "line 2: task 1 is named twice"),
    ("0 a\n* b\n* c\n", "line 3: a second '*' line"),
    ("x-2 a\n", "line 1: invalid task ranks 'x-2'"),
    ("3-1 a\n", "line 1: invalid task range '3-1'"),
    ("0\n", "line 1: expected task ranks and a program"),
    ("0 'unclosed\n", "line 1: No closing quotation"),
    ("# only a comment\n\n", "no task has a program"),
])
def test_bad_files_are_one_line_errors(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=re.escape(message)) as caught:
        dispatcher(text, "mp.conf")
    assert "\n" not in str(caught.value)


def test_a_tasks_program_gets_the_exported_shell_functions() -> None:
    """Lmod's `module` is an exported bash function (BASH_FUNC_module%%): the dispatcher passes it on to the
    task's program, as srun's tasks have it (dash, as /bin/sh, would drop it)."""
    argv = dispatcher("* bash -c 'mymodule load %t'\n", "mp.conf", ntasks=2)
    done = subprocess.run(argv, env={**os.environ, "SLURM_PROCID": "1",
                                     "BASH_FUNC_mymodule%%": '() {  echo "module $*"\n}'},
                          capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout) == (0, "module load 1\n"), done.stderr
