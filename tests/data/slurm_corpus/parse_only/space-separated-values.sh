#!/bin/bash -e 
# Rewritten for Garrison's corpus from a NeSI GPU example (search result; repository not named) (directives and Slurm command lines, trimmed)

#SBATCH --account       nesi99999
#SBATCH --job-name      largetensor
#SBATCH --ntasks        6
#SBATCH --mem           8G
#SBATCH --time          00:15:00
#SBATCH --gpus-per-node A100:2
#SBATCH --partition     hgx
#SBATCH --output        slog/%j.out

echo python single-gpu.py ntasks=$SLURM_NTASKS gpus=$CUDA_VISIBLE_DEVICES
