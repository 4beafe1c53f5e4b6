#!/bin/bash
# Rewritten for Garrison's corpus from https://github.com/ltaulell/submission_scripts/blob/master/Slurm/with_mail.sh (directives and Slurm command lines, trimmed)
#SBATCH --job-name=test
#SBATCH --partition=E5
#SBATCH --cpus-per-task=1           # -n
#SBATCH --ntasks=1
#SBATCH --time=0-00:10:00           # day-hours:minutes:seconds
#
# SBATCH --mail-type=BEGIN,END,FAIL
#SBATCH --mail-type=ALL
#SBATCH --mail-user=user@example.com

env | grep ^SLURM_ | sort > env-E5.txt
wc -l env-E5.txt
