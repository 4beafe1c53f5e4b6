#!/bin/bash
# Rewritten for Garrison's corpus from https://github.com/apple/axlearn/blob/main/run_trn.sh (directives and Slurm command lines, trimmed)
#SBATCH --output=slurm-%x-%j.out
#SBATCH --cpus-per-task 31
#SBATCH --exclusive
#SBATCH --nodes=2

srun  --kill-on-bad-exit=1  bash -c 'echo trainer on $(hostname) node $SLURM_NODEID'
