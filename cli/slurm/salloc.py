"""salloc: galloc under Slurm's name (docs/slurm.md#slurms-command-names).

The same options and behaviour as galloc: wait for an allocation, run the command (default ``$SHELL``) on
this host with its variables and Slurm's command names first on its PATH, give the allocation back when it
ends. Messages say ``salloc:``.
"""

from __future__ import annotations

from garrison.cli import galloc
from garrison.cli.slurm import answer_version

PROG = "salloc"
REFUSED_EXIT = 1  # salloc's status when its allocation is refused ("Job submit/allocate failed")


def main(argv: list[str] | None = None) -> None:
    answer_version(argv)
    galloc.PROG = PROG  # galloc's messages and default job name use this module name; this process is salloc's
    galloc.REFUSED_EXIT = REFUSED_EXIT
    galloc.main(argv)


if __name__ == "__main__":
    main()
