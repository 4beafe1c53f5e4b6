#!/bin/bash
# One inference server on a whole-GPU node, its features listed with commas (NERSC Perlmutter's habit).
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --gpus-per-task=4
#SBATCH --cpus-per-task=64
#SBATCH --mem=200G
#SBATCH --constraint gpu,a100,hbm80g
#SBATCH --qos=regular
#SBATCH --account=m0000

python serve.py
