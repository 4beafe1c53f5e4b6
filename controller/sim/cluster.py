"""The simulated cluster: nodes with GPUs, their NVLink matrices, and the network switch each hangs off.

A cluster comes from a spec ``NxG[:TOPOLOGY][/NODES_PER_SWITCH]`` (``12x8:dgx-a100/4``: 12 DGX A100 nodes,
4 per leaf switch) or from a TOML cluster file for mixed clusters::

    nodes_per_switch = 4          # optional; default: every node under one switch
    [[nodes]]
    count = 8
    topology = "dgx-a100"         # a built-in machine description or a path to one
    [[nodes]]
    count = 4
    gpus = 8                      # no topology: plain GPUs without NVLink
    gpu_name = "NVIDIA L40S"      # optional
    switch = "sw9"                # optional: put these nodes under a named switch

Machine descriptions are the shared ones of ``garrison.machines`` (garrison/machines/topologies/*.toml),
which an agent with ``fake_topology`` also runs on. A simulated node of such a machine gets the very
inventory an agent on it reports (GPU names, NVLink matrix, topo -m labels, memory): the shared builder
derives it by discovery's rules, and a unit test holds it equal to what the agent's discovery reports over
the fake NVML library, so placement in the simulator sees what it sees in the daemon. Nodes are named node1, node2, ...
like the agents of ``garrison up``.
"""

from __future__ import annotations

import functools
import os
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from garrison.machines import machine_inventory as described_machine_inventory
from garrison.machines import read_machine
from garrison.model.domain import Gpu, NodeInventory

SPEC = re.compile(r"^(\d+)x(\d+)(?::([^/]+))?(?:/(\d+))?$")
DEFAULT_GPU_NAME = "GPU"


class ClusterError(ValueError):
    """A cluster spec or file problem, in one line."""


@dataclass(frozen=True, slots=True)
class SimNode:
    name: str
    inventory: NodeInventory  # what its agent would report
    switch: str  # the leaf network switch this node hangs off
    model: str = ""  # machine description name, "" for plain GPUs

    @property
    def gpu_names(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.inventory.gpus)

    @property
    def nvlink(self) -> tuple[tuple[int, ...], ...]:
        return self.inventory.nvlink

    @property
    def gpu_count(self) -> int:
        return len(self.inventory.gpus)


@dataclass(frozen=True, slots=True)
class SimCluster:
    nodes: tuple[SimNode, ...]

    @property
    def total_gpus(self) -> int:
        return sum(n.gpu_count for n in self.nodes)

    @property
    def max_gpus_per_node(self) -> int:
        return max(n.gpu_count for n in self.nodes)

    @property
    def nodes_per_switch(self) -> int:
        """The most nodes under any one switch (used to tell whether a gang spread wider than it needed)."""
        counts: dict[str, int] = {}
        for node in self.nodes:
            counts[node.switch] = counts.get(node.switch, 0) + 1
        return max(counts.values())

    def describe(self) -> str:
        kinds: dict[tuple[int, str], int] = {}
        for node in self.nodes:
            key = (node.gpu_count, node.model or node.inventory.gpus[0].name)
            kinds[key] = kinds.get(key, 0) + 1
        parts = [f"{count}x{gpus} {model}".strip() for (gpus, model), count in kinds.items()]
        switches = len({n.switch for n in self.nodes})
        return f"{', '.join(parts)}; {self.total_gpus} GPUs; {switches} switch(es)"


@functools.cache
def machine_inventory(topology: str) -> NodeInventory:
    """What an agent discovers on a machine of this description (built-in name or path), named "gsim".

    CPU count and memory are this host's, as an agent's discovery on this host would report them.
    """
    return described_machine_inventory(
        read_machine(topology),
        "gsim",
        cpus=os.cpu_count() or 1,
        memory_mb=psutil.virtual_memory().total // (1024 * 1024),
    )


def plain_inventory(gpus: int, gpu_name: str) -> NodeInventory:
    """A node of ``gpus`` GPUs about which nothing but the name is known: no NVLink, no PCIe detail."""
    return NodeInventory(
        hostname="gsim",
        gpus=tuple(Gpu(i, f"GPU-gsim-{i}", gpu_name, 0, "", 0, "") for i in range(gpus)),
        nvlink=tuple(tuple(0 for _ in range(gpus)) for _ in range(gpus)),
        topo=tuple(tuple("X" if i == j else "SYS" for j in range(gpus)) for i in range(gpus)),
        cpus=0,
        memory_mb=0,
    )


@dataclass(frozen=True, slots=True)
class _Machine:
    inventory: NodeInventory
    model: str


def _machine(topology: str | None, gpus: int | None, gpu_name: str | None, where: str) -> _Machine:
    if topology is None:
        if gpus is None or gpus < 1:
            raise ClusterError(f"{where}: give a GPU count of at least 1 or a topology")
        return _Machine(plain_inventory(gpus, gpu_name or DEFAULT_GPU_NAME), "")
    try:
        inventory = machine_inventory(topology)
    except ValueError as err:
        raise ClusterError(f"{where}: {err}") from None
    if not inventory.gpus:
        raise ClusterError(f"{where}: topology {topology!r} describes no GPUs")
    if gpus is not None and gpus != len(inventory.gpus):
        raise ClusterError(f"{where}: topology {topology!r} has {len(inventory.gpus)} GPUs per node, not {gpus}")
    if gpu_name is not None:
        raise ClusterError(f"{where}: gpu_name is taken from the topology; give one or the other")
    return _Machine(inventory, topology)


def _build(groups: Sequence[tuple[int, _Machine, str | None]], nodes_per_switch: int | None) -> SimCluster:
    nodes: list[SimNode] = []
    for count, machine, switch in groups:
        for _ in range(count):
            position = len(nodes)
            leaf = switch or (f"sw{position // nodes_per_switch + 1}" if nodes_per_switch else "sw1")
            nodes.append(SimNode(f"node{position + 1}", machine.inventory, leaf, machine.model))
    if not nodes:
        raise ClusterError("the cluster has no nodes")
    return SimCluster(tuple(nodes))


def parse_cluster(spec: str) -> SimCluster:
    """A cluster from ``NxG[:TOPOLOGY][/NODES_PER_SWITCH]`` or from the path of a cluster file."""
    match = SPEC.match(spec.strip())
    if match is None:
        path = Path(spec)
        if path.is_file():
            return load_cluster_file(path)
        raise ClusterError(
            f"cluster {spec!r}: expected NODESxGPUS[:TOPOLOGY][/NODES_PER_SWITCH] (e.g. 12x8:dgx-a100/4) "
            "or the path of a cluster file"
        )
    count, gpus, topology, per_switch = match.groups()
    if int(count) < 1:
        raise ClusterError(f"cluster {spec!r}: at least one node")
    if per_switch is not None and int(per_switch) < 1:
        raise ClusterError(f"cluster {spec!r}: at least one node per switch")
    machine = _machine(topology, int(gpus), None, f"cluster {spec!r}")
    return _build([(int(count), machine, None)], int(per_switch) if per_switch else None)


_FILE_KEYS = frozenset({"nodes", "nodes_per_switch"})
_GROUP_KEYS = frozenset({"count", "gpus", "topology", "gpu_name", "switch"})


def load_cluster_file(path: str | Path) -> SimCluster:
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise ClusterError(f"{path}: cannot read cluster file: {err.strerror or err}") from None
    except tomllib.TOMLDecodeError as err:
        raise ClusterError(f"{path}: invalid TOML: {err}") from None
    unknown = set(data) - _FILE_KEYS
    if unknown:
        raise ClusterError(f"{path}: unknown key {sorted(unknown)[0]!r} (known: nodes, nodes_per_switch)")
    per_switch = data.get("nodes_per_switch")
    if per_switch is not None and (not isinstance(per_switch, int) or isinstance(per_switch, bool) or per_switch < 1):
        raise ClusterError(f"{path}: nodes_per_switch must be a whole number of at least 1")
    groups_data = data.get("nodes")
    if not isinstance(groups_data, list) or not groups_data:
        raise ClusterError(f"{path}: expected at least one [[nodes]] table")
    groups: list[tuple[int, _Machine, str | None]] = []
    for i, group in enumerate(groups_data):
        where = f"{path}: nodes[{i}]"
        if not isinstance(group, dict):
            raise ClusterError(f"{where}: expected a table")
        unknown = set(group) - _GROUP_KEYS
        if unknown:
            raise ClusterError(f"{where}: unknown key {sorted(unknown)[0]!r} (known: {', '.join(sorted(_GROUP_KEYS))})")
        count = group.get("count", 1)
        gpus = group.get("gpus")
        for key, value in (("count", count), ("gpus", gpus)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ClusterError(f"{where}.{key}: must be a whole number of at least 1")
        for key in ("topology", "gpu_name", "switch"):
            if key in group and not isinstance(group[key], str):
                raise ClusterError(f"{where}.{key}: must be a string")
        machine = _machine(group.get("topology"), gpus, group.get("gpu_name"), where)
        groups.append((count, machine, group.get("switch")))
    return _build(groups, per_switch)
