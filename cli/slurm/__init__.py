"""Slurm's command names (sbatch, srun, salloc, squeue, scancel, sinfo, sacct, scontrol, sstat) as thin layers
over the g* commands and the same client code.

They are installed as ``garrison-<name>`` console scripts, never under Slurm's own names, so they cannot clash
with a real Slurm on the same host; ``garrison slurm-path`` prints a directory of ``<name>`` links to them that
a shell (or every job and step, through the agent) puts first on its PATH.
"""
