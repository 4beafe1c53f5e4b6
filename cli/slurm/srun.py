"""srun: gsrun under Slurm's name (docs/slurm.md#slurms-command-names).

The same options and behaviour as gsrun: inside a job it runs a step of it; outside one it first asks for an
allocation, runs the step in it and gives it back. Messages say ``srun:``.
"""

from __future__ import annotations

from garrison.cli import gsrun, gsrun_alloc
from garrison.cli.slurm import answer_version

PROG = "srun"
REFUSED_EXIT = 1  # srun's status when its allocation is refused ("Unable to allocate resources")


def main(argv: list[str] | None = None) -> None:
    answer_version(argv)
    # gsrun's messages name the command through these module names; this process is srun's alone.
    gsrun.PROG = gsrun_alloc.PROG = PROG
    gsrun_alloc.REFUSED_EXIT = REFUSED_EXIT
    gsrun.main(argv)


if __name__ == "__main__":
    main()
