#!/bin/bash
# Rewritten for Garrison's corpus from https://github.com/JuanCruzCB/Sistemas-Paralelos/blob/main/TPs/3/Entrega/script-mpi.sh (directives and Slurm command lines, trimmed)
#SBATCH -N 1
#SBATCH --exclusive
#SBATCH --tasks-per-node=8
#SBATCH -o mpi/output_N_?.txt
#SBATCH -e mpi/errors_N_?.txt
echo mpirun mpi $1 ntasks=$SLURM_NTASKS
