"""Validation of submitted jobs. The controller validates everything itself; it never trusts the CLI."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from garrison.config import ControllerConfig, PartitionConfig
from garrison.controller.domain import JobSpec, LaunchMode, Node, Principal
from garrison.controller.sched.placement import gang_shape, gpu_matches

MAX_SCRIPT_BYTES = 1 << 20
MAX_ENV_BYTES = 1 << 20
MAX_ARGS_BYTES = 256 << 10
MAX_GPUS = 1 << 16
MAX_NODES = 1 << 14
MAX_PATTERN_LEN = 4096
JOB_NAME = re.compile(r"^[A-Za-z0-9._+@:=,-][A-Za-z0-9._+@:=, -]{0,127}$")


class ValidationError(ValueError):
    """One line naming what is wrong with the request (gRPC INVALID_ARGUMENT)."""


@dataclass(frozen=True)
class Resolved:
    spec: JobSpec
    account: str
    partition: str
    time_limit_s: int


def _positive(value: int | None, option: str, maximum: int) -> None:
    if value is None:
        return
    if value <= 0:
        raise ValidationError(f"{option} must be a positive number, got {value}")
    if value > maximum:
        raise ValidationError(f"{option} is too large: {value} (at most {maximum})")


def _partition(config: ControllerConfig, name: str | None) -> PartitionConfig:
    if name is None:
        default = next((p for p in config.partitions if p.default), config.partitions[0])
        return default
    for part in config.partitions:
        if part.name == name:
            return part
    known = ", ".join(p.name for p in config.partitions)
    raise ValidationError(f"unknown partition {name!r} (known: {known})")


def partition_nodes(part: PartitionConfig, nodes: Sequence[Node]) -> list[Node]:
    return [n for n in nodes if not part.nodes or n.name in part.nodes]


def validate_submission(
    spec: JobSpec,
    principal: Principal,
    config: ControllerConfig,
    nodes: Mapping[str, Node],
    array_indices: Sequence[int],
) -> Resolved:
    if principal.uid == 0 and not config.allow_root_jobs:
        raise ValidationError("jobs may not run as root on this cluster (allow_root_jobs is off)")
    if not spec.name or not JOB_NAME.match(spec.name):
        raise ValidationError("job name must be 1-128 characters of letters, digits, space and ._+@:=,-")
    if spec.script is None and not spec.command:
        raise ValidationError("nothing to run: give a script or a command")
    if spec.script is not None and len(spec.script.encode()) > MAX_SCRIPT_BYTES:
        raise ValidationError(f"script is larger than {MAX_SCRIPT_BYTES} bytes")
    if "\0" in (spec.script or "") or any("\0" in a for a in spec.command):
        raise ValidationError("script and arguments must not contain NUL characters")
    if sum(len(a) for a in spec.command) > MAX_ARGS_BYTES:
        raise ValidationError(f"arguments are longer than {MAX_ARGS_BYTES} bytes")
    if sum(len(k) + len(v) for k, v in spec.env.items()) > MAX_ENV_BYTES:
        raise ValidationError(f"environment is larger than {MAX_ENV_BYTES} bytes")
    if any(not k or "=" in k or "\0" in k or "\0" in v for k, v in spec.env.items()):
        raise ValidationError("environment variable names must be non-empty without '=' or NUL")
    if not spec.workdir.startswith("/"):
        raise ValidationError(f"working directory must be an absolute path, got {spec.workdir!r}")
    for option, pattern in (("--output", spec.output), ("--error", spec.error)):
        if pattern is not None and (len(pattern) > MAX_PATTERN_LEN or "\0" in pattern):
            raise ValidationError(f"{option} pattern is invalid")
    _positive(spec.nodes, "--nodes", MAX_NODES)
    _positive(spec.gpus, "--gpus", MAX_GPUS)
    _positive(spec.gpus_per_node, "--gpus-per-node", MAX_GPUS)
    _positive(spec.ntasks_per_node, "--ntasks-per-node", 4096)
    if spec.gpus is not None and spec.gpus_per_node is not None:
        raise ValidationError("give either --gpus or --gpus-per-node, not both")
    if spec.nodes is not None and spec.gpus is not None and spec.gpus < spec.nodes:
        raise ValidationError(f"--gpus {spec.gpus} is fewer than one GPU per node on {spec.nodes} nodes")
    if spec.cpus_per_gpu < 0 or spec.mem_mb < 0 or spec.max_restarts < 0:
        raise ValidationError("--cpus-per-gpu, --mem and --max-restarts must not be negative")
    if spec.max_restarts > 1000:
        raise ValidationError("--max-restarts is at most 1000")
    if spec.launch == LaunchMode.RANK and spec.total_gpus() == 0 and spec.ntasks_per_node is None:
        # A CPU-only job in rank mode runs one process per node.
        spec = replace(spec, ntasks_per_node=1)

    account = spec.account or config.default_account
    if account not in config.accounts:
        raise ValidationError(f"unknown account {account!r}")
    part = _partition(config, spec.partition)
    if part.allowed_accounts and account not in part.allowed_accounts:
        raise ValidationError(f"account {account!r} may not use partition {part.name!r}")
    time_limit = spec.time_limit_s if spec.time_limit_s is not None else part.default_time_s
    if time_limit <= 0:
        raise ValidationError("time limit must be positive")
    if time_limit > part.max_time_s:
        raise ValidationError(
            f"time limit {time_limit}s exceeds partition {part.name!r} maximum of {part.max_time_s}s"
        )

    if len(array_indices) > config.max_array_size:
        raise ValidationError(f"array has {len(array_indices)} tasks; at most {config.max_array_size}")
    if len(set(array_indices)) != len(array_indices):
        raise ValidationError("array indices must be unique")
    if spec.array_max_running is not None and spec.array_max_running <= 0:
        raise ValidationError("array %limit must be positive")

    _check_fits_somewhere(spec, partition_nodes(part, list(nodes.values())), part.name)
    return Resolved(spec=spec, account=account, partition=part.name, time_limit_s=time_limit)


def _check_fits_somewhere(spec: JobSpec, nodes: list[Node], partition: str) -> None:
    """Refuse a job no configuration of this partition could ever run (it would wait forever)."""
    if not nodes:
        return  # no agent has registered yet: accept and let it wait
    shape = gang_shape(spec)
    sizes = sorted(
        (sum(1 for g in n.inventory.gpus if gpu_matches(g.name, spec.gpu_type)) for n in nodes), reverse=True
    )
    if spec.gpu_type is not None and not any(sizes):
        raise ValidationError(f"no node in partition {partition!r} has GPUs of type {spec.gpu_type!r}")
    if shape.node_count is not None and shape.node_count > len(nodes):
        raise ValidationError(f"partition {partition!r} has {len(nodes)} nodes; the job asks for {shape.node_count}")
    if shape.gpus_per_node is not None and shape.node_count is not None:
        capable = [s for s in sizes if s >= shape.gpus_per_node]
        if len(capable) < shape.node_count:
            raise ValidationError(
                f"no {shape.node_count} node(s) in partition {partition!r} have {shape.gpus_per_node} GPUs each "
                f"(largest: {sizes[0]})"
            )
    elif shape.node_count is not None:
        per_node_max = -(-shape.total_gpus // shape.node_count)
        if sum(sorted(sizes, reverse=True)[: shape.node_count]) < shape.total_gpus or sizes[0] < per_node_max:
            raise ValidationError(
                f"{shape.total_gpus} GPUs on {shape.node_count} node(s) exceed what partition {partition!r} has"
            )
    elif shape.total_gpus > sum(sizes):
        raise ValidationError(f"{shape.total_gpus} GPUs exceed the {sum(sizes)} in partition {partition!r}")
