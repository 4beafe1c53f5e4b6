"""Garrison: a Slurm-style batch system for bare-metal GPU clusters."""
