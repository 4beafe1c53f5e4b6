#!/bin/bash
#SBATCH --partition=g40423
#SBATCH --job-name=openclip
#SBATCH --nodes=30
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-gpu=6
#SBATCH --ntasks-per-node=8
#SBATCH --output=%x_%j.out
#SBATCH --comment=laion
#SBATCH --open-mode=append
#SBATCH --exclusive

export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=12802
srun --comment laion --cpu_bind=v --accel-bind=gn python -m open_clip_train.main --batch-size 256
