#!/usr/bin/bash
# Rewritten for Garrison's corpus from https://github.com/charlotte-ngs/sib_intro_rna_seq/blob/master/practicals/day1/sbatch/mySbatchArrayScript.sh (directives and Slurm command lines, trimmed)
#SBATCH --job-name=test_array
#SBATCH --time=00:30:00
#SBATCH --cpus-per-task=1
#SBATCH --mem=1G
#SBATCH -o test_array_log.%a.o
#SBATCH --array 1-10%5


echo "job array id" $SLURM_ARRAY_TASK_ID
ReadFileName=`echo read_$SLURM_ARRAY_TASK_ID.fq`
echo $ReadFileName
