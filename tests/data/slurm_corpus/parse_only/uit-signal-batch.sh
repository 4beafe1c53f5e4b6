#!/bin/bash -l
# Rewritten for Garrison's corpus from https://github.com/uit-no/hpc-doc/blob/master/jobs/files/slurm-timeout-cleanup.sh (directives and Slurm command lines, trimmed)

# job name
#SBATCH --job-name=example

# replace this by your account
#SBATCH --account=nn1234k

# one core only
#SBATCH --ntasks=1

# we give this job 4 minutes
#SBATCH --time=0-00:04:00

# asks SLURM to send the USR1 signal 120 seconds before end of the time limit
#SBATCH --signal=B:USR1@120

your_cleanup_function()
{
    echo "function your_cleanup_function called at $(date)"
}
trap 'your_cleanup_function' USR1

echo "starting calculation at $(date)"
sleep 1 &
wait
