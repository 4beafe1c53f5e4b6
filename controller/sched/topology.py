"""Topology inside a node (which GPUs talk fastest) and across nodes (which nodes share a switch).

Inside a node, every GPU pair gets an affinity: NVLink lanes first (ten points a lane, so one lane beats
any PCIe path), then the PCIe distance from ``nvidia-smi topo -m`` (same PCIe switch > across switches >
same host bridge > same NUMA node > across sockets). NVSwitch machines report the same lanes for every
pair, so every set is equal there, as it should be.

Across nodes, a node's ``switches`` path (top level first: block, rack, leaf switch) comes from the
``[[controller.switches]]`` config, like Slurm's topology.conf; nodes with equal prefixes share that level.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

Matrix = tuple[tuple[int, ...], ...]

PCIE_RANK = {"PIX": 5, "PXB": 4, "PHB": 3, "NODE": 2, "SYS": 1}
LANE_POINTS = 10


@lru_cache(maxsize=256)
def gpu_affinity(nvlink: Matrix, topo: tuple[tuple[str, ...], ...]) -> Matrix:
    """Pairwise affinity between the GPUs of one node (0 on the diagonal)."""
    size = max(len(nvlink), len(topo))
    rows = []
    for i in range(size):
        row = []
        for j in range(size):
            if i == j:
                row.append(0)
                continue
            lanes = nvlink[i][j] if i < len(nvlink) and j < len(nvlink[i]) else 0
            label = topo[i][j] if i < len(topo) and j < len(topo[i]) else ""
            row.append(lanes * LANE_POINTS + PCIE_RANK.get(label, 0))
        rows.append(tuple(row))
    return tuple(rows)


@lru_cache(maxsize=256)
def is_uniform(affinity: Matrix) -> bool:
    """Every pair equally connected (NVSwitch, or no information): any GPU set is as good as any other."""
    values = {affinity[i][j] for i in range(len(affinity)) for j in range(len(affinity)) if i != j}
    return len(values) <= 1


def set_affinity(gpus: Sequence[int], affinity: Matrix) -> int:
    if not affinity:
        return 0
    return sum(affinity[a][b] for i, a in enumerate(gpus) for b in gpus[i + 1 :])


def pick_connected_gpus(candidates: Sequence[int], count: int, affinity: Matrix) -> tuple[int, ...]:
    """The ``count`` GPUs among ``candidates`` (ascending) with the highest total pairwise affinity.

    Greedy growth from every seed, keeping each remaining GPU's gain up to date as the set grows: exact for
    the machines we know (a DGX-1V's fully connected quads, NVLink pairs on PCIe boxes, NVSwitch) and
    O(n^2 * count) for n <= 8 candidates. Ties go to the lowest indices, so the choice is deterministic.
    """
    if count <= 0:
        return ()
    if count >= len(candidates) or count == 1 or not affinity or is_uniform(affinity):
        return tuple(candidates[:count])
    best_score = -1
    best: tuple[int, ...] = ()
    for seed in candidates:
        chosen = [seed]
        gain = {c: affinity[c][seed] for c in candidates if c != seed}
        score = 0
        while len(chosen) < count:
            pick = max(gain, key=lambda c: (gain[c], -c))
            score += gain.pop(pick)
            chosen.append(pick)
            row = affinity[pick]
            for c in gain:
                gain[c] += row[c]
        ordered = tuple(sorted(chosen))
        if score > best_score or (score == best_score and ordered < best):
            best_score, best = score, ordered
    return best


@lru_cache(maxsize=1024)
def best_affinity(affinity: Matrix, count: int) -> int:
    """The best set affinity ``count`` GPUs of an idle node of this kind can have."""
    chosen = pick_connected_gpus(tuple(range(len(affinity))), count, affinity)
    return set_affinity(chosen, affinity)
