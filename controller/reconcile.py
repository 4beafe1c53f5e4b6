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

from garrison.controller.instructions import EndSession, Instruction, Launch, SignalAttempt
from garrison.controller.ledger import AttemptLedger, LiveAttempt
from garrison.controller.lifecycle import JobLifecycle
from garrison.controller.store.errors import StoreUnavailable
from garrison.controller.store.interface import StoreChanges
from garrison.controller.transaction import atomic
from garrison.model.domain import JobState, Node, NodeInventory, NodeResult, NodeState

if TYPE_CHECKING:
    from garrison.controller.store import Store

log = logging.getLogger("garrison.controller.state")

# The reason of a node drained because its agent reported a fault (a drain of the controller's own, which it
# lifts when the fault is gone; an admin's drain has a reason of the admin's).
NODE_FAULT_REASON = "agent: "


class NodeReconciliation(JobLifecycle):
    """The nodes, their agents' connections, and what happens to jobs when nodes come and go."""

    def __init__(
        self, store: Store, ledger: AttemptLedger, heartbeat_timeout_s: float, fence_delay_s: float | None = None
    ) -> None:
        super().__init__(store, ledger)
        self.heartbeat_timeout_s = heartbeat_timeout_s
        # A silent node goes DOWN after heartbeat_timeout_s (no new work), but its attempts are released
        # (requeued) only after fence_delay_s (garrison/model/lease.py), when its supervisors have stopped
        # their ranks: a frozen or cut-off node never runs a job alongside its requeued copy. None: at once.
        self.fence_delay_s = max(fence_delay_s or 0.0, heartbeat_timeout_s)
        self.nodes = ledger.nodes
        self.connected = ledger.connected
        self.gpu_owner = ledger.gpu_owner
        self.node_partitions: dict[str, frozenset[str]] = {}
        self.silent_drained: set[str] = set()  # drained nodes that stopped responding (still drained)
        # Nodes whose row in the store is behind memory: an agent registered while the database was down
        # (registering must not depend on it). Written by flush_nodes as soon as it can be.
        self.unsaved_nodes: set[str] = set()
        # When this controller began to listen (load() sets it first; listening() moves it on). Silence counts
        # from here at the earliest: the nodes could not reach this controller before.
        self.started_at = 0.0

    def listening(self, now: float) -> None:
        """The controller listens from ``now``. Until then its port refused connections, and an agent that is
        refused extends its lease (nodeagent/lease.py): a node may have extended it a moment before this, so
        its silence, and with it the fence delay, is counted from here, not from when the controller began to
        load its state (which may take long: a large database, a slow one). Counted from the load, a node that
        fell silent as the controller began to listen had its attempts requeued while its ranks ran on under
        the lease it had just extended (tests/e2e/test_agent_faults.py; tests/benchmarks/chaos.py)."""
        self.started_at = max(self.started_at, now)

    # ---------------------------------------------------------------------------------------------
    # Node drain (gadmin): the caller has checked permissions.

    def _save_node(self, node: Node) -> None:
        """Change a node: in memory at once, in the store when the operation commits (or not at all)."""
        with self.atomically() as pending:
            self.scheduling_inputs_changed()
            pending.nodes[node.name] = node
            self.nodes[node.name] = node
            self.unsaved_nodes.discard(node.name)

    def flush_nodes(self) -> bool:
        """Write the node rows that are behind memory (see ``unsaved_nodes``); False while the store cannot."""
        if not self.unsaved_nodes:
            return True
        names = sorted(self.unsaved_nodes)
        try:
            self.store.write(StoreChanges(nodes=[self.nodes[n] for n in names if n in self.nodes]))
        except StoreUnavailable:
            return False
        self.unsaved_nodes.difference_update(names)
        return True

    @atomic
    def set_drain(self, name: str, drain: bool, reason: str) -> Node:
        """Drain a node (no new jobs; running ones go on) or resume it."""
        node = self.nodes[name]
        if drain:
            node = replace(node, state=NodeState.DRAIN, reason=reason)
        else:
            self.silent_drained.discard(name)
            up = name in self.connected
            node = replace(node, state=NodeState.UP if up else NodeState.DOWN, reason="" if up else "not responding")
        self._save_node(node)
        return node

    def node_fault(self, name: str, fault: str) -> Node | None:
        """What the node's agent says keeps it from running jobs (``fault``; "" for nothing): a node that is
        up is drained for it (no new jobs; an admin sees why), and a node this drained is resumed once its
        agent no longer says it. A drain an admin made is never lifted here. Returns the node when changed."""
        node = self.nodes.get(name)
        if node is None:
            return None
        ours = node.state == NodeState.DRAIN and node.reason.startswith(NODE_FAULT_REASON)
        if fault and node.state == NodeState.UP:
            log.warning("node %s drained: its agent reports: %s", name, fault)
            return self.set_drain(name, True, NODE_FAULT_REASON + fault)
        if fault and ours and node.reason != NODE_FAULT_REASON + fault:
            return self.set_drain(name, True, NODE_FAULT_REASON + fault)
        if not fault and ours:
            log.warning("node %s resumed: its agent no longer reports a fault (was: %s)", name,
                        node.reason.removeprefix(NODE_FAULT_REASON))
            return self.set_drain(name, False, "")
        return None

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
        self.attach_node(name, inventory, partitions, now)
        return self.reconcile_node(name, running, finished, now)

    def attach_node(self, name: str, inventory: NodeInventory, partitions: frozenset[str], now: float) -> None:
        """The first half of a registration: the node is UP (or still drained) and connected. Memory first, by
        design: an agent can register while the database is down, and its row is written as soon as the
        store takes it (``flush_nodes``). Nothing can start there before a write succeeds anyway."""
        old = self.nodes.get(name)
        state = NodeState.UP
        reason = ""
        if old is not None and old.state == NodeState.DRAIN:
            state, reason = old.state, old.reason
        node = Node(name=name, inventory=inventory, state=state, reason=reason, last_heartbeat=now)
        self.scheduling_inputs_changed()
        self.nodes[name] = node
        self.node_partitions[name] = partitions
        self.gpu_owner.setdefault(name, {})
        self.connected.add(name)
        self.silent_drained.discard(name)
        self.unsaved_nodes.add(name)
        self.flush_nodes()

    @atomic
    def reconcile_node(
        self, name: str, running: Sequence[tuple[int, int]], finished: Sequence[NodeResult], now: float
    ) -> list[Instruction]:
        """The second half of a registration: what the agent runs and what ended while it was away, against
        what we think. All or nothing; the engine retries it while the database is down."""
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
                    self.scheduling_inputs_changed()
                    self.ledger.own_leftover(job_id, attempt, allocation, name)
                instructions.append(SignalAttempt(name, job_id, attempt, "kill"))
                continue
            if name not in live.pending_nodes:
                instructions.append(SignalAttempt(name, job_id, attempt, "kill"))
                continue
            instructions += self.node_started(name, job_id, attempt)
            if (live.outcome is not None and live.terminate_at is None) or live.stale:
                # Being stopped (not within a preemption's grace, which the timer ends): stop it now.
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

    def heartbeat(self, name: str, now: float) -> bool:
        """A message from the node's current stream. True when the node had been given up for silent
        (expire_heartbeats) while that stream stayed open (an agent stalled for a while): it is alive, and
        must register again so that what it runs is reconciled with what moved on without it. (A heartbeat
        changes nothing a scheduling cycle reads, so it does not make one due.)"""
        node = self.nodes.get(name)
        if node is not None:
            self.nodes[name] = replace(node, last_heartbeat=now)
        return node is not None and name not in self.connected

    def disconnect(self, name: str) -> None:
        self.scheduling_inputs_changed()
        self.connected.discard(name)

    def _lose_node(self, live: LiveAttempt, name: str, reason: str, now: float) -> list[Instruction]:
        instructions: list[Instruction] = []
        self._live_changing(live)
        self.ledger.release_node(live, name)
        if not live.stale and live.outcome is None:
            job = self.jobs[live.job_id]
            outcome = JobState.PENDING if job.spec.requeue else JobState.NODE_FAIL
            # The other nodes' ranks are healthy: they get SIGTERM and the kill wait, as any stopped job does.
            instructions += self._stop(live, outcome, reason, now)
        if not live.pending_nodes:
            self._finish(live, now)
        return instructions + self.held_acks(live)

    def expire_heartbeats(self, now: float) -> list[Instruction]:
        """Nodes silent past the timeout go DOWN and their streams are closed; the attempts running there are
        requeued or failed once the node is also past the fence delay (its lease has run out and its
        supervisors have stopped the ranks). Each node is an operation of its own: while the database is
        down a node whose write fails stays as it was and is expired on the first tick that can write (no
        expiry is skipped)."""
        silent: list[str] = []
        for node in self.nodes.values():
            if node.state == NodeState.DOWN or node.name in self.silent_drained:
                continue
            if now - max(node.last_heartbeat, self.started_at) >= self.heartbeat_timeout_s:
                silent.append(node.name)
        instructions, deferred = self.each_atomically(
            silent, lambda name: self._declare_silent(self.nodes[name], now - max(self.nodes[name].last_heartbeat,
                                                                                    self.started_at))
        )
        fenced = sorted(
            node.name for node in self.nodes.values()
            if now - max(node.last_heartbeat, self.started_at) >= max(self.fence_delay_s, self.heartbeat_timeout_s)
            and node.name not in self.connected
        )
        lost, deferred_losses = self.each_atomically(fenced, lambda name: self._lose_fenced_node(name, now))
        instructions += lost
        if deferred or deferred_losses:
            log.debug("heartbeats: %d silent node(s) wait for the database", deferred + deferred_losses)
        return instructions

    def _lose_fenced_node(self, name: str, now: float) -> list[Instruction]:
        """The attempts still counting on a node whose lease has run out: requeued or failed."""
        instructions: list[Instruction] = []
        for live in list(self.live.values()):
            if name in live.pending_nodes:  # an earlier node's loss may have finished it
                instructions += self._lose_node(live, name, f"node {name} not responding", now)
        return instructions

    def _declare_silent(self, node: Node, silent_s: float) -> list[Instruction]:
        """The node missed its heartbeats: DOWN (a drained one stays drained), and its stream closed."""
        if node.state == NodeState.DRAIN:
            # An admin's drain outlives the node going silent (a reboot for maintenance): it comes back
            # drained, not UP. Its jobs are lost all the same.
            log.warning("drained node %s missed heartbeats for %.1fs", node.name, silent_s)
            self.silent_drained.add(node.name)
        else:
            log.warning("node %s missed heartbeats for %.1fs: DOWN (its jobs are requeued once its lease "
                        "has run out, %.1fs after it was last heard from)", node.name, silent_s,
                        self.fence_delay_s)
            self._save_node(replace(node, state=NodeState.DOWN, reason="not responding"))
        self.scheduling_inputs_changed()
        self.connected.discard(node.name)
        return [EndSession(node.name, "missed heartbeats")]
