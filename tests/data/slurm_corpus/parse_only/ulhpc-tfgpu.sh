#!/bin/bash -l
#SBATCH --job-name="tf-gpu"
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --ntasks-per-core=1
#SBATCH -c 7
#SBATCH -G 1
#SBATCH --time=0-00:10:00
#SBATCH -p gpu

python train.py
