#!/bin/bash
#SBATCH --time=6:30:0
#SBATCH --job-name=eval_model
#SBATCH --ntasks=64
#SBATCH --cpus-per-task=8
#SBATCH --mem-per-cpu=1950
#SBATCH --nodes=2-70
#SBATCH --use-min-nodes

srun python evaluate.py
