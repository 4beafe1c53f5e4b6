#!/bin/bash
# Rewritten for Garrison's corpus from NERSC's Perlmutter GPU exercise (search result; repository not named) (directives and Slurm command lines, trimmed)
#SBATCH -N 1
#SBATCH -C gpu
#SBATCH -G 4
#SBATCH -t 5
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=2
#SBATCH -A m3902_g
#SBATCH --exclusive

srun -n8 --cpu-bind=cores --gpu-bind=closest bash -c 'echo $SLURM_PROCID $CUDA_VISIBLE_DEVICES'
