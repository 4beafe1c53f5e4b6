#!/bin/bash
# Rewritten for Garrison's corpus from https://github.com/gaurikadiwan/pytorch/blob/main/slurm.sh (directives and Slurm command lines, trimmed)
#SBATCH --job-name=test
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=16
#SBATCH
--mem=32G
#SBATCH --partition=gpu
#SBATCH --gres=gpu:1
echo "gpus=${CUDA_VISIBLE_DEVICES-unset} cpus=$SLURM_CPUS_PER_TASK"
