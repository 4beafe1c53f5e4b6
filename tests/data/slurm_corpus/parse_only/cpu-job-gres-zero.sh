#!/bin/bash
#SBATCH --job-name=shard_dataset
#SBATCH --partition=gpuq
#SBATCH --gres=gpu:0
#SBATCH --cpus-per-task=8
#SBATCH --mem=64G
#SBATCH --time=04:00:00
#SBATCH --output=slurm/%x_%j.out

# A CPU-only preprocessing job on a GPU partition, and a monitoring step beside it that must see no GPU.
srun --gres=none -n 1 nvidia-smi -L
python convert.py --shards 64
