"""Text rendering of a node's GPU topology in the layout of ``nvidia-smi topo -m``."""

from __future__ import annotations

from garrison.model.domain import NodeInventory

_COLUMN_GAP = 2


def render_topo_matrix(inv: NodeInventory) -> str:
    """One row per GPU: its link label to every GPU, then its CPU and NUMA affinity.

    Labels: X (itself), NV# (# bonded NVLinks), PIX (one PCIe switch), PXB (several PCIe switches),
    PHB (PCIe host bridge), NODE (host bridges within a NUMA node), SYS (across NUMA nodes).
    """
    if not inv.gpus:
        return "no GPUs\n"
    names = [f"G{gpu.index}" for gpu in inv.gpus]
    rows = [["", *names, "CPU Affinity", "NUMA Affinity"]]
    for position, gpu in enumerate(inv.gpus):
        numa = str(gpu.numa_node) if gpu.numa_node >= 0 else "N/A"
        rows.append([names[position], *inv.topo[position], gpu.cpu_affinity or "N/A", numa])
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = [
        "".join(cell.ljust(width + _COLUMN_GAP) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    return "\n".join(lines) + "\n"
