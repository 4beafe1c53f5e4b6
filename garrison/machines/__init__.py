"""Described machines: the GPU node descriptions (``topologies/*.toml``), their parser, and the inventory
a described machine has. Shared by the agent's fake NVML library, the simulator and ``garrison up``."""

from garrison.machines.description import (
    TOPOLOGY_NAMES,
    MachineDescription,
    load_description,
    parse_machine,
    read_machine,
    resolve_topology,
)
from garrison.machines.inventory import machine_inventory

__all__ = [
    "TOPOLOGY_NAMES",
    "MachineDescription",
    "load_description",
    "machine_inventory",
    "parse_machine",
    "read_machine",
    "resolve_topology",
]
