#!/usr/bin/env python3
"""What a per-job supervisor costs, apart from the rest of the cluster (issue 23). A script, not a test: prints
`key: value` lines.

    python tests/benchmarks/supervisor_spawn.py [--jobs 300] [--argv /bin/true] [--cgroup-root garrison/bench]

Starts a fork server (nodeagent/supervisor/forkserver.py) as the agent does, spawns --jobs one-rank attempts
through it one after another as the agent's launch threads do (client.spawn), each running --argv, and waits
for each supervisor's notification. Prints CPU per job: the fork server's own, and its children's (the
supervisors, with the ranks they reaped: those reaped, and those kept idle for another attempt from their own
figures), and the same --argv run --jobs times by a plain parent
(``rank_alone``: what the job itself costs without any supervisor), so that the difference is the supervisor.
With --cgroup-root (root, cgroup v1), each attempt gets its cgroup with limits as the agent makes it
(nodeagent/containment/cgroup_v1.py, before the spawn, not counted), which the supervisor joins, empties and
removes: the supervisor's whole per-attempt work. Run it twice in one session to compare two versions; figures from different sessions do not compare.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from garrison.nodeagent.containment.cgroup_v1 import CgroupV1, remove_subtree
from garrison.nodeagent.containment.interface import AttemptLimits
from garrison.nodeagent.supervisor import client
from garrison.nodeagent.supervisor.forkserver import start_forkserver
from garrison.nodeagent.supervisor.spec import LaunchSpec, RankSpec


def children_cpu() -> float:
    times = os.times()
    return times.children_user + times.children_system


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--argv", default="/bin/true", help="the rank's command line (split on spaces)")
    parser.add_argument("--cgroup-root", default="",
                        help="cgroup v1 subtree for the attempts' cgroups (as the agent's cgroup_root); empty: none")
    args = parser.parse_args()
    argv = args.argv.split()
    containment = CgroupV1.probe(args.cgroup_root) if args.cgroup_root else None
    if containment is not None and not containment.subtrees:
        parser.error(f"no cgroup v1 controller is usable under {args.cgroup_root}")
    limits = AttemptLimits(memory_bytes=1 << 30, cpus=tuple(sorted(os.sched_getaffinity(0))), gpu_minors=(0,),
                           pids_max=1000)

    root = Path(tempfile.mkdtemp(prefix="gspawn-"))
    notify_path = root / "notify.sock"
    notifications = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notifications.bind(str(notify_path))
    notifications.settimeout(30)
    server = start_forkserver(root / "forkserver.sock")
    try:
        server_proc = psutil.Process(server.pid)
        before = server_proc.cpu_times()
        started = time.perf_counter()
        for job_id in range(1, args.jobs + 1):
            job_dir = root / f"job{job_id}"
            job_dir.mkdir()
            cgroup = None if containment is None else containment.create(f"bench_{os.getpid()}_{job_id}", limits)
            spec = LaunchSpec(
                job_id=job_id, attempt=0, uid=os.getuid(), gid=os.getgid(), groups=[], user="bench",
                ranks=[RankSpec(rank=0, argv=argv, env={"PATH": "/usr/bin:/bin"}, cwd=str(root),
                                stdout=os.devnull, stderr=os.devnull)],
                kill_wait_s=5.0, notify_socket=str(notify_path), cgroup=None if cgroup is None else dict(cgroup),
            )
            client.spawn(job_dir, spec, forkserver=root / "forkserver.sock")
            # One job at a time: the figure is per job, not a measure of how many run side by side.
            while json.loads(notifications.recv(4096))["job_id"] != job_id:
                pass
        wall = time.perf_counter() - started
        # The last supervisor may not be reaped yet: its notification comes just before it exits. A supervisor
        # kept for reuse does not exit: it is counted once it has let go of its attempt (supervisor.lock), with
        # the ranks it reaped, from its own figures.
        deadline = time.monotonic() + 10
        while client.is_alive(root / f"job{args.jobs}") and time.monotonic() < deadline:
            time.sleep(0.01)
        while time.monotonic() < deadline and any(child.status() != psutil.STATUS_SLEEPING
                                                  for child in server_proc.children()):
            time.sleep(0.01)
        after = server_proc.cpu_times()
        live = [child.cpu_times() for child in server_proc.children()]
        kept = sum(times.user + times.system + times.children_user + times.children_system for times in live)
    finally:
        server.terminate()
        server.wait()
        if containment is not None:
            remove_subtree(args.cgroup_root)  # the supervisors removed their attempts' cgroups
    supervised = (after.children_user + after.children_system - before.children_user - before.children_system) + kept
    own = after.user + after.system - before.user - before.system

    alone_before = children_cpu()
    for _ in range(args.jobs):
        subprocess.run(argv, stdout=subprocess.DEVNULL, check=False)
    alone = children_cpu() - alone_before

    per_job = 1000 / args.jobs
    print(f"jobs: {args.jobs}")
    print(f"rank_argv: {args.argv}")
    print(f"cgroups: {'yes' if containment is not None else 'no'}")
    print(f"wall_ms_per_job: {wall * per_job:.2f}")
    print(f"supervisors_kept: {len(live)}")
    print(f"forkserver_cpu_ms_per_job: {own * per_job:.2f}")
    print(f"supervisor_and_rank_cpu_ms_per_job: {supervised * per_job:.2f}")
    print(f"rank_alone_cpu_ms_per_job: {alone * per_job:.2f}")
    print(f"supervisor_cpu_ms_per_job: {(supervised - alone) * per_job:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
