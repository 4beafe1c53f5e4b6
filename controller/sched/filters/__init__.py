"""Filters: one small file per step. Each says whether one node can hold its share of a request."""

from garrison.controller.sched.filters.cpu_memory import CpuMemoryFit
from garrison.controller.sched.filters.excluded import NodeNotExcluded
from garrison.controller.sched.filters.gpu_capacity import GpuCapacity
from garrison.controller.sched.filters.gpu_free import GpuFree
from garrison.controller.sched.filters.node_ready import NodeReady
from garrison.controller.sched.filters.node_selection import NodeExclusive, NodeFeatures, NodeListed
from garrison.controller.sched.filters.partition import PartitionMember

__all__ = [
    "CpuMemoryFit",
    "GpuCapacity",
    "GpuFree",
    "NodeExclusive",
    "NodeFeatures",
    "NodeListed",
    "NodeNotExcluded",
    "NodeReady",
    "PartitionMember",
]
