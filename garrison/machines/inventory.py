"""What inventory a described machine has: the NodeInventory an agent on it reports, without NVML.

The agent learns its inventory through NVML (``nodeagent/gpu/discovery.py``, over the fake NVML library on
a described machine); the simulator needs the same answer without loading NVML bindings. This builder
derives it from the description by the rules discovery applies: NVLink lanes counted per remote GPU,
GPUs on a common NVSwitch fabric linked by the smaller of their switch lane counts, and the PCIe relation
where there is no NVLink. A unit test checks, for every shipped description, that both give the same.
"""

from __future__ import annotations

from collections import Counter

from garrison.machines.description import (
    GpuDescription,
    LaneEnd,
    MachineDescription,
    fake_gpu_uuid,
    pcie_relation,
)
from garrison.model.cpulist import format_cpu_list
from garrison.model.domain import Gpu, NodeInventory


def machine_inventory(
    machine: MachineDescription, node_name: str, *, cpus: int, memory_mb: int, model: str = ""
) -> NodeInventory:
    """The inventory of ``machine`` as the node ``node_name`` reports it.

    ``cpus`` and ``memory_mb`` are the host's (a description says nothing about them, and discovery reads
    them from the host it runs on); ``model`` is what the reporter calls the machine ("" as discovery does).
    """
    gpus = tuple(
        Gpu(
            index=gpu.index,
            uuid=fake_gpu_uuid(node_name, gpu.index),
            name=gpu.name,
            memory_mib=gpu.memory_mib,
            pci_bus_id=gpu.bus,
            numa_node=gpu.numa,
            cpu_affinity=format_cpu_list(list(gpu.cpus)),
            mig_enabled=False,  # descriptions cannot enable MIG
        )
        for gpu in machine.gpus
    )
    nvlink = _nvlink_matrix(machine.gpus)
    topo = tuple(
        tuple(
            "X" if i == j else f"NV{nvlink[i][j]}" if nvlink[i][j] else pcie_relation(first, second).value
            for j, second in enumerate(machine.gpus)
        )
        for i, first in enumerate(machine.gpus)
    )
    return NodeInventory(
        hostname=node_name, gpus=gpus, nvlink=nvlink, topo=topo, cpus=cpus, memory_mb=memory_mb, model=model
    )


def _switch_fabrics(gpus: tuple[GpuDescription, ...]) -> list[int]:
    """Fabric number per GPU: GPUs that reach a common NVSwitch, directly or through others, share one."""
    fabric = list(range(len(gpus)))

    def root(position: int) -> int:
        while fabric[position] != position:
            position = fabric[position]
        return position

    first_gpu_on_switch: dict[str, int] = {}
    for position, gpu in enumerate(gpus):
        for lane in gpu.lanes:
            if lane.remote_end is LaneEnd.SWITCH:
                other = first_gpu_on_switch.setdefault(lane.remote_bus, position)
                fabric[root(position)] = root(other)
    return [root(position) for position in range(len(gpus))]


def _nvlink_matrix(gpus: tuple[GpuDescription, ...]) -> tuple[tuple[int, ...], ...]:
    direct = [Counter(lane.remote_bus for lane in gpu.lanes if lane.remote_end is LaneEnd.GPU) for gpu in gpus]
    switch_lanes = [sum(1 for lane in gpu.lanes if lane.remote_end is LaneEnd.SWITCH) for gpu in gpus]
    fabrics = _switch_fabrics(gpus)
    rows = []
    for i in range(len(gpus)):
        row = []
        for j, other in enumerate(gpus):
            links = 0 if i == j else direct[i][other.bus]
            if i != j and switch_lanes[i] and switch_lanes[j] and fabrics[i] == fabrics[j]:
                # As discovery: traffic through the fabric is bounded by the GPU with fewer switch lanes.
                links += min(switch_lanes[i], switch_lanes[j])
            row.append(links)
        rows.append(tuple(row))
    return tuple(rows)
