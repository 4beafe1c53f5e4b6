#!/bin/bash -l
#SBATCH -J dask-cluster
#SBATCH -N 2
#SBATCH --ntasks-per-node=4
#SBATCH -c 1
#SBATCH --time=0-01:00:00
#SBATCH -p batch

srun -w $(hostname) --exclusive -N 1 -n 1 -c 1 dask-scheduler --scheduler-file scheduler.json &
srun --exclusive -n 6 -c 1 --cpu-bind=cores dask-worker --scheduler-file scheduler.json &
srun --no-kill --wait=0 python client.py
