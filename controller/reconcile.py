"""Node reconciliation: agents registering and reconnecting, heartbeats, lost nodes, drains.

When an agent (re)connects it reports what it runs and what ended while it was away; this module
reconciles that with what the controller thinks (relaunch a launch that never arrived, kill ranks of
attempts the job has left behind, lose attempts whose ranks vanished), and turns silent nodes DOWN. The
job consequences go through the job lifecycle (controller/lifecycle.py).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from garrison.controller.instructions import Instruction, Launch, SignalAttempt
from garrison.controller.ledger import AttemptLedger, LiveAttempt
from garrison.controller.lifecycle import JobLifecycle
from garrison.model.domain import JobState, Node, NodeInventory, NodeResult, NodeState

if TYPE_CHECKING:
    from garrison.controller.store import Store

log = logging.getLogger("garrison.controller.state")


class NodeReconciliation(JobLifecycle):
    """The nodes, their agents' connections, and what happens to jobs when nodes come and go."""

    def __init__(self, store: Store, ledger: AttemptLedger, heartbeat_timeout_s: float) -> None:
        super().__init__(store, ledger)
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.nodes = ledger.nodes
        self.connected = ledger.connected
        self.gpu_owner = ledger.gpu_owner
        self.node_partitions: dict[str, frozenset[str]] = {}
        self.silent_drained: set[str] = set()  # drained nodes that stopped responding (still drained)
        self.started_at = 0.0

    # ---------------------------------------------------------------------------------------------
    # Node drain (gadmin): the caller has checked permissions.

    def set_drain(self, name: str, drain: bool, reason: str) -> Node:
        """Drain a node (no new jobs; running ones go on) or resume it."""
        node = self.nodes[name]
        if drain:
            node = replace(node, state=NodeState.DRAIN, reason=reason)
        else:
            self.silent_drained.discard(name)
            up = name in self.connected
            node = replace(node, state=NodeState.UP if up else NodeState.DOWN, reason="" if up else "not responding")
        self.store.save_node(node)
        self.nodes[name] = node
        return node

    # ---------------------------------------------------------------------------------------------
    # Agents

    def register_node(
        self,
        name: str,
        inventory: NodeInventory,
        partitions: frozenset[str],
        running: Sequence[tuple[int, int]],
        finished: Sequence[NodeResult],
        now: float,
    ) -> list[Instruction]:
        """An agent (re)connected: record its inventory, then reconcile what it runs with what we think."""
        old = self.nodes.get(name)
        state = NodeState.UP
        reason = ""
        if old is not None and old.state == NodeState.DRAIN:
            state, reason = old.state, old.reason
        node = Node(name=name, inventory=inventory, state=state, reason=reason, last_heartbeat=now)
        self.store.save_node(node)
        self.nodes[name] = node
        self.node_partitions[name] = partitions
        self.gpu_owner.setdefault(name, {})
        self.connected.add(name)
        self.silent_drained.discard(name)

        instructions: list[Instruction] = []
        for result in finished:
            instructions += self.node_finished(name, result, now)
        reported_running = set(running)
        for job_id, attempt in sorted(reported_running):
            live = self.live.get((job_id, attempt))
            if live is None:
                # Ranks of an attempt the job has left behind (this node was declared down and the job
                # moved on): kill them, and keep their GPUs busy until the agent reports them ended.
                job = self.jobs.get(job_id)
                allocation = None
                if job is not None and attempt < len(job.attempts):
                    allocation = job.attempts[attempt].allocation
                if allocation is not None and name in allocation.node_names:
                    self.ledger.own_leftover(job_id, attempt, allocation, name)
                instructions.append(SignalAttempt(name, job_id, attempt, "kill"))
                continue
            if name not in live.pending_nodes:
                instructions.append(SignalAttempt(name, job_id, attempt, "kill"))
                continue
            instructions += self.node_started(name, job_id, attempt)
            if live.outcome is not None or live.stale:
                instructions.append(SignalAttempt(name, job_id, attempt, "terminate"))
        finished_keys = {(r.job_id, r.attempt) for r in finished}
        for live in list(self.live.values()):
            key = (live.job_id, live.attempt)
            if name not in live.pending_nodes or key in reported_running or key in finished_keys:
                continue
            job = self.jobs[live.job_id]
            if live.stale or live.outcome is not None:
                # It was being stopped and the agent no longer has it: it has ended.
                instructions += self.node_finished(name, NodeResult(live.job_id, live.attempt, (), "lost"), now)
            elif name not in live.started_nodes and job.state == JobState.CONFIGURING:
                # The launch may never have reached the agent (controller crash): launches are idempotent.
                instructions.append(Launch(name, job, live.attempt))
            else:
                # The agent lost the ranks (its node rebooted): the attempt cannot go on.
                instructions += self._lose_node(live, name, "ranks lost on node " + name, now)
        return instructions

    def heartbeat(self, name: str, now: float) -> None:
        node = self.nodes.get(name)
        if node is not None:
            self.nodes[name] = replace(node, last_heartbeat=now)

    def disconnect(self, name: str) -> None:
        self.connected.discard(name)

    def _lose_node(self, live: LiveAttempt, name: str, reason: str, now: float) -> list[Instruction]:
        instructions: list[Instruction] = []
        self.ledger.release_node(live, name)
        if not live.stale and live.outcome is None:
            job = self.jobs[live.job_id]
            outcome = JobState.PENDING if job.spec.requeue else JobState.NODE_FAIL
            instructions += self._stop(live, outcome, reason, now, kill=True)
        if not live.pending_nodes:
            self._finish(live, now)
        return instructions

    def expire_heartbeats(self, now: float) -> list[Instruction]:
        """Nodes silent past the timeout go DOWN; the attempts running there are requeued or failed."""
        instructions: list[Instruction] = []
        for node in list(self.nodes.values()):
            if node.state == NodeState.DOWN or node.name in self.silent_drained:
                continue
            last = max(node.last_heartbeat, self.started_at)
            if now - last < self.heartbeat_timeout_s:
                continue
            if node.state == NodeState.DRAIN:
                # An admin's drain outlives the node going silent (a reboot for maintenance): it comes back
                # drained, not UP. Its jobs are lost all the same.
                log.warning("drained node %s missed heartbeats for %.1fs", node.name, now - last)
                self.silent_drained.add(node.name)
            else:
                log.warning("node %s missed heartbeats for %.1fs: DOWN", node.name, now - last)
                down = replace(node, state=NodeState.DOWN, reason="not responding")
                self.store.save_node(down)
                self.nodes[node.name] = down
            self.connected.discard(node.name)
            for live in list(self.live.values()):
                if node.name in live.pending_nodes:
                    instructions += self._lose_node(live, node.name, f"node {node.name} not responding", now)
        return instructions
