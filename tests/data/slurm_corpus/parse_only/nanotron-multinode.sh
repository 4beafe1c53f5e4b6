#!/bin/bash
#SBATCH --job-name=mamba-train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --gres=gpu:8
#SBATCH --partition=hopper-prod
#SBATCH --output=logs/%x-%j.out
#SBATCH --wait-all-nodes=1

export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1)
export MASTER_PORT=6000
srun --wait=60 --kill-on-bad-exit=1 torchrun --nnodes $SLURM_NNODES --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint $MASTER_ADDR:$MASTER_PORT run_train.py
