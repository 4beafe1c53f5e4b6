"""sbatch: gsub under Slurm's name (docs/slurm.md#slurms-command-names).

The same parser, directives and submission as gsub, with sbatch's differences: the default output file is
``slurm-%j.out`` (``slurm-%A_%a.out`` for an array task), a script read from standard input is named
``sbatch``, every error exits 1, as sbatch's do, and -Q/--quiet silences everything but errors (and
--parsable's id).
"""

from __future__ import annotations

from garrison.cli.client import run_command
from garrison.cli.fastpath import SBATCH as PROG
from garrison.cli.fastpath import SBATCH_DEFAULT_ARRAY_OUTPUT as DEFAULT_ARRAY_OUTPUT
from garrison.cli.fastpath import SBATCH_DEFAULT_OUTPUT as DEFAULT_OUTPUT
from garrison.cli.fastpath import SBATCH_USAGE_EXIT
from garrison.cli.gsub import submit
from garrison.cli.slurm import answer_version


def _sbatch(args: list[str]) -> None:
    submit(args, PROG, usage_exit=SBATCH_USAGE_EXIT, default_output=DEFAULT_OUTPUT,
           default_array_output=DEFAULT_ARRAY_OUTPUT, honour_quiet=True)


def main(argv: list[str] | None = None) -> None:
    answer_version(argv)
    run_command(_sbatch, argv)


if __name__ == "__main__":
    main()
