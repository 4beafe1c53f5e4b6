"""Validation of submitted jobs. The controller validates everything itself; it never trusts the CLI."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from garrison.config import ControllerConfig, PartitionConfig
from garrison.controller.dependency import parse_dependency
from garrison.controller.sched.explain import never_text
from garrison.controller.sched.feasibility import IdleCluster, Verdict
from garrison.controller.sched.pipeline import build_pipeline
from garrison.controller.sched.placement import Placer, gang_shape, request_for
from garrison.controller.sched.snapshot import NodeView
from garrison.controller.signals import parse_signal_request
from garrison.model.accounts import Accounting, AccountingError, PartitionDef
from garrison.model.domain import JobSpec, LaunchMode, Node, NodeInventory, Principal
from garrison.model.features import ConstraintError, constraint_features, parse_constraint, satisfies
from garrison.model.gputype import gpu_matches
from garrison.model.jobspec import UNLIMITED_TIME_S
from garrison.model.partitions import SEPARATOR, joined, partition_names
from garrison.model.resources import ResourceError, memory_per_node_mb, resolve

MAX_SCRIPT_BYTES = 1 << 20
MAX_ENV_BYTES = 1 << 20
MAX_ARGS_BYTES = 256 << 10
MAX_GPUS = 1 << 16
MAX_NODES = 1 << 14
MAX_PATTERN_LEN = 4096
MAX_NICE = 2_147_483_645  # sbatch's range
MAX_COMMENT_LEN = 1024
MAX_PARTITIONS_PER_JOB = 32  # -p a,b,...
OPEN_MODES = ("append", "truncate")
# gsub's host name (SLURM_SUBMIT_HOST): informational, but it lands in every rank's environment.
SUBMIT_HOST = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,252}[A-Za-z0-9])?$")


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


def partition_nodes(part: PartitionConfig | PartitionDef, nodes: Sequence[Node]) -> list[Node]:
    return [n for n in nodes if not part.nodes or n.name in part.nodes]


# As Slurm, a job name may be any text (``train-%j``, ``exp/lr=0.1``, ``run (v2)``, ``résumé``: %x puts it in
# output paths as given, and those are opened with the user's own rights); what is refused is what would corrupt
# a listing or a log line: control characters, line breaks, nothing but spaces.
MAX_JOB_NAME_CHARS = 128


def valid_job_name(name: str) -> bool:
    return 0 < len(name) <= MAX_JOB_NAME_CHARS and name.isprintable() and not name.isspace()


def validate_submission(
    spec: JobSpec,
    principal: Principal,
    config: ControllerConfig,
    nodes: Mapping[str, Node],
    array_indices: Sequence[int],
    accounting: Accounting | None = None,
) -> Resolved:
    """Check a submission and resolve its account, partition, QoS and time limit. With ``accounting`` (the
    controller always passes it) accounts, partitions and QoS come from there; without, from ``config``."""
    if principal.uid == 0 and not config.allow_root_jobs:
        raise ValidationError("jobs may not run as root on this cluster (allow_root_jobs is off)")
    if not valid_job_name(spec.name):
        raise ValidationError(f"job name must be 1-{MAX_JOB_NAME_CHARS} printable characters, not only spaces")
    # Sizes and characters of every field (limits.py imports this module, hence the late import).
    from garrison.controller.limits import check_spec_limits, shown

    check_spec_limits(spec)
    if abs(spec.nice) > MAX_NICE:
        raise ValidationError(f"--nice must be between -{MAX_NICE} and {MAX_NICE}")
    if spec.launch == LaunchMode.ALLOCATION:
        if spec.script is not None or spec.command:
            raise ValidationError("an allocation (galloc) runs no script or command of its own on the nodes")
        if array_indices:
            raise ValidationError("an allocation (galloc) cannot be a job array")
    elif spec.script is None and not spec.command:
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
    if spec.submit_dir is not None and (not spec.submit_dir.startswith("/") or "\0" in spec.submit_dir
                                        or len(spec.submit_dir) > MAX_PATTERN_LEN):
        raise ValidationError(f"submit directory must be an absolute path, got {spec.submit_dir[:100]!r}")
    for option, pattern in (("--output", spec.output), ("--error", spec.error)):
        if pattern is not None and (len(pattern) > MAX_PATTERN_LEN or "\0" in pattern):
            raise ValidationError(f"{option} pattern is invalid")
    _positive(spec.nodes, "--nodes", MAX_NODES)
    _positive(spec.gpus, "--gpus", MAX_GPUS)
    _positive(spec.gpus_per_node, "--gpus-per-node", MAX_GPUS)
    _positive(spec.ntasks_per_node, "--ntasks-per-node", 4096)
    if spec.nodes is not None and spec.gpus is not None and spec.gpus < spec.nodes:
        raise ValidationError(f"--gpus {spec.gpus} is fewer than one GPU per node on {spec.nodes} nodes")
    if spec.cpus_per_gpu < 0 or spec.mem_mb < 0 or spec.max_restarts < 0 or spec.gpu_mem_mb < 0:
        raise ValidationError("--cpus-per-gpu, --mem, --gpu-mem and --max-restarts must not be negative")
    if spec.signal is not None:
        try:
            parse_signal_request(spec.signal)
        except ValueError as exc:
            raise ValidationError(str(exc)) from None
    if spec.submit_host is not None and not SUBMIT_HOST.match(spec.submit_host):
        raise ValidationError(f"submit host must be a host name, got {spec.submit_host[:100]!r}")
    if spec.exclude:
        unknown = [name for name in spec.exclude if name not in nodes]
        if unknown:
            raise ValidationError(f"--exclude: no such node {shown(unknown[0])}")
    if spec.dependency is not None:
        try:
            parse_dependency(spec.dependency)
        except ValueError as exc:
            raise ValidationError(str(exc)) from None
    if spec.umask is not None and not 0 <= spec.umask <= 0o777:
        raise ValidationError(f"umask must be between 0 and 0777, got {spec.umask:o}")
    if spec.max_restarts > 1000:
        raise ValidationError("--max-restarts is at most 1000")
    if spec.comment is not None and (len(spec.comment) > MAX_COMMENT_LEN
                                     or any(not char.isprintable() for char in spec.comment)):
        raise ValidationError(f"--comment must be at most {MAX_COMMENT_LEN} printable characters")
    if spec.open_mode is not None and spec.open_mode not in OPEN_MODES:
        raise ValidationError(f"--open-mode must be append or truncate, got {shown(spec.open_mode)}")
    _positive(spec.ntasks, "--ntasks", MAX_GPUS)
    _positive(spec.cpus_per_task, "--cpus-per-task", MAX_GPUS)
    _positive(spec.gpus_per_task, "--gpus-per-task", MAX_GPUS)
    _positive(spec.ntasks_per_gpu, "--ntasks-per-gpu", MAX_GPUS)
    try:
        spec = resolve(spec)  # sbatch's task options onto what the scheduler knows
    except ResourceError as exc:
        raise ValidationError(str(exc)) from None
    _positive(spec.nodes, "--nodes", MAX_NODES)
    _positive(spec.gpus, "--gpus", MAX_GPUS)
    if spec.launch == LaunchMode.RANK and spec.total_gpus() == 0 and spec.ntasks_per_node is None:
        # A CPU-only job in rank mode runs one process per node.
        spec = replace(spec, ntasks_per_node=1)
    def resolve_in(one: JobSpec) -> Resolved:
        return _resolve_in_partition(one, principal, config, nodes, array_indices, accounting)

    if spec.partition is not None and SEPARATOR in spec.partition:
        return _resolve_in_partitions(spec, resolve_in, _partition_priorities(config, accounting))
    return resolve_in(spec)


def _resolve_in_partitions(
    spec: JobSpec, resolve_in: Callable[[JobSpec], Resolved], priority: Mapping[str, int]
) -> Resolved:
    """-p a,b: the job waits in every named partition that accepts it and starts in the first that can run it
    (sched/phases/place_elsewhere.py). The partitions are tried in order of their priority, highest first, then
    as named (sbatch: "higher priority partitions will be considered first"). The job has one time limit,
    resolved in the first partition that accepts it (its default when -t is not given); a later partition
    keeps the job only if it accepts that limit. A partition that refuses the job is dropped, as Slurm's
    EnforcePartLimits=ANY does; the job is refused only when every one refuses it, with each one's reason."""
    names = partition_names(spec.partition or "")
    if not names:
        raise ValidationError(f"--partition {spec.partition!r} names no partition")
    if len(names) > MAX_PARTITIONS_PER_JOB:
        raise ValidationError(f"--partition names {len(names)} partitions, at most {MAX_PARTITIONS_PER_JOB}")
    names = tuple(sorted(names, key=lambda name: -priority.get(name, 0)))  # stable: as named within a priority
    first: Resolved | None = None
    kept: list[str] = []
    refusals: list[str] = []
    for name in names:
        one = replace(spec, partition=name)
        if first is not None:
            one = replace(one, time_limit_s=first.time_limit_s)
        try:
            resolved = resolve_in(one)
        except ValidationError as exc:
            refusals.append(f"{name}: {exc}")
            continue
        if first is None:
            first = resolved
        kept.append(resolved.partition)
    if first is None:
        raise ValidationError(f"no partition of --partition {spec.partition} accepts the job ({'; '.join(refusals)})")
    if len(kept) == 1:
        return first
    listed = joined(kept)
    return replace(first, spec=replace(first.spec, partition=listed), partition=listed)


def _partition_priorities(config: ControllerConfig, accounting: Accounting | None) -> dict[str, int]:
    if accounting is not None:
        return {p.name: p.priority for p in accounting.partitions}
    return {p.name: p.priority for p in config.partitions}


def _resolve_in_partition(
    spec: JobSpec,
    principal: Principal,
    config: ControllerConfig,
    nodes: Mapping[str, Node],
    array_indices: Sequence[int],
    accounting: Accounting | None,
) -> Resolved:
    """The checks that depend on the partition (its account and QoS rules, its time limits, its nodes), for a
    spec that names at most one."""
    part: PartitionConfig | PartitionDef
    if accounting is not None:
        account, part, spec = _resolve_policy(spec, principal, accounting)
    else:
        account = spec.account or config.default_account
        if account not in config.accounts:
            raise ValidationError(f"unknown account {account!r}")
        part = _partition(config, spec.partition)
        if part.allowed_accounts and account not in part.allowed_accounts:
            raise ValidationError(f"account {account!r} may not use partition {part.name!r}")
    time_limit = spec.time_limit_s if spec.time_limit_s is not None else part.default_time_s
    if time_limit == UNLIMITED_TIME_S:
        # --time=UNLIMITED: no limit but the partition's (and the QoS's) maximum, which the job keeps from here
        qos_max = accounting.qos_map[spec.qos].max_time_s if accounting is not None and spec.qos else None
        time_limit = min(part.max_time_s, qos_max if qos_max is not None else part.max_time_s)
        spec = replace(spec, time_limit_s=time_limit)
    if time_limit <= 0:
        raise ValidationError("time limit must be positive")
    if time_limit > part.max_time_s:
        raise ValidationError(
            f"time limit {time_limit}s exceeds partition {part.name!r} maximum of {part.max_time_s}s"
        )

    if accounting is not None and spec.qos:
        qos = accounting.qos_map[spec.qos]
        if qos.max_time_s is not None and time_limit > qos.max_time_s:
            raise ValidationError(f"time limit {time_limit}s exceeds QoS {qos.name!r} maximum of {qos.max_time_s}s")

    if len(array_indices) > config.max_array_size:
        raise ValidationError(
            f"--array: {len(array_indices)} tasks, more than this cluster's max_array_size ({config.max_array_size})"
        )
    if len(set(array_indices)) != len(array_indices):
        raise ValidationError("array indices must be unique")
    if spec.array_max_running is not None and spec.array_max_running <= 0:
        raise ValidationError("array %limit must be positive")

    members = partition_nodes(part, list(nodes.values()))
    spec, chosen = _check_node_selection(spec, members, nodes, part.name)
    verdict = ever_runs(spec, members, part.name, time_limit)
    if verdict is None or verdict.runs:
        return Resolved(spec=spec, account=account, partition=part.name, time_limit_s=time_limit)
    # The core says it can never run; the checks below say why in the terms of the options given.
    try:
        _check_fits_somewhere(spec, chosen, part.name)
        raise ValidationError(never_text(request_for(0, spec, part.name, time_limit), verdict.tally, part.name))
    except ValidationError as exc:
        if len(chosen) == len(members):
            raise
        from garrison.controller.limits import shown

        within = f"--nodelist {shown(','.join(spec.nodelist))}" if spec.nodelist else ""
        within = " and ".join(filter(None, [f"--constraint {shown(spec.constraint)}" if spec.constraint else "",
                                            within]))
        raise ValidationError(f"{exc} (counting only the nodes that match {within})") from None


def static_view(node: Node, partition: str) -> NodeView:
    """The core's view of a registered node as if it were up and idle (what "could it ever run?" looks at)."""
    inventory = node.inventory
    return NodeView(
        name=node.name,
        schedulable=True,
        gpu_names=tuple(g.name for g in inventory.gpus),
        free_gpus=frozenset(g.index for g in inventory.gpus),
        nvlink=inventory.nvlink,
        partitions=frozenset({partition}),
        topo=inventory.topo,
        gpu_memory_mib=tuple(g.memory_mib for g in inventory.gpus),
        cpus=inventory.cpus,
        free_cpus=frozenset(range(inventory.cpus)),
        memory_mb=inventory.memory_mb,
        free_memory_mb=inventory.memory_mb,
        features=frozenset(node.features),
    )


def ever_runs(spec: JobSpec, members: Sequence[Node], partition: str, time_limit_s: int) -> Verdict | None:
    """The scheduling core's answer (sched/feasibility.py) to "could any state of the partition's registered
    nodes run this job?"; None while no node has registered (accept and let it wait)."""
    if not members:
        return None
    request = request_for(0, spec, partition, float(time_limit_s))
    return _idle_partition(members, partition).verdict(request)


# Per partition: the inventories of the registered nodes an IdleCluster was built from (kept, so they stay
# the same objects), and it. A submission looks at a node's inventory (GPUs, CPUs, memory, features) only,
# never its state, and an inventory object is replaced, never changed, when its agent registers again (a
# heartbeat replaces the Node, not its inventory): the same objects give the same answers, so a submission
# costs a comparison of references, and a look-alike of an earlier one a dict lookup.
_IDLE_PARTITIONS: dict[str, tuple[tuple[tuple[str, NodeInventory], ...], IdleCluster]] = {}


def _idle_partition(members: Sequence[Node], partition: str) -> IdleCluster:
    found = _IDLE_PARTITIONS.get(partition)
    if found is not None and len(found[0]) == len(members) and all(
            name == n.name and inventory is n.inventory for (name, inventory), n in zip(found[0], members, strict=True)):
        return found[1]
    views = sorted((static_view(n, partition) for n in members), key=lambda v: v.name)
    idle = IdleCluster(views, Placer(build_pipeline()))
    if len(_IDLE_PARTITIONS) > 64:
        _IDLE_PARTITIONS.clear()
    _IDLE_PARTITIONS[partition] = (tuple((n.name, n.inventory) for n in members), idle)
    return idle


def _resolve_policy(spec: JobSpec, principal: Principal, accounting: Accounting) -> tuple[str, PartitionDef, JobSpec]:
    """The account the job charges, its partition, and its spec with the QoS resolved (-A, -p, -q)."""
    try:
        account = accounting.account_for(principal.user, spec.account)
    except AccountingError as exc:
        raise ValidationError(str(exc)) from None
    if spec.partition is None:
        part = accounting.default_partition()
        if part is None:
            raise ValidationError("no partition is defined (an admin adds one with gadmin partition add)")
    else:
        found = accounting.partition_map.get(spec.partition)
        if found is None:
            known = ", ".join(p.name for p in accounting.partitions)
            raise ValidationError(f"unknown partition {spec.partition!r} (known: {known})")
        part = found
    if not accounting.partition_allows_account(part, account):
        raise ValidationError(f"account {account!r} may not use partition {part.name!r}")
    allowed = accounting.allowed_qos(account)
    qos = spec.qos or accounting.default_qos
    if spec.qos is None and allowed and qos not in allowed:
        qos = allowed[0]  # the account's first QoS when the cluster's default is not one of its QoS
    if qos:
        if qos not in accounting.qos_map:
            known = ", ".join(q.name for q in accounting.qos)
            raise ValidationError(f"unknown QoS {qos!r} (known: {known})")
        if allowed and qos not in allowed:
            raise ValidationError(f"account {account!r} may not use QoS {qos!r} (allowed: {', '.join(allowed)})")
        if part.allowed_qos and qos not in part.allowed_qos:
            raise ValidationError(f"partition {part.name!r} does not allow QoS {qos!r}")
    return account, part, replace(spec, qos=qos or None)


def _check_node_selection(
    spec: JobSpec, members: list[Node], nodes: Mapping[str, Node], partition: str
) -> tuple[JobSpec, list[Node]]:
    """-C, -w: the spec (with -N from the -w list when not given, as sbatch) and the partition's nodes that the
    job may run on. Refused, as sbatch refuses them: a feature no node of the partition has ("Invalid feature
    specification"), a node that does not exist or is not in the partition, more -w nodes than -N."""
    from garrison.controller.limits import shown

    in_partition = {n.name for n in members}
    if spec.constraint is not None:
        try:
            terms = parse_constraint(spec.constraint)
        except ConstraintError as exc:
            raise ValidationError(str(exc)) from None
        if members:  # no agent has registered yet: accept and let it wait
            known = {feature for n in members for feature in n.features}
            unknown = sorted(constraint_features(terms) - known)
            if unknown:
                raise ValidationError(
                    f"--constraint: invalid feature specification: no node in partition {partition!r} has feature "
                    f"{shown(unknown[0])}"
                )
            members = [n for n in members if satisfies(n.features, terms)]
            if not members:
                raise ValidationError(
                    f"--constraint: no node in partition {partition!r} has features {shown(spec.constraint)}"
                )
    if spec.nodelist:
        unknown_nodes = [name for name in spec.nodelist if name not in nodes]
        if unknown_nodes:
            raise ValidationError(f"--nodelist: no such node {shown(unknown_nodes[0])}")
        both = [name for name in spec.nodelist if name in spec.exclude]
        if both:
            raise ValidationError(f"--nodelist and --exclude both name node {shown(both[0])}")
        member_names = {n.name for n in members}
        outside = [name for name in spec.nodelist if name not in member_names]
        if outside:
            why = f"is not in partition {partition!r}"
            if outside[0] in in_partition:  # so it is the constraint that leaves it out
                why = f"lacks the features {shown(spec.constraint or '')}"
            raise ValidationError(f"--nodelist: node {shown(outside[0])} {why}")
        if spec.nodes is None:
            spec = replace(spec, nodes=len(spec.nodelist))
        elif spec.nodes < len(spec.nodelist):
            raise ValidationError(
                f"--nodelist names {len(spec.nodelist)} nodes but --nodes asks for {spec.nodes}"
            )
        if spec.nodes == len(spec.nodelist):
            members = [n for n in members if n.name in spec.nodelist]
    return spec, members


def _check_fits_somewhere(spec: JobSpec, nodes: list[Node], partition: str) -> None:
    """Refuse a job no configuration of this partition could ever run (it would wait forever)."""
    if not nodes:
        return  # no agent has registered yet: accept and let it wait
    shape = gang_shape(spec)
    _check_host_resources(spec, shape.gpus_per_node, nodes, partition)
    sizes = sorted(
        (
            sum(1 for g in n.inventory.gpus if gpu_matches(g.name, spec.gpu_type) and g.memory_mib >= spec.gpu_mem_mb)
            for n in nodes
        ),
        reverse=True,
    )
    if (spec.gpu_type is not None or spec.gpu_mem_mb) and spec.total_gpus() and not any(sizes):
        wanted = [f"of type {spec.gpu_type!r}"] if spec.gpu_type is not None else []
        wanted += [f"with {spec.gpu_mem_mb} MiB of memory"] if spec.gpu_mem_mb else []
        raise ValidationError(f"no node in partition {partition!r} has GPUs {' and '.join(wanted)}")
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


def _check_host_resources(spec: JobSpec, gpus_per_node: int | None, nodes: list[Node], partition: str) -> None:
    """Refuse host memory or CPUs per node that no node of the partition has (``--mem 4T``)."""
    least_gpus = gpus_per_node if gpus_per_node is not None else (1 if spec.total_gpus() else 0)
    memory = memory_per_node_mb(spec, least_gpus)
    largest_memory = max(n.inventory.memory_mb for n in nodes)
    if memory > largest_memory:
        # --mem-per-cpu is mapped onto mem_mb or mem_per_gpu_mb (model/resources.py): name it first, as given.
        option = "--mem-per-cpu" if spec.mem_per_cpu_mb else ("--mem" if spec.mem_mb else "--mem-per-gpu")
        raise ValidationError(
            f"{option}: {memory} MB per node exceeds the largest node in partition {partition!r} "
            f"({largest_memory} MB)"
        )
    cpus = spec.cpus_per_gpu * least_gpus if least_gpus else spec.cpus_per_node
    largest_cpus = max(n.inventory.cpus for n in nodes)
    if cpus > largest_cpus:
        # Name what the user gave: a CPU job's task count asks for a CPU per task without any CPU option.
        option = ("--cpus-per-task" if spec.cpus_per_task is not None else "--cpus-per-gpu" if spec.cpus_per_gpu
                  else "--ntasks-per-node" if spec.ntasks_per_node is not None else "--ntasks")
        raise ValidationError(
            f"{option}: {cpus} CPUs per node exceed the largest node in partition {partition!r} ({largest_cpus})"
        )
