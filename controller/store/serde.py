"""JSON text for the domain values the store keeps in one column: JobSpec, Allocation, NodeInventory.

Pure functions, no I/O. Decoding is tolerant in one direction on purpose: a key missing from stored JSON takes
the dataclass default, so adding a field with a default to a domain type needs no data migration. Keys the
current code does not know are ignored, so that rows written by a newer controller still load after a
rollback.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any

from garrison.model.domain import (
    Allocation,
    AttemptUsage,
    Gpu,
    JobSpec,
    LaunchMode,
    NodeAllocation,
    NodeInventory,
)


def _dumps(value: object) -> str:
    # Compact separators: these columns are written on every job state change.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _loads_object(text: str, what: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"stored {what} is not a JSON object: {text[:80]!r}")
    return value


# -- JobSpec -----------------------------------------------------------------------------------------------

# Declaration order, so the JSON text for a given spec is always the same.
_SPEC_FIELDS = tuple(f.name for f in fields(JobSpec))

# How each JobSpec field that JSON cannot give back as-is is rebuilt. Every other field is a JSON scalar
# (str, int, bool, None). A new field of some other type makes json.dumps fail loudly, not lose data.
_SPEC_DECODERS: Mapping[str, Callable[[Any], Any]] = {
    "command": tuple,
    "exclude": tuple,
    "nodelist": tuple,
    "env": dict,
    "launch": LaunchMode,
}


def spec_to_dict(spec: JobSpec) -> dict[str, Any]:
    data: dict[str, Any] = {name: getattr(spec, name) for name in _SPEC_FIELDS}
    data["command"] = list(spec.command)
    data["exclude"] = list(spec.exclude)
    data["nodelist"] = list(spec.nodelist)
    data["env"] = dict(spec.env)  # any Mapping, e.g. a MappingProxyType, which json cannot encode
    data["launch"] = spec.launch.value
    return data


def spec_from_dict(data: Mapping[str, Any]) -> JobSpec:
    kwargs = {
        name: _SPEC_DECODERS[name](value) if name in _SPEC_DECODERS else value
        for name, value in data.items()
        if name in _SPEC_FIELDS
    }
    return JobSpec(**kwargs)


def spec_to_json(spec: JobSpec) -> str:
    return _dumps(spec_to_dict(spec))


def spec_from_json(text: str) -> JobSpec:
    return spec_from_dict(_loads_object(text, "job spec"))


# -- Allocation --------------------------------------------------------------------------------------------


def _node_allocation_to_dict(n: NodeAllocation) -> dict[str, Any]:
    out: dict[str, Any] = {"node": n.node, "gpus": list(n.gpus)}
    # CPUs and memory only when the job asked for them: most allocations stay as compact as before.
    if n.cpus:
        out["cpus"] = list(n.cpus)
    if n.mem_mb:
        out["mem_mb"] = n.mem_mb
    return out


def allocation_to_dict(allocation: Allocation) -> dict[str, Any]:
    return {"nodes": [_node_allocation_to_dict(n) for n in allocation.nodes]}


def allocation_from_dict(data: Mapping[str, Any]) -> Allocation:
    return Allocation(
        nodes=tuple(
            NodeAllocation(node=n["node"], gpus=tuple(n["gpus"]), cpus=tuple(n.get("cpus", ())),
                           mem_mb=n.get("mem_mb", 0))
            for n in data["nodes"]
        )
    )


def allocation_to_json(allocation: Allocation) -> str:
    return _dumps(allocation_to_dict(allocation))


def allocation_from_json(text: str) -> Allocation:
    return allocation_from_dict(_loads_object(text, "allocation"))


# -- NodeInventory -----------------------------------------------------------------------------------------

_GPU_FIELDS = tuple(f.name for f in fields(Gpu))


def gpu_to_dict(gpu: Gpu) -> dict[str, Any]:
    return {name: getattr(gpu, name) for name in _GPU_FIELDS}


def gpu_from_dict(data: Mapping[str, Any]) -> Gpu:
    return Gpu(**{name: value for name, value in data.items() if name in _GPU_FIELDS})


def inventory_to_dict(inventory: NodeInventory) -> dict[str, Any]:
    return {
        "hostname": inventory.hostname,
        "gpus": [gpu_to_dict(g) for g in inventory.gpus],
        "nvlink": [list(row) for row in inventory.nvlink],
        "topo": [list(row) for row in inventory.topo],
        "cpus": inventory.cpus,
        "memory_mb": inventory.memory_mb,
        "model": inventory.model,
        **({"features": list(inventory.features)} if inventory.features else {}),
        **({"containment": inventory.containment} if inventory.containment else {}),
    }


def inventory_from_dict(data: Mapping[str, Any]) -> NodeInventory:
    return NodeInventory(
        hostname=data["hostname"],
        gpus=tuple(gpu_from_dict(g) for g in data["gpus"]),
        nvlink=tuple(tuple(row) for row in data["nvlink"]),
        topo=tuple(tuple(row) for row in data["topo"]),
        cpus=data["cpus"],
        memory_mb=data["memory_mb"],
        model=data.get("model", ""),
        features=tuple(data.get("features", ())),
        containment=str(data.get("containment", "")),
    )


def inventory_to_json(inventory: NodeInventory) -> str:
    return _dumps(inventory_to_dict(inventory))


def inventory_from_json(text: str) -> NodeInventory:
    return inventory_from_dict(_loads_object(text, "node inventory"))


def spec_key(spec_json: str) -> str:
    """The key a spec is stored under in the job_specs table: a digest of its JSON text, so that every job
    with the same spec (every task of an array) shares one row, and writing it twice is a no-op."""
    return hashlib.sha256(spec_json.encode()).hexdigest()[:32]
def usage_to_json(usage: AttemptUsage | None) -> str | None:
    if usage is None:
        return None
    return _dumps({f.name: getattr(usage, f.name) for f in fields(usage) if getattr(usage, f.name) is not None})


def usage_from_json(text: str | None) -> AttemptUsage | None:
    if text is None:
        return None
    data = _loads_object(text, "attempt usage")
    known = {f.name for f in fields(AttemptUsage)}
    return AttemptUsage(**{key: value for key, value in data.items() if key in known})
