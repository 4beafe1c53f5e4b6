#!/bin/bash
# A driver that chains a training job on one that is already running, by its id alone (Slurm's old form).
#SBATCH --job-name=chain
#SBATCH --nodes=1
#SBATCH --gres=gpu:1
#SBATCH --dependency=12345
#SBATCH --time=1:00:00

python train.py --resume
