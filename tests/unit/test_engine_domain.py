"""The engine and the cluster state speak the domain: they import no protobuf, gRPC or wire conversion,
and a submission, a test-only estimate, a registration, a launch, a listing and a cancel all go through
them with controller/commands.py's values alone.

Run in a fresh interpreter (the test process itself has protobuf loaded by other tests), which then lists
every module it loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

WIRE_MODULES = ("google.protobuf", "grpc", "garrison.protos", "garrison.wire")

# The engine driven by hand, as the RPC layer drives it, on a real SQLite store. The agent link is the
# simplest AgentLink there is: it keeps what the engine hands it, as the real session would put it on the
# agent's stream.
SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys

    from garrison.config import ControllerConfig
    from garrison.controller.clock import ManualClock
    from garrison.controller.commands import (
        AttemptStarted, CancelCommand, JobFilter, Registration, StillAlive, SubmitCommand, Welcome,
    )
    from garrison.controller.engine import Engine
    from garrison.controller.state import ClusterState
    from garrison.controller.store import open_store
    from garrison.model.domain import (
        Allocation, Gpu, JobSpec, JobState, NodeAllocation, NodeInventory, Principal,
    )
    from garrison.model.launch import LaunchDescription

    class KeptLink:
        def __init__(self, node, address):
            self.node, self.address, self.sent, self.closed = node, address, [], False
        def send(self, instruction):
            self.sent.append(instruction)
        def close(self):
            self.closed = True

    async def main():
        config = ControllerConfig(database=sys.argv[1], state_dir=sys.argv[2])
        clock = ManualClock(1000.0)
        state = ClusterState(open_store(config.database), config.heartbeat_timeout_s)
        state.load(clock.now(), config.finished_job_retention_s)
        engine = Engine(config, state, clock)
        gpus = tuple(Gpu(i, f"GPU-{i}", "A100", 40960, f"0000:{i:02x}:00.0", 0, "0-1") for i in range(2))
        link = KeptLink("n1", "10.0.0.1")
        engine.agent_connected(link, Registration("n1", "10.0.0.1", NodeInventory("n1", gpus, (), (), cpus=4, memory_mb=4096)))
        alice = Principal("alice", 1000, 1000, (1000,))
        command = SubmitCommand(JobSpec(name="t", command=("true",), workdir="/", gpus_per_node=1))
        estimate = await engine.test_submit(alice, command)
        submitted = engine.submit(alice, command)
        job = state.jobs[submitted.job_id]
        # Started as a scheduling cycle would start it, on the node the estimate named.
        allocation = Allocation((NodeAllocation(estimate.nodes[0], (0,)),))
        engine.execute(state.start_attempts([(job.job_id, allocation)], clock.now()))
        engine.agent_message(link, AttemptStarted(job.job_id, 0))
        engine.agent_message(link, StillAlive())
        listed = engine.list_jobs(JobFilter(states=frozenset({JobState.RUNNING})))
        rows = engine.nodes_view()
        cancelled = engine.cancel(alice, CancelCommand(JobFilter(job_refs=(str(job.job_id),))))
        launch = next(i for i in link.sent if isinstance(i, LaunchDescription))
        print(json.dumps({
            "welcome": isinstance(link.sent[0], Welcome),
            "estimate_nodes": list(estimate.nodes),
            "submitted": [submitted.job_id, submitted.task_count],
            "launch": [launch.job_id, launch.node, launch.master_addr, launch.node_rank],
            "listed": [j.job_id for j in listed],
            "node_rows": [[r.node.name, r.connected, list(r.allocated_gpus)] for r in rows],
            "cancelled": list(cancelled.cancelled),
            "signals": [type(i).__name__ for i in link.sent[2:]],
            "wire_modules": sorted(m for m in sys.modules if m.startswith(WIRE)),
        }))
        await engine.stop()

    WIRE = tuple(json.loads(sys.argv[3]))
    asyncio.run(main())
    """
)


def test_the_engine_runs_a_job_with_no_protobuf_loaded(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-c", SCRIPT, f"sqlite:///{tmp_path / 'c.db'}", str(tmp_path), json.dumps(WIRE_MODULES)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert completed.returncode == 0, completed.stderr
    seen = json.loads(completed.stdout.strip().splitlines()[-1])
    assert seen["wire_modules"] == []
    assert seen["welcome"]
    assert seen["estimate_nodes"] == ["n1"]
    job_id = seen["submitted"][0]
    assert seen["submitted"] == [job_id, 1]
    assert seen["launch"] == [job_id, "n1", "10.0.0.1", 0]
    assert seen["listed"] == [job_id]
    assert seen["node_rows"] == [["n1", True, [0]]]
    assert seen["cancelled"] == [job_id]
    assert seen["signals"] == ["SignalAttempt"]  # the cancel's SIGTERM to the running attempt


def test_importing_the_engine_and_state_loads_no_wire_format() -> None:
    code = (
        "import json, sys; import garrison.controller.engine, garrison.controller.state, garrison.controller.commands; "
        f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({WIRE_MODULES!r}))))"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout) == []


def test_a_jobs_script_and_environment_are_shown_to_its_owner_and_admins_only(tmp_path: Path) -> None:
    import asyncio

    from garrison.config import ControllerConfig
    from garrison.controller.clock import ManualClock
    from garrison.controller.commands import SubmitCommand
    from garrison.controller.engine import Engine
    from garrison.controller.state import ClusterState
    from garrison.controller.store import open_store
    from garrison.model.domain import JobSpec, Principal

    async def scenario() -> None:
        config = ControllerConfig(database=f"sqlite:///{tmp_path / 'g.db'}", state_dir=str(tmp_path))
        clock = ManualClock(1000.0)
        state = ClusterState(open_store(config.database), config.heartbeat_timeout_s)
        state.load(clock.now(), config.finished_job_retention_s)
        engine = Engine(config, state, clock)
        alice, bob, root = Principal("alice", 1000, 1000), Principal("bob", 1001, 1001), Principal("root", 0, 0)
        spec = JobSpec(name="t", command=(), script="#!/bin/sh\nexport KEY=s3cret\n", workdir="/",
                       env={"WANDB_API_KEY": "k"})
        job_id = engine.submit(alice, SubmitCommand(spec)).job_id
        for viewer in (alice, root):
            seen = engine.job_for_viewer(viewer, str(job_id)).spec
            assert seen.script == spec.script and dict(seen.env) == {"WANDB_API_KEY": "k"}
        hidden = engine.job_for_viewer(bob, str(job_id)).spec
        assert hidden.script is None and dict(hidden.env) == {} and hidden.name == "t"
        assert state.jobs[job_id].spec.script == spec.script  # only the view is cut

    asyncio.run(scenario())
