"""What a stopped agent left running: kill the job supervisors and rank processes under its state dir.

Jobs outlive their agent on purpose (a restarted agent picks them up again), so stopping an agent does not
stop its jobs. Tearing a whole local cluster down (``garrison down``) must, and the CLI may not import the
agent, so it runs this module as a program::

    python -m garrison.nodeagent.leftovers AGENT_CONFIG...

For each agent configuration it kills every attempt's supervisor and whatever rank process groups a dead
supervisor left behind, then empties and removes the attempts' cgroups and the agent's cgroup subtree. Run it only once the agents are stopped: a live agent would report the killed
attempts as failed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from garrison.config import ConfigError, load_config
from garrison.nodeagent.containment.cgroup_v1 import remove_subtree
from garrison.nodeagent.jobs import JOBS_DIR, launch_cgroup
from garrison.nodeagent.supervisor import cgroup_runtime
from garrison.nodeagent.supervisor import client as supervisor


def kill_leftover_jobs(agent_state_dir: Path) -> int:
    """Kill every attempt still running under an agent's state dir; return how many job dirs were seen."""
    jobs_dir = agent_state_dir / JOBS_DIR
    if not jobs_dir.is_dir():
        return 0
    seen = 0
    for job_dir in jobs_dir.iterdir():
        if job_dir.is_dir():
            seen += 1
            supervisor.kill_now(job_dir)
            supervisor.kill_orphans(job_dir)
            cgroup = launch_cgroup(job_dir)
            if cgroup is not None:
                cgroup_runtime.kill_all(cgroup, timeout_s=10.0)
                cgroup_runtime.remove(cgroup)
    return seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m garrison.nodeagent.leftovers",
        description="Kill the jobs stopped agents left running (their supervisors and rank processes).",
    )
    parser.add_argument("configs", nargs="+", type=Path, metavar="AGENT_CONFIG", help="an agent's garrison.toml")
    args = parser.parse_args(argv)
    for config_path in args.configs:
        try:
            state_dir = Path(load_config(config_path).agent.state_dir)
        except ConfigError as exc:
            print(f"garrison.nodeagent.leftovers: {exc}", file=sys.stderr)
            return 2
        kill_leftover_jobs(state_dir)
        remove_subtree(load_config(config_path).agent.cgroup_root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
