#!/bin/bash
# Rewritten for Garrison's corpus from https://github.com/hexaeder/DynamicCascades.jl/blob/main/scripts/archive_nb/pipeline_WS_v1/WS_sacct_postprocessing_v1.sh (directives and Slurm command lines, trimmed)

#SBATCH --qos=priority
#SBATCH --time=1-00:00:00
#SBATCH --job-name=create_sacct_info
#SBATCH --account=icone
#SBATCH --output=%x-%A_%a-%N.out
#SBATCH --error=%x-%A_%a-%N.err
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=1

SLURM_JOBID=${1:-$SLURM_JOB_ID}
cd ${2:-.}

sacct --format=JobID,JobName,Submit,Start,End,State,Partition,ReqTRES%30,CPUTime,Elapsed,MaxRSS,NodeList%30 --units=M -j $SLURM_JOBID > "sacct_infos${SLURM_JOBID}.txt"
cat "sacct_infos${SLURM_JOBID}.txt"
