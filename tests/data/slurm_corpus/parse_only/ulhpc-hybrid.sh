#!/bin/bash -l
#SBATCH -N 2
#SBATCH --ntasks-per-node 14
#SBATCH --ntasks-per-socket 7
#SBATCH -c 2
#SBATCH --time=0-01:00:00
#SBATCH -p batch

export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
srun -n $SLURM_NTASKS ./hybrid_program
