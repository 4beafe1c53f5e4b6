"""Slurm's command names (sbatch, srun, salloc, squeue, scancel, sinfo, sacct, scontrol, sstat) as thin layers
over the g* commands and the same client code.

They are installed as ``garrison-<name>`` console scripts, never under Slurm's own names, so they cannot clash
with a real Slurm on the same host; ``garrison slurm-path`` prints a directory of ``<name>`` links to them that
a shell (or every job and step, through the agent) puts first on its PATH.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # not typing's: every Slurm name imports this package, srun among them, where it counts
if TYPE_CHECKING:
    from collections.abc import Sequence

# The Slurm release whose commands the Slurm names were checked against, side by side (../shared/slurm-anchor):
# what `sbatch --version` and the others print, in Slurm's words, for tools that ask which Slurm they talk to.
SLURM_RELEASE = "22.05.8"


def answer_version(argv: Sequence[str] | None) -> None:
    """``-V``/``--version`` alone, as Slurm's commands take it: print ``slurm 22.05.8 (garrison X)``, exit 0."""
    words = sys.argv[1:] if argv is None else list(argv)
    if words not in (["-V"], ["--version"]):
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("garrison")
    except PackageNotFoundError:
        ours = "unknown"
    print(f"slurm {SLURM_RELEASE} (garrison {ours})")
    sys.exit(0)
