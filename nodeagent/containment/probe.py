"""Which containment this node gets, found at start-up, and what ``garrison-agent --check`` prints."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path

from garrison.nodeagent.containment.cgroup_v1 import CgroupV1, Hierarchy
from garrison.nodeagent.containment.interface import Capabilities, Containment, ControllerCheck
from garrison.nodeagent.containment.unconfined import Unconfined

CGROUP2_MOUNTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))


class NothingEnforceable(Exception):
    """No controller can be used here and the configuration does not allow unconfined jobs."""


def cgroup_v2_controllers() -> list[str]:
    """Controllers a cgroup2 mount here offers (empty: none, as on a v1 host's hybrid unified mount)."""
    for mount in CGROUP2_MOUNTS:
        with contextlib.suppress(OSError):
            names = (mount / "cgroup.controllers").read_text().split()
            if names:
                return names
    return []


def probe(cgroup_root: str, hierarchies: Mapping[str, Hierarchy] | None = None) -> Containment:
    """cgroup v1 where its controllers can be written; otherwise unconfined, saying why. hierarchies: the
    v1 mounts to consider (default: this host's)."""
    v1 = CgroupV1.probe(cgroup_root, hierarchies)
    if v1.capabilities.confined:
        return v1
    checks = list(v1.capabilities.checks)
    v2 = cgroup_v2_controllers()
    if v2:
        checks.append(ControllerCheck(
            "cgroup2", False,
            f"this host offers cgroup v2 ({','.join(v2)}); Garrison enforces cgroup v1 only so far (not implemented)",
        ))
    return Unconfined(tuple(checks))


def choose(
    cgroup_root: str, allow_unconfined: bool, hierarchies: Mapping[str, Hierarchy] | None = None
) -> Containment:
    """The containment to run jobs under. Raises NothingEnforceable where nothing can be enforced and
    unconfined jobs are not allowed."""
    containment = probe(cgroup_root, hierarchies)
    if not containment.capabilities.confined and not allow_unconfined:
        raise NothingEnforceable(
            "cannot contain jobs on this host (no usable cgroup controller: run garrison-agent --check); "
            "set [agent] allow_unconfined = true to run them unconfined"
        )
    return containment


def report(capabilities: Capabilities) -> list[str]:
    """--check's lines: the verdict, then one line per controller."""
    lines = [f"containment: {capabilities.summary()}"]
    for check in capabilities.checks:
        lines.append(f"  {check.name:<8} {'yes' if check.usable else 'no ':<3}  {check.detail}")
    return lines
