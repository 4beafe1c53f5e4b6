"""Scorers: one small file per step. Each ranks a node that passed every filter, 0 (worst) to 100 (best)."""

from garrison.controller.sched.scorers.binpack import BinPack
from garrison.controller.sched.scorers.gpu_topology import GpuTopology
from garrison.controller.sched.scorers.numa import NumaLocality

__all__ = ["BinPack", "GpuTopology", "NumaLocality"]
