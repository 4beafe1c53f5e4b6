"""Where Slurm's command names (sbatch, srun, ...) live: a directory of links to Garrison's ``garrison-<name>``
console scripts, kept beside the installation so that it never clashes with a real Slurm on the same host.

``garrison slurm-path`` prints it (``export PATH="$(garrison slurm-path):$PATH"`` turns the names on for a
shell; a site puts that line in /etc/profile.d), and the node agent puts it first on the PATH of every job,
step and allocation it starts, as a Slurm user's script expects ``srun`` and ``scontrol`` to be there.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

# Slurm's user commands Garrison answers to, each a module of garrison.cli.slurm and a garrison-<name> script.
SLURM_COMMANDS = ("sbatch", "srun", "salloc", "squeue", "scancel", "sinfo", "sacct", "scontrol", "sstat", "sprio")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def scripts_dir() -> Path:
    """The directory of this installation's console scripts (a venv's bin/, or /usr/local/bin)."""
    return Path(sys.executable).parent


def slurm_path_dir(bin_dir: Path | None = None) -> Path:
    """The links' directory for the installation whose scripts are in ``bin_dir``: ``../libexec/garrison-slurm``,
    outside every PATH until someone asks for it."""
    return (bin_dir or scripts_dir()).parent / "libexec" / "garrison-slurm"


def ensure_slurm_path(bin_dir: Path | None = None) -> Path | None:
    """Make (or bring up to date) the directory of links, one per Slurm command whose ``garrison-<name>`` script
    is installed, and return it; None when it does not exist and cannot be made here (a user without write
    access to the installation, before its admin or agent made it)."""
    bin_dir = bin_dir or scripts_dir()
    directory = slurm_path_dir(bin_dir)
    try:
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        for name in SLURM_COMMANDS:
            target = bin_dir / f"garrison-{name}"
            link = directory / name
            if not target.exists():
                if link.is_symlink():
                    link.unlink()
                continue
            if link.is_symlink() and os.readlink(link) == str(target):
                continue
            # Made beside and renamed over: a shell running `srun` at this moment sees the old link or the new.
            temporary = directory / f".{name}.{os.getpid()}"
            if temporary.is_symlink():
                temporary.unlink()
            temporary.symlink_to(target)
            os.replace(temporary, link)
    except OSError:
        return directory if directory.is_dir() else None
    return directory


def with_slurm_path(env: Mapping[str, str], directory: str | None) -> dict[str, str]:
    """``env`` with ``directory`` first on its PATH (once), as every job and step gets it; unchanged for None."""
    result = dict(env)
    if not directory:
        return result
    rest = [entry for entry in result.get("PATH", DEFAULT_PATH).split(":") if entry and entry != directory]
    result["PATH"] = ":".join([directory, *rest])
    return result
