#!/usr/bin/env python3
"""What cgroup v1 containment costs an attempt on this host. A script, not a test: prints `key: value`.

    python tests/benchmarks/containment.py [--attempts 200]

Creates (memory limit, cpuset, devices whitelist with two GPUs, pids limit, freezer, cpuacct) and destroys
attempt cgroups in a subtree of its own, and times a rank's join (six cgroup.procs writes) from a forked
child. Needs root and the v1 controllers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from garrison.nodeagent.containment.cgroup_v1 import CgroupV1, remove_subtree  # noqa: E402
from garrison.nodeagent.containment.interface import AttemptLimits  # noqa: E402
from garrison.nodeagent.supervisor import cgroup_runtime  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--attempts", type=int, default=200)
    args = parser.parse_args()
    root = f"garrison-bench-{uuid.uuid4().hex[:8]}"
    containment = CgroupV1.probe(root)
    if not containment.capabilities.confined:
        print(f"containment: {containment.capabilities.summary()} (needs root and cgroup v1)", file=sys.stderr)
        return 1
    limits = AttemptLimits(memory_bytes=1 << 30, cpus=(0,), gpu_minors=(0, 1), pids_max=100)
    create, join, destroy = [], [], []
    try:
        for number in range(args.attempts):
            started = time.perf_counter()
            dirs = containment.create(f"job_{number}_0", limits)
            create.append(time.perf_counter() - started)
            assert dirs is not None
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:
                began = time.perf_counter()
                cgroup_runtime.join(dirs)
                os.write(write_end, f"{time.perf_counter() - began}".encode())
                os._exit(0)
            os.close(write_end)
            join.append(float(os.read(read_end, 64)))
            os.close(read_end)
            os.waitpid(pid, 0)
            started = time.perf_counter()
            containment.destroy(dirs)
            destroy.append(time.perf_counter() - started)
    finally:
        remove_subtree(root)
    print(f"attempts: {args.attempts}")
    print(f"containment: {containment.capabilities.summary()}")
    for name, values in (("create", create), ("join", join), ("destroy", destroy)):
        print(f"cgroup_{name}_ms_p50: {statistics.median(values) * 1e3:.3f}")
        print(f"cgroup_{name}_ms_p99: {sorted(values)[int(0.99 * (len(values) - 1))] * 1e3:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
