#!/bin/bash
#SBATCH -J train_any_big_gpu
#SBATCH -N 1
#SBATCH --mem=32G
#SBATCH -t 960:00:00
#SBATCH --partition=lab
#SBATCH --constraint="[a6000|a100|6000ada]"
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-gpu=4

python train.py --phase 2
