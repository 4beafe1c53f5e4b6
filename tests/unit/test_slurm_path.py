"""garrison.slurmpath: the directory of Slurm's command names, and the PATH every job and step gets."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from garrison.slurmpath import SLURM_COMMANDS, ensure_slurm_path, slurm_path_dir, with_slurm_path


def test_links_only_installed_commands_and_follows_changes(tmp_path: Path) -> None:
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "garrison-sbatch").write_text("#!/bin/sh\necho sbatch\n")
    directory = ensure_slurm_path(bin_dir)
    assert directory == slurm_path_dir(bin_dir) == tmp_path / "venv" / "libexec" / "garrison-slurm"
    assert sorted(os.listdir(directory)) == ["sbatch"]
    assert os.readlink(directory / "sbatch") == str(bin_dir / "garrison-sbatch")
    # A command installed later is linked by the next call; one removed is unlinked.
    (bin_dir / "garrison-srun").write_text("")
    (bin_dir / "garrison-sbatch").unlink()
    assert ensure_slurm_path(bin_dir) == directory
    assert sorted(os.listdir(directory)) == ["srun"]


def test_cannot_be_made_is_none(tmp_path: Path) -> None:
    blocker = tmp_path / "venv"
    blocker.write_text("a file where the installation's directory would be")
    assert ensure_slurm_path(blocker / "bin") is None


def test_path_gets_the_directory_first_once() -> None:
    assert with_slurm_path({"PATH": "/usr/bin:/d:/bin"}, "/d")["PATH"] == "/d:/usr/bin:/bin"
    assert with_slurm_path({}, "/d")["PATH"].startswith("/d:/usr/local/sbin:")
    assert with_slurm_path({"PATH": "/bin", "X": "1"}, None) == {"PATH": "/bin", "X": "1"}


def test_garrison_slurm_path_prints_this_installation() -> None:
    garrison = Path(sys.executable).parent / "garrison"
    done = subprocess.run([str(garrison), "slurm-path"], capture_output=True, text=True, timeout=60, check=True)
    directory = Path(done.stdout.strip())
    assert directory == slurm_path_dir(Path(sys.executable).parent)
    for name in os.listdir(directory):
        assert name in SLURM_COMMANDS
        assert os.access(directory / name, os.X_OK)
