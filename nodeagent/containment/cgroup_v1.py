"""cgroup v1 containment: one directory per attempt in each of memory, cpuset, devices, pids, freezer and
cpuacct, under the agent's subtree.

The agent's subtree is ``cgroup_root`` resolved in each hierarchy: a relative path is taken below the
agent's own cgroup there (under systemd with ``Delegate=yes``, the unit's delegated cgroup; started by
hand from a shell, usually the hierarchy's root, so the default ``garrison`` is ``/garrison``); an absolute
path is taken from the hierarchy's mount. An attempt's directory is ``<subtree>/<name>`` (the agent names
it ``job_<id>_<attempt>``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from garrison.model.cpulist import format_cpu_list, parse_cpu_list
from garrison.nodeagent.containment import devices
from garrison.nodeagent.containment.interface import (
    CONTROLLERS,
    CPUSET,
    DEVICES,
    FREEZER,
    MEMORY,
    PIDS,
    AttemptLimits,
    Capabilities,
    CgroupDirs,
    ContainmentError,
    ControllerCheck,
)
from garrison.nodeagent.supervisor import cgroup_runtime

MOUNTINFO = Path("/proc/self/mountinfo")
OWN_CGROUPS = Path("/proc/self/cgroup")
NUMA_NODES = Path("/sys/devices/system/node")
# How long the majors of the GPU driver's dynamic devices (nvidia-uvm & co.) are taken as known: they only
# change when the driver's modules are loaded, and looking them up (/proc/devices and /dev) for every attempt
# was a tenth of the agent's work per job.
DYNAMIC_MAJORS_TTL_S = 10.0


@dataclass(frozen=True, slots=True)
class Hierarchy:
    """One mounted v1 hierarchy: where it is mounted and where the agent itself sits in it."""

    controllers: frozenset[str]
    mount: str
    own_path: str  # the agent's cgroup in it ("/" at the root)

    def subtree(self, cgroup_root: str) -> str:
        base = "/" if cgroup_root.startswith("/") else self.own_path
        return os.path.normpath(os.path.join(self.mount, base.lstrip("/"), cgroup_root.lstrip("/")))


def v1_hierarchies(mountinfo: Path = MOUNTINFO, own: Path = OWN_CGROUPS) -> dict[str, Hierarchy]:
    """Controller name -> its hierarchy, for every v1 controller mounted here (co-mounted ones share)."""
    own_paths: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in own.read_text().splitlines():
            _id, names, path = line.split(":", 2)
            for name in names.split(","):
                if name:
                    own_paths[name] = path
    found: dict[str, Hierarchy] = {}
    with contextlib.suppress(OSError):
        for line in mountinfo.read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields, right_fields = left.split(), right.split()
            if len(right_fields) < 3 or right_fields[0] != "cgroup":
                continue
            options = set(right_fields[2].split(","))
            controllers = frozenset(options & set(CONTROLLERS))
            root_in_mount = fields[3]
            if root_in_mount != "/":
                continue  # a bind mount of a sub-cgroup (a container's view): not ours to manage
            for name in controllers:
                own_path = own_paths.get(name) or own_paths.get(",".join(sorted(controllers))) or "/"
                found.setdefault(name, Hierarchy(controllers, fields[4], own_path))
    return found


def _write(path: str, *values: str) -> None:
    """One write(2) per value, on one descriptor: a cgroup file takes one entry per write (devices.allow)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        for value in values:
            os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 1 << 16).decode().strip()
    finally:
        os.close(fd)


def numa_nodes_of(cpus: Iterable[int], nodes_dir: Path = NUMA_NODES) -> set[int]:
    """The NUMA nodes (that exist here) holding any of these CPUs."""
    wanted = set(cpus)
    return {node for node, node_cpus in numa_topology(nodes_dir).items() if node_cpus & wanted}


def numa_topology(nodes_dir: Path = NUMA_NODES) -> dict[int, frozenset[int]]:
    """NUMA node -> its CPUs, as the host has them."""
    found: dict[int, frozenset[int]] = {}
    for node_dir in nodes_dir.glob("node[0-9]*"):
        try:
            found[int(node_dir.name.removeprefix("node"))] = parse_cpu_list(_read(str(node_dir / "cpulist")))
        except OSError:
            continue
    return found


class CgroupV1:
    """The cgroup v1 implementation of the containment interface (see interface.py)."""

    def __init__(self, cgroup_root: str, controllers: Mapping[str, str], checks: tuple[ControllerCheck, ...]) -> None:
        self.cgroup_root = cgroup_root
        self.subtrees = dict(controllers)  # usable controller -> the agent's subtree in it
        self._capabilities = Capabilities(kind="cgroup-v1", checks=checks)
        self._swap_accounted: bool | None = None  # memory.memsw.* exists
        self._numa: dict[int, frozenset[int]] | None = None  # read once: a host's NUMA layout does not change
        self._dynamic_majors: tuple[float, set[int]] | None = None  # (when looked up, majors), see the TTL

    def _numa_nodes_of(self, cpus: Iterable[int]) -> set[int]:
        if self._numa is None:
            self._numa = numa_topology()
        wanted = set(cpus)
        return {node for node, node_cpus in self._numa.items() if node_cpus & wanted}

    def _gpu_driver_majors(self) -> set[int]:
        now = time.monotonic()
        if self._dynamic_majors is None or now - self._dynamic_majors[0] > DYNAMIC_MAJORS_TTL_S:
            self._dynamic_majors = (now, devices.dynamic_majors())
        return self._dynamic_majors[1]

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    # --- start-up ------------------------------------------------------------------------------------------

    @classmethod
    def probe(cls, cgroup_root: str, hierarchies: Mapping[str, Hierarchy] | None = None) -> CgroupV1:
        """Find each controller, make the agent's subtree in it, and try a child with a limit set: what
        works is what will be enforced."""
        found = v1_hierarchies() if hierarchies is None else hierarchies
        subtrees: dict[str, str] = {}
        checks: list[ControllerCheck] = []
        for name in CONTROLLERS:
            hierarchy = found.get(name)
            if hierarchy is None:
                checks.append(ControllerCheck(name, False, "not mounted as cgroup v1"))
                continue
            subtree = hierarchy.subtree(cgroup_root)
            try:
                _make_subtree(name, subtree)
                _try_child(name, subtree)
            except OSError as exc:
                checks.append(ControllerCheck(name, False, f"{subtree}: {exc.strerror or exc}"))
                continue
            subtrees[name] = subtree
            checks.append(ControllerCheck(name, True, subtree))
        return cls(cgroup_root, subtrees, tuple(checks))

    # --- attempts -------------------------------------------------------------------------------------------

    def attempt_dirs(self, name: str) -> CgroupDirs | None:
        if not self.subtrees:
            return None
        return {controller: os.path.join(subtree, name) for controller, subtree in self.subtrees.items()}

    def create(self, name: str, limits: AttemptLimits) -> CgroupDirs | None:
        dirs = self.attempt_dirs(name)
        if dirs is None:
            return None
        made: list[str] = []
        try:
            for controller, directory in dirs.items():
                _make_fresh(directory, made)
                self._limit(controller, directory, limits)
        except OSError as exc:
            _remove_made(made)
            raise ContainmentError(f"cannot set up the attempt's cgroup {name}: {exc}") from None
        return dirs

    def create_child(self, dirs: CgroupDirs, name: str) -> CgroupDirs:
        child = {controller: os.path.join(directory, name) for controller, directory in dirs.items()}
        made: list[str] = []
        try:
            for controller, directory in child.items():
                _make_fresh(directory, made)
                if controller == CPUSET:
                    _copy_cpuset(os.path.dirname(directory), directory)
        except OSError as exc:
            _remove_made(made)
            raise ContainmentError(f"cannot make the child cgroup {name}: {exc}") from None
        return child

    def destroy(self, dirs: CgroupDirs) -> bool:
        # (Co-mounted controllers share a directory: the second rmdir of it finds it gone, which is fine.)
        with contextlib.suppress(OSError):
            cgroup_runtime.kill_all(dirs, timeout_s=30.0)
        return not cgroup_runtime.remove(dirs)

    def _limit(self, controller: str, directory: str, limits: AttemptLimits) -> None:
        if controller == MEMORY and limits.memory_bytes > 0:
            _write(os.path.join(directory, "memory.limit_in_bytes"), str(limits.memory_bytes))
            # Memory plus swap to the same figure: the limit holds, swap or not (where swap is accounted: a
            # property of the kernel's boot, so looked up once).
            memsw = os.path.join(directory, "memory.memsw.limit_in_bytes")
            if self._swap_accounted is None:
                self._swap_accounted = os.path.exists(memsw)
            if self._swap_accounted:
                _write(memsw, str(limits.memory_bytes))
        elif controller == CPUSET:
            parent = os.path.dirname(directory)
            host_cpus = parse_cpu_list(_read(os.path.join(parent, "cpuset.effective_cpus")))
            host_mems = parse_cpu_list(_read(os.path.join(parent, "cpuset.effective_mems")))
            cpus = set(limits.cpus) & host_cpus or host_cpus  # none of the chosen CPUs here: the agent's
            mems = self._numa_nodes_of(cpus) & host_mems or host_mems
            _write(os.path.join(directory, "cpuset.cpus"), format_cpu_list(cpus))
            _write(os.path.join(directory, "cpuset.mems"), format_cpu_list(mems))
        elif controller == DEVICES and limits.only_listed_devices:
            _write(os.path.join(directory, "devices.deny"), "a")
            _write(os.path.join(directory, "devices.allow"),
                   *devices.allowed_devices(limits.gpu_minors, self._gpu_driver_majors()))
        elif controller == DEVICES:
            # A new cgroup starts with its parent's list (the agent's subtree: normally every device); the
            # node's other GPUs are taken from it. Nothing is allowed here: a child cannot widen its parent's.
            if limits.other_gpu_minors:
                _write(os.path.join(directory, "devices.deny"), *devices.denied_gpus(limits.other_gpu_minors))
        elif controller == PIDS:
            _write(os.path.join(directory, "pids.max"), str(limits.pids_max))
        # (A new freezer cgroup is THAWED already; were the agent's subtree frozen, writing THAWED here would
        # not thaw it either.)


def remove_subtree(cgroup_root: str) -> None:
    """rmdir the agent's subtree and those of its parents (up to cgroup_root's first part) left empty: for
    garrison down. A directory still holding cgroups or processes is left alone."""
    depth = len([part for part in cgroup_root.split("/") if part])
    for hierarchy in v1_hierarchies().values():
        path = hierarchy.subtree(cgroup_root)
        for _ in range(depth):
            try:
                os.rmdir(path)
            except OSError:
                break
            path = os.path.dirname(path)


def _make_subtree(controller: str, subtree: str) -> None:
    """mkdir -p of the agent's subtree; each cpuset level without CPUs or memory nodes gets its parent's (a
    cpuset without them cannot hold a task: joining it fails with ENOSPC)."""
    missing: list[str] = []
    path = subtree
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory)
    if controller == CPUSET:
        _fill_cpuset_levels(subtree)


def _fill_cpuset_levels(subtree: str) -> None:
    """Give every level of ``subtree`` still without CPUs or memory nodes its parent's, from the top down.

    Every level, not only those this agent made: the agents of one local cluster start at once and share
    its levels, and one may find a level another has just made and not filled in yet. Copying that empty
    parent left a node's cgroup without memory nodes, and every job there failed to join it."""
    unfilled: list[str] = []
    path = subtree
    while os.path.dirname(path) != path and not all(
            _read(os.path.join(path, name)) for name in ("cpuset.cpus", "cpuset.mems")):
        unfilled.append(path)
        path = os.path.dirname(path)
    for directory in reversed(unfilled):
        parent = os.path.dirname(directory)
        for name in ("cpuset.cpus", "cpuset.mems"):
            if not _read(os.path.join(directory, name)):
                _write(os.path.join(directory, name), _read(os.path.join(parent, name)))


def _copy_cpuset(parent: str, child: str) -> None:
    for name in ("cpuset.cpus", "cpuset.mems"):
        _write(os.path.join(child, name), _read(os.path.join(parent, name)))


def _make_fresh(directory: str, made: list[str]) -> None:
    """A new cgroup, recorded in made; never one that exists already. Sharing one would mean killing
    another attempt's processes when this one ends: an empty one an agent crash left behind is removed when
    its (failed) attempt is acknowledged, and another agent's (two agents given one cgroup_root) is
    refused. Co-mounted controllers share a directory: made already holds it then."""
    if directory in made:
        return
    try:
        os.mkdir(directory)
    except FileExistsError:
        raise OSError(errno.EEXIST, f"{directory} exists already (an earlier agent's leftover, or another "
                                    "agent on this host with the same cgroup_root)") from None
    made.append(directory)


def _remove_made(made: list[str]) -> None:
    """Undo a half-made cgroup: only directories this call created (no process can be in them yet)."""
    for directory in reversed(made):
        with contextlib.suppress(OSError):
            os.rmdir(directory)


def _try_child(controller: str, subtree: str) -> None:
    """Make, limit and remove a probe child: proves the controller can be written here, not only read."""
    probe = os.path.join(subtree, f".probe-{os.getpid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(probe)
    try:
        if controller == MEMORY:
            _write(os.path.join(probe, "memory.limit_in_bytes"), str(1 << 30))
        elif controller == CPUSET:
            _copy_cpuset(subtree, probe)
        elif controller == DEVICES:
            _write(os.path.join(probe, "devices.deny"), "a")
        elif controller == PIDS:
            _write(os.path.join(probe, "pids.max"), "100")
        elif controller == FREEZER:
            _read(os.path.join(probe, "freezer.state"))
    finally:
        os.rmdir(probe)
