"""Bounds on everything a request can carry, checked before the controller does any work with it.

validate.py decides whether a job makes sense on this cluster; this module only makes sure no request is
big or strange enough to cost the controller much, to fill the store with junk, or to come back as a
megabyte-long error message. Each refusal is one line naming the field (INVALID_ARGUMENT). The limits are
far above anything a real job needs: a batch script of 1 MiB, 10,000 arguments, 10,000 variables.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from garrison.controller.validate import MAX_JOB_NAME_CHARS, ValidationError
from garrison.model.domain import JobSpec, NodeInventory
from garrison.model.partitions import SEPARATOR, partition_names

if TYPE_CHECKING:
    from garrison.protos.v1 import admin_pb2 as adminpb
    from garrison.protos.v1 import garrison_pb2 as pb

MAX_ARGS = 10_000
MAX_ENV_VARS = 10_000
MAX_ENV_NAME_CHARS = 1024
MAX_PATH_CHARS = 4096
MAX_NAME_CHARS = 64  # accounts, partitions, QoS, GPU types
MAX_PARTITION_LIST_CHARS = 1024  # -p a,b,...
MAX_MEM_MB = 1 << 40
MAX_CPUS_PER_GPU = 4096
MAX_LIST_ITEMS = 10_000  # job ids, users or states in one request
MAX_USER_CHARS = 256
MAX_JOB_REF_CHARS = 40  # "123456_789"
MAX_STATE_CHARS = 32
MAX_GPUS_PER_NODE = 1024
MAX_NODE_STRING_CHARS = 256
SHOWN_CHARS = 40  # how much of a bad value an error message repeats

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+:@-]*$")  # @: Slurm account names such as six@gpu
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def shown(value: str) -> str:
    """A bad value as an error message may repeat it: quoted, and cut short if long."""
    return repr(value[:SHOWN_CHARS] + ("..." if len(value) > SHOWN_CHARS else ""))


def _printable(text: str) -> bool:
    return text.isprintable()


def _check_name(value: str | None, option: str) -> None:
    if value is None:
        return
    if len(value) > MAX_NAME_CHARS or not NAME.match(value):
        raise ValidationError(
            f"{option} {shown(value)} is not a valid name (up to {MAX_NAME_CHARS} letters, digits and ._+:@-)"
        )


def check_spec_limits(spec: JobSpec) -> None:
    """Refuse a job description that is oversized or malformed, whatever the cluster looks like."""
    if len(spec.command) > MAX_ARGS:
        raise ValidationError(f"too many arguments: {len(spec.command)} (at most {MAX_ARGS})")
    if len(spec.env) > MAX_ENV_VARS:
        raise ValidationError(f"too many environment variables: {len(spec.env)} (at most {MAX_ENV_VARS})")
    for name in spec.env:
        if len(name) > MAX_ENV_NAME_CHARS or not _printable(name):
            raise ValidationError(f"environment variable name {shown(name)} is invalid")
    if len(spec.workdir) > MAX_PATH_CHARS or "\0" in spec.workdir:
        raise ValidationError(f"working directory is invalid (NUL or over {MAX_PATH_CHARS} characters)")
    for option, pattern in (("--output", spec.output), ("--error", spec.error)):
        if pattern is not None and (len(pattern) > MAX_PATH_CHARS or "\0" in pattern or "\n" in pattern):
            raise ValidationError(f"{option} pattern is invalid (NUL, newline or over {MAX_PATH_CHARS} characters)")
    if len(spec.exclude) > MAX_LIST_ITEMS:
        raise ValidationError(f"--exclude: too many nodes: {len(spec.exclude)} (at most {MAX_LIST_ITEMS})")
    if len(spec.nodelist) > MAX_LIST_ITEMS:
        raise ValidationError(f"--nodelist: too many nodes: {len(spec.nodelist)} (at most {MAX_LIST_ITEMS})")
    _check_name(spec.account, "account")
    if spec.partition is not None and SEPARATOR in spec.partition:  # -p a,b: each a name
        if len(spec.partition) > MAX_PARTITION_LIST_CHARS:
            raise ValidationError(f"--partition list is too long (at most {MAX_PARTITION_LIST_CHARS} characters)")
        for name in partition_names(spec.partition):
            _check_name(name, "partition")
    else:
        _check_name(spec.partition, "partition")
    _check_name(spec.qos, "QoS")
    _check_name(spec.gpu_type, "GPU type")
    if spec.mem_mb > MAX_MEM_MB:
        raise ValidationError(f"--mem is too large: {spec.mem_mb} MB (at most {MAX_MEM_MB})")
    if spec.cpus_per_gpu > MAX_CPUS_PER_GPU:
        raise ValidationError(f"--cpus-per-gpu is too large: {spec.cpus_per_gpu} (at most {MAX_CPUS_PER_GPU})")


def check_list(values: Sequence[str], what: str, max_chars: int = MAX_USER_CHARS) -> None:
    """A repeated string field of a request: bounded in count and in each item's length."""
    if len(values) > MAX_LIST_ITEMS:
        raise ValidationError(f"too many {what}: {len(values)} (at most {MAX_LIST_ITEMS})")
    for value in values:
        if len(value) > max_chars or not _printable(value):
            raise ValidationError(f"invalid {what[:-1] if what.endswith('s') else what} {shown(value)}")


def check_filters(request: pb.ListJobsRequest | pb.CancelJobsRequest | adminpb.QueueDetailsRequest) -> None:
    """The name, partition and account filters of a ListJobs, CancelJobs or QueueDetails request."""
    check_list(request.names, "names", MAX_JOB_NAME_CHARS)
    check_list(request.partitions, "partitions", MAX_NAME_CHARS)
    check_list(request.accounts, "accounts", MAX_NAME_CHARS)


def validate_registration(node_name: str, inventory: NodeInventory, address: str) -> None:
    """An agent's Register: a node name usable in certificates and logs, and a sane inventory."""
    if not NODE_NAME.match(node_name):
        raise ValidationError(f"invalid node name {shown(node_name)}: 1-63 letters, digits, '.', '_' or '-'")
    if len(address) > MAX_NODE_STRING_CHARS or not _printable(address):
        raise ValidationError("invalid node address")
    count = len(inventory.gpus)
    if count > MAX_GPUS_PER_NODE:
        raise ValidationError(f"node {node_name} reports {count} GPUs (at most {MAX_GPUS_PER_NODE})")
    if sorted(g.index for g in inventory.gpus) != list(range(count)):
        raise ValidationError(f"node {node_name}: GPU indices must be 0..{count - 1}, each once")
    for matrix, what in ((inventory.nvlink, "NVLink matrix"), (inventory.topo, "topology matrix")):
        if matrix and (len(matrix) != count or any(len(row) != count for row in matrix)):
            raise ValidationError(f"node {node_name}: the {what} must be {count}x{count}")
    for label_row in inventory.topo:
        if any(len(label) > 16 for label in label_row):
            raise ValidationError(f"node {node_name}: topology labels are at most 16 characters")
    for gpu in inventory.gpus:
        for text in (gpu.uuid, gpu.name, gpu.pci_bus_id, gpu.cpu_affinity):
            if len(text) > MAX_NODE_STRING_CHARS or not _printable(text):
                raise ValidationError(f"node {node_name}: GPU {gpu.index} has an invalid description")
    for text in (inventory.hostname, inventory.model):
        if len(text) > MAX_NODE_STRING_CHARS or not _printable(text):
            raise ValidationError(f"node {node_name}: invalid host name or model")
