"""What machine a description file describes: the parsed, validated model of a GPU node.

A machine description is a TOML table (the shipped ones are ``topologies/*.toml``)::

    name = "..."                                    # free text
    numa = [{id=0, cpus="0-19,40-59"}, ...]         # NUMA nodes and their CPU lists
    defaults = {gpu_name="...", memory_mib=16160, max_links=6, nvlink_version=2}
    gpus = [{index=0, bus="00000000:06:00.0", numa=0, pcie_switch="sw0", host_bridge="hb0"}, ...]
    nvlink_pairs = [[a, b, lanes], ...]             # optional: direct GPU<->GPU bundles
    nvswitches = [{id="nvsw0", bus="..."}, ...]     # optional: every GPU has links_per_switch lanes
    links_per_switch = 2                            #           to each switch
    driver_version = "..."                          # optional

A GPU entry may override ``gpu_name`` and ``memory_mib``. The PCIe common ancestor of two GPUs is derived
from the entries (see ``pcie_relation``): same ``pcie_switch`` -> PIX, same ``host_bridge`` -> PHB, same
NUMA node -> NODE, otherwise SYS. The format cannot describe nested PCIe switches, so PXB never occurs.

Shared by every program that needs a described machine: the agent's fake NVML library, the simulator and
``garrison up``. Standard library only, so none of them pays for NVML bindings to read one.
"""

from __future__ import annotations

import enum
import re
import tomllib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

TOPOLOGY_NAMES: tuple[str, ...] = ("dgx-a100", "dgx1v", "pcie4", "pcie8")
_TOPOLOGY_DIR = Path(__file__).resolve().parent / "topologies"

# NVML's NVML_NVLINK_MAX_LINKS: the most NVLink lanes a GPU can have (a test keeps it equal to pynvml's).
NVML_MAX_NVLINK_LINKS = 36
DEFAULT_DRIVER_VERSION = "570.86.15"

# Fixed namespace so that a node's fake GPU UUIDs are the same in every process and on every run.
_UUID_NAMESPACE = uuid.UUID("6f1c2d0e-8a4b-5c3d-9e7f-0a1b2c3d4e5f")

PCI_BUS_ID = re.compile(r"^([0-9A-Fa-f]{4}|[0-9A-Fa-f]{8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])$")
_CPU_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")

_TOP_LEVEL_KEYS = frozenset(
    {"name", "numa", "defaults", "gpus", "nvlink_pairs", "nvswitches", "links_per_switch", "driver_version"}
)
_DEFAULTS_KEYS = frozenset({"gpu_name", "memory_mib", "max_links", "nvlink_version"})
_GPU_KEYS = frozenset({"index", "bus", "numa", "pcie_switch", "host_bridge", "gpu_name", "memory_mib"})
_NUMA_KEYS = frozenset({"id", "cpus"})
_NVSWITCH_KEYS = frozenset({"id", "bus"})


def resolve_topology(name_or_path: str) -> Path:
    """Path of a built-in machine description (by name) or of a description file given by path."""
    if name_or_path in TOPOLOGY_NAMES:
        return _TOPOLOGY_DIR / f"{name_or_path}.toml"
    path = Path(name_or_path)
    if path.is_file():
        return path
    raise ValueError(
        f"unknown topology {name_or_path!r}: use one of {', '.join(TOPOLOGY_NAMES)} or a path to a .toml file"
    )


def load_description(path: str | Path) -> dict[str, Any]:
    """Read and validate a machine description; any problem is a one-line ValueError naming file and key.

    Returns the raw tables (what ``parse_machine`` and the fake NVML library take), already checked."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"{path}: cannot read machine description: {err.strerror or err}") from err
    try:
        description = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path}: invalid TOML: {err}") from err
    parse_machine(description, str(path))
    return description


def read_machine(name_or_path: str) -> MachineDescription:
    """The validated machine of a built-in description (by name) or of a description file (by path)."""
    path = resolve_topology(name_or_path)
    return parse_machine(load_description(path), str(path))


def fake_gpu_uuid(node_name: str, index: int) -> str:
    """The UUID a described machine's GPU ``index`` has on ``node_name``: stable per node, distinct across
    nodes."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node_name}/{index}')}"


def normalise_bus_id(text: str) -> str | None:
    """A PCI bus id in NVML's spelling (8-digit domain, upper case), or None if it is not one."""
    match = PCI_BUS_ID.match(text)
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):08X}:{bus.upper()}:{device.upper()}.{function}"


class LaneEnd(enum.Enum):
    """What the far end of an NVLink lane is."""

    GPU = "gpu"
    SWITCH = "switch"


class PcieRelation(enum.Enum):
    """How the PCIe paths of two GPUs meet, as ``nvidia-smi topo -m`` labels it."""

    SAME_GPU = "X"
    PCIE_SWITCH = "PIX"
    HOST_BRIDGE = "PHB"
    NUMA_NODE = "NODE"
    SYSTEM = "SYS"


@dataclass(frozen=True, slots=True)
class Lane:
    remote_bus: str
    remote_end: LaneEnd


@dataclass(frozen=True, slots=True)
class GpuDescription:
    index: int
    name: str
    memory_mib: int
    bus: str
    numa: int
    cpus: tuple[int, ...]
    pcie_switch: str
    host_bridge: str
    lanes: tuple[Lane, ...]  # wired lanes, in link order; lanes past these up to max_links are unused


@dataclass(frozen=True, slots=True)
class MachineDescription:
    name: str
    driver_version: str
    max_links: int
    nvlink_version: int | None
    gpus: tuple[GpuDescription, ...]


def pcie_relation(first: GpuDescription, second: GpuDescription) -> PcieRelation:
    """Where the PCIe paths of two GPUs of one machine meet."""
    if first.index == second.index:
        return PcieRelation.SAME_GPU
    if first.pcie_switch and first.pcie_switch == second.pcie_switch:
        return PcieRelation.PCIE_SWITCH
    if first.host_bridge and first.host_bridge == second.host_bridge:
        return PcieRelation.HOST_BRIDGE
    if first.numa == second.numa:
        return PcieRelation.NUMA_NODE
    return PcieRelation.SYSTEM


# --------------------------------------------------------------------------------------------------------
# Raw TOML tables -> validated model
# --------------------------------------------------------------------------------------------------------


class _Validator:
    """Reads typed values out of the raw TOML tables, failing with 'file: key: problem' on one line."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, problem: str) -> NoReturn:
        raise ValueError(f"{self.source}: {key}: {problem}")

    def table(self, value: object, key: str, allowed: frozenset[str]) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            self.fail(key, f"expected a table, got {_describe(value)}")
        unknown = sorted(set(value) - allowed)
        if unknown:
            self.fail(
                f"{key}.{unknown[0]}" if key else unknown[0],
                f"unknown key (known: {', '.join(sorted(allowed))})",
            )
        return value

    def array(self, value: object, key: str) -> Sequence[Any]:
        if not isinstance(value, list):
            self.fail(key, f"expected an array, got {_describe(value)}")
        return value

    def required(self, table: Mapping[str, Any], name: str, key: str) -> object:
        if name not in table:
            self.fail(f"{key}.{name}" if key else name, "missing")
        return table[name]

    def integer(self, value: object, key: str, minimum: int = 0) -> int:
        # bool is an int subclass; "true" for a count is a typo, not a number
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(key, f"expected an integer, got {_describe(value)}")
        if value < minimum:
            self.fail(key, f"must be >= {minimum}, got {value}")
        return value

    def string(self, value: object, key: str, *, allow_empty: bool = True) -> str:
        if not isinstance(value, str):
            self.fail(key, f"expected a string, got {_describe(value)}")
        if not allow_empty and not value:
            self.fail(key, "must not be empty")
        return value

    def bus_id(self, value: object, key: str) -> str:
        text = self.string(value, key)
        normalised = normalise_bus_id(text)
        if normalised is None:
            self.fail(key, f"expected a PCI bus id like '00000000:07:00.0', got {text!r}")
        return normalised

    def cpu_list(self, value: object, key: str) -> tuple[int, ...]:
        text = self.string(value, key, allow_empty=False)
        cpus: set[int] = set()
        for part in text.split(","):
            match = _CPU_RANGE.match(part.strip())
            if match is None:
                self.fail(key, f"expected a CPU list like '0-19,40-59', got {text!r}")
            first = int(match.group(1))
            last = int(match.group(2)) if match.group(2) is not None else first
            if last < first:
                self.fail(key, f"descending CPU range {part.strip()!r}")
            cpus.update(range(first, last + 1))
        return tuple(sorted(cpus))


def _describe(value: object) -> str:
    return f"{type(value).__name__} {value!r}"


def parse_machine(description: Mapping[str, Any], source: str = "<machine description>") -> MachineDescription:
    """The validated machine of a raw (TOML-decoded) description; a problem is a one-line ValueError."""
    check = _Validator(source)
    top = check.table(description, "", _TOP_LEVEL_KEYS)
    name = check.string(check.required(top, "name", ""), "name")
    driver_version = check.string(top.get("driver_version", DEFAULT_DRIVER_VERSION), "driver_version")

    numa_cpus: dict[int, tuple[int, ...]] = {}
    for position, raw in enumerate(check.array(check.required(top, "numa", ""), "numa")):
        key = f"numa[{position}]"
        entry = check.table(raw, key, _NUMA_KEYS)
        node_id = check.integer(check.required(entry, "id", key), f"{key}.id")
        if node_id in numa_cpus:
            check.fail(f"{key}.id", f"duplicate NUMA node id {node_id}")
        numa_cpus[node_id] = check.cpu_list(check.required(entry, "cpus", key), f"{key}.cpus")

    defaults = check.table(check.required(top, "defaults", ""), "defaults", _DEFAULTS_KEYS)
    default_name = check.string(defaults.get("gpu_name", ""), "defaults.gpu_name")
    default_memory = (
        check.integer(defaults["memory_mib"], "defaults.memory_mib", minimum=1)
        if "memory_mib" in defaults
        else None
    )
    max_links = check.integer(defaults.get("max_links", 0), "defaults.max_links")
    if max_links > NVML_MAX_NVLINK_LINKS:
        check.fail("defaults.max_links", f"NVML allows at most {NVML_MAX_NVLINK_LINKS} links per GPU")
    nvlink_version = (
        check.integer(defaults["nvlink_version"], "defaults.nvlink_version", minimum=1)
        if "nvlink_version" in defaults
        else None
    )

    raw_gpus = check.array(check.required(top, "gpus", ""), "gpus")
    gpu_fields: list[dict[str, Any]] = []
    seen_buses: dict[str, str] = {}
    for position, raw in enumerate(raw_gpus):
        key = f"gpus[{position}]"
        entry = check.table(raw, key, _GPU_KEYS)
        index = check.integer(check.required(entry, "index", key), f"{key}.index")
        if index != position:
            # NVML numbers devices 0..n-1 with no gaps; the list order is that numbering
            check.fail(f"{key}.index", f"expected {position} (GPUs are listed in index order), got {index}")
        bus = check.bus_id(check.required(entry, "bus", key), f"{key}.bus")
        if bus in seen_buses:
            check.fail(f"{key}.bus", f"bus id {bus} already used by {seen_buses[bus]}")
        seen_buses[bus] = key
        numa = check.integer(check.required(entry, "numa", key), f"{key}.numa")
        if numa not in numa_cpus:
            check.fail(f"{key}.numa", f"NUMA node {numa} is not listed in numa")
        gpu_name = check.string(entry.get("gpu_name", default_name), f"{key}.gpu_name", allow_empty=False)
        memory = entry.get("memory_mib", default_memory)
        if memory is None:
            check.fail(f"{key}.memory_mib", "missing (and no defaults.memory_mib)")
        memory_mib = check.integer(memory, f"{key}.memory_mib", minimum=1)
        gpu_fields.append(
            {
                "index": index,
                "name": gpu_name,
                "memory_mib": memory_mib,
                "bus": bus,
                "numa": numa,
                "cpus": numa_cpus[numa],
                "pcie_switch": check.string(entry.get("pcie_switch", ""), f"{key}.pcie_switch"),
                "host_bridge": check.string(entry.get("host_bridge", ""), f"{key}.host_bridge"),
            }
        )

    lanes: list[list[Lane]] = [[] for _ in gpu_fields]
    gpu_count = len(gpu_fields)
    for position, raw in enumerate(check.array(top.get("nvlink_pairs", []), "nvlink_pairs")):
        key = f"nvlink_pairs[{position}]"
        pair = check.array(raw, key)
        if len(pair) != 3:
            check.fail(key, f"expected [gpu_a, gpu_b, lanes], got {pair!r}")
        a = check.integer(pair[0], f"{key}[0]")
        b = check.integer(pair[1], f"{key}[1]")
        count = check.integer(pair[2], f"{key}[2]", minimum=1)
        for which, gpu in ((0, a), (1, b)):
            if gpu >= gpu_count:
                check.fail(f"{key}[{which}]", f"no GPU {gpu} (the machine has {gpu_count})")
        if a == b:
            check.fail(key, f"a GPU cannot be linked to itself ({a})")
        lanes[a].extend(Lane(gpu_fields[b]["bus"], LaneEnd.GPU) for _ in range(count))
        lanes[b].extend(Lane(gpu_fields[a]["bus"], LaneEnd.GPU) for _ in range(count))

    switch_buses: list[str] = []
    for position, raw in enumerate(check.array(top.get("nvswitches", []), "nvswitches")):
        key = f"nvswitches[{position}]"
        entry = check.table(raw, key, _NVSWITCH_KEYS)
        check.string(check.required(entry, "id", key), f"{key}.id", allow_empty=False)
        bus = check.bus_id(check.required(entry, "bus", key), f"{key}.bus")
        if bus in seen_buses:
            check.fail(f"{key}.bus", f"bus id {bus} already used by {seen_buses[bus]}")
        seen_buses[bus] = key
        switch_buses.append(bus)
    if switch_buses:
        links_per_switch = check.integer(
            check.required(top, "links_per_switch", ""), "links_per_switch", minimum=1
        )
        for gpu_lanes in lanes:
            for bus in switch_buses:
                gpu_lanes.extend(
                    Lane(bus, LaneEnd.SWITCH) for _ in range(links_per_switch)
                )
    elif "links_per_switch" in top:
        check.fail("links_per_switch", "given without nvswitches")

    for index, gpu_lanes in enumerate(lanes):
        if len(gpu_lanes) > max_links:
            check.fail(
                "nvlink_pairs" if not switch_buses else "nvswitches",
                f"GPU {index} needs {len(gpu_lanes)} NVLink lanes but defaults.max_links is {max_links}",
            )

    gpus = tuple(
        GpuDescription(lanes=tuple(gpu_lanes), **fields)
        for fields, gpu_lanes in zip(gpu_fields, lanes, strict=True)
    )
    return MachineDescription(
        name=name,
        driver_version=driver_version,
        max_links=max_links,
        nvlink_version=nvlink_version,
        gpus=gpus,
    )
