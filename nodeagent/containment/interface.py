"""The containment interface: what an attempt is given, and what a containment can enforce.

An attempt's cgroup is a mapping from controller name to its directory (``CgroupDirs``): that is all the
supervisor needs (it joins each rank to them before exec, then empties and removes them, see
nodeagent/supervisor/cgroup_runtime.py), and it is written in the attempt's launch.json, so it survives
agent restarts: a restarted agent re-adopts the attempt through its job directory and its cgroup.

Job steps (a later issue) get a child cgroup of their attempt's: ``Containment.create_child(dirs, name)``
makes ``<attempt>/<name>`` in every hierarchy, inheriting the attempt's limits (v1 limits are hierarchical;
only a cpuset must be copied down), so a step's processes are tracked and killed on their own while the
attempt's memory, CPUs, devices and pids limits still hold for all its steps together.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

CgroupDirs = Mapping[str, str]

# What a containment may enforce, in the order --check prints them.
MEMORY = "memory"
CPUSET = "cpuset"
DEVICES = "devices"
PIDS = "pids"
FREEZER = "freezer"
CPUACCT = "cpuacct"
CONTROLLERS = (MEMORY, CPUSET, DEVICES, PIDS, FREEZER, CPUACCT)
# Those that constrain a job (cpuacct only measures it).
ENFORCING = (MEMORY, CPUSET, DEVICES, PIDS, FREEZER)

DEFAULT_PIDS_MAX = 10_000


@dataclass(frozen=True, slots=True)
class AttemptLimits:
    """What one attempt may use on this node."""

    memory_bytes: int = 0  # 0: no memory limit (the job asked for none and its partition gives none)
    cpus: tuple[int, ...] = ()  # the scheduler's choice; () = any CPU of the agent's cpuset
    gpu_minors: tuple[int, ...] = ()  # /dev/nvidiaN minor numbers of the allocated GPUs
    pids_max: int = DEFAULT_PIDS_MAX
    # The node's other GPUs' minors: the device files the attempt may not open (the agent's job_devices =
    # "gpus", as Slurm's ConstrainDevices denies the GPUs a job was not given and leaves every other device).
    other_gpu_minors: tuple[int, ...] = ()
    # job_devices = "allowlist": no device file but its GPUs, the driver's control devices and the standard ones.
    only_listed_devices: bool = False


@dataclass(frozen=True, slots=True)
class ControllerCheck:
    """One controller as the start-up probe found it."""

    name: str
    usable: bool
    detail: str  # where it is, or why it cannot be used


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What the agent found at start-up and can enforce."""

    kind: str  # "cgroup-v1", or "unconfined"
    checks: tuple[ControllerCheck, ...] = field(default=())

    def can(self, controller: str) -> bool:
        return any(check.name == controller and check.usable for check in self.checks)

    @property
    def enforced(self) -> tuple[str, ...]:
        return tuple(check.name for check in self.checks if check.usable and check.name in ENFORCING)

    @property
    def confined(self) -> bool:
        """Whether anything is enforced at all (else the node runs jobs unconfined)."""
        return bool(self.enforced)

    def summary(self) -> str:
        """One line for the log and ginfo: "cgroup-v1: memory,cpuset,devices,pids,freezer" or "unconfined"."""
        if not self.confined:
            return "unconfined"
        return f"{self.kind}: {','.join(self.enforced)}"


class ContainmentError(Exception):
    """An attempt's cgroup could not be made (the launch fails, and is retried elsewhere)."""


class Containment(Protocol):
    @property
    def capabilities(self) -> Capabilities: ...

    def create(self, name: str, limits: AttemptLimits) -> CgroupDirs | None:
        """The attempt's cgroup with its limits, before any of its processes exists; None when unconfined.
        Raises ContainmentError."""
        ...

    def attempt_dirs(self, name: str) -> CgroupDirs | None:
        """Where create(name, ...) puts the attempt's cgroup (whether or not it exists); None when unconfined."""
        ...

    def create_child(self, dirs: CgroupDirs, name: str) -> CgroupDirs:
        """A child of an attempt's cgroup (a job step's), inheriting its limits."""
        ...

    def destroy(self, dirs: CgroupDirs) -> bool:
        """Kill whatever is left in the cgroup, wait until it is empty, remove it. True once removed."""
        ...
