"""Job steps in the controller: start a step in a running job, route its output to gsrun, end it.

A step lives in memory while it runs (``StepManager.running``) and in the store (``steps`` table) from its
start on, so ``gqueue -s`` and ``gacct`` show it. Its client (gsrun's stream, ``StepClient``) gets the
tasks' output as the agents send it, through a bounded queue: when gsrun reads too slowly the controller
drops output and tells gsrun how much (drop-with-notice), because it must never block the agents' links,
which carry every job's events. The agents themselves keep the output on disk until they have sent it,
so a slow link loses nothing.

The step ends when every node has reported its tasks' exit codes; the step's exit code is the highest of
them (128+N for a signal N), as srun's exit status. A step never outlives its job: ``check_jobs`` (from
the engine's timer) stops the steps of a job that is no longer running.

A controller restart does not end a step, as a slurmctld restart does not end srun's: the agents keep its
tasks running, the new controller waits for the step again (``recover``), and gsrun, whose stream broke,
takes it up on a new one (``attach``). What the old controller had acknowledged to the agents but gsrun never
got went down with it, so the agents are told to send each stream again from where gsrun has it
(``AckStepOutput(rewind=True)``), and the step's end waits for that output. A recovered step that no gsrun
takes up within ``ATTACH_GRACE_S`` is stopped, as srun's death stops its step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from garrison.controller.step_commands import (
    AckStep,
    AckStepOutput,
    LaunchStep,
    SignalStep,
    StepEvent,
    StepInstruction,
    StepNodeFinished,
    StepOutputReceived,
    StepStdin,
    StepTasksExited,
)
from garrison.model.domain import Job, JobState, Principal
from garrison.model.steps import (
    MAX_STEP_ARGV_BYTES,
    MAX_STEP_ENV_BYTES,
    RefusalKind,
    Step,
    StepLaunchDescription,
    StepRefused,
    StepRequest,
    StepState,
    place_step,
    step_exit_code,
)

log = logging.getLogger("garrison.controller.steps")

STEP_PORT_BASE = 40000  # job attempts rendezvous on 20000-39999 (engine.master_port); steps above
# How long a step recovered after a controller restart waits for its gsrun to take it up again. gsrun tries
# again every second or two (cli/gsrun.py), so it is back within seconds of the controller serving; one that
# is not is gone (killed with the old controller's host, or given up).
ATTACH_GRACE_S = 60.0
# How long a step whose gsrun's stream ended waits for gsrun to take it up again before it counts gsrun as dead
# (killed, its host gone) and stops the step. gsrun retries within 0.25-2 s; a link reset is back at once.
LOST_CLIENT_GRACE_S = 10.0
# After an attach, how long a node's result reported before it is held back for the node to report it again
# behind the output sent again (an agent older than rewinds never does: then the held result ends the step).
REWIND_WAIT_S = 10.0
STREAMS = (1, 2)  # stdout, stderr


def step_master_port(job_id: int, step_id: int) -> int:
    return STEP_PORT_BASE + (job_id * 7919 + step_id * 104729 + 1) % 20000


class StepClient(Protocol):
    """gsrun's end of a step (controller/rpc/steps_service.py): every method returns at once."""

    def output(self, task: int, stream: int, data: bytes, offset: int | None = None) -> None: ...

    def notice(self, text: str) -> None: ...

    def ended(self, step: Step, task_codes: tuple[int, ...]) -> None: ...

    def close(self) -> None:
        """End the stream without the step's end: another stream has taken the step up."""


class StepPermissionDenied(Exception):
    """The caller may not run or control steps of this job."""


class StepNotFound(Exception):
    """No such job or step (or the job is not running)."""


@dataclass(eq=False)
class RunningStep:
    step: Step
    request: StepRequest
    client: StepClient | None
    pending_nodes: set[str]
    exits: dict[int, int] = field(default_factory=dict)  # task -> exit code
    cancelled: bool = False
    killing: bool = False  # --kill-on-bad-exit fired
    errors: list[str] = field(default_factory=list)
    # (task, stream) -> the offset up to which its output has been received (and handed to the client). A
    # step recovered after a controller restart takes each stream's first offset as where it stands.
    received: dict[tuple[int, int], int] = field(default_factory=dict)
    recovered: bool = False
    # node -> its launch, sent again when the node's agent connects anew while the step waits for it: a launch
    # sent on a link that then broke may never have arrived (the agent ignores one it has).
    launches: dict[str, StepLaunchDescription] = field(default_factory=dict)
    # A recovered step no gsrun has taken up yet: stopped at this time (now() + ATTACH_GRACE_S at recovery).
    attach_by: float | None = None
    lost_reason: str = "its gsrun did not come back after the controller restarted"  # said when attach_by passes
    # node -> its result, reported while no gsrun was attached. The node reports it again after sending again
    # the output that gsrun still needs; an agent that does not (older than rewinds) has this one used.
    held_results: dict[str, StepNodeFinished] = field(default_factory=dict)
    # (task, stream) -> the offset the agents were told to send again from: output from further on is what
    # they sent before they read that, and comes again after it. Given up REWIND_WAIT_S after rewound_at.
    rewinding: dict[tuple[int, int], int] = field(default_factory=dict)
    rewound_at: float | None = None
    rewind_heard: set[str] = field(default_factory=set)  # nodes that have sent output again since the rewind
    reported_nodes: list[str] = field(default_factory=list)  # nodes whose result is in: acknowledged at the end

    @property
    def key(self) -> tuple[int, int]:
        return self.step.job_id, self.step.step_id

    @property
    def awaiting_client(self) -> bool:
        return self.client is None and self.attach_by is not None


class StepStore(Protocol):
    def save_step(self, step: Step) -> None: ...

    def last_step_id(self, job_id: int) -> int | None: ...

    def query_steps(self, job_ids: Sequence[int] = (), users: Sequence[str] = (), limit: int = 10000,
                    running_only: bool = False) -> list[Step]: ...


class StepManager:
    def __init__(
        self,
        store: StepStore,
        jobs: Callable[[], dict[int, Job]],
        send: Callable[[str, StepInstruction], bool],
        address_of: Callable[[str], str],
        now: Callable[[], float],
        kill_wait_s: float,
        is_admin: Callable[[Principal], bool],
        batch_rendezvous: Callable[[Job], tuple[str, int] | None] = lambda job: None,
    ) -> None:
        self.store = store
        # The MASTER_ADDR and MASTER_PORT the job's batch environment was given (None: not known here)
        self.batch_rendezvous = batch_rendezvous
        self.jobs = jobs
        self.send = send  # to a node's agent; False when it is not connected
        self.address_of = address_of
        self.now = now
        self.kill_wait_s = kill_wait_s
        self.is_admin = is_admin
        self.running: dict[tuple[int, int], RunningStep] = {}
        self._next_id: dict[int, int] = {}

    def recover(self) -> None:
        """After a controller restart: the steps the store says still run are waited for again, without a
        client (their gsrun's stream ended with the old controller). Their agents send their results again
        when they reconnect; a step whose job has ended is ended by ``check_jobs``."""
        attach_by = self.now() + ATTACH_GRACE_S
        for step in self.store.query_steps(running_only=True, limit=1_000_000):
            self.running[(step.job_id, step.step_id)] = RunningStep(
                step=step, request=StepRequest(argv=step.argv), client=None,
                pending_nodes=set(step.layout.node_names), recovered=True, attach_by=attach_by)

    # ---------------------------------------------------------------------------------------------
    # gsrun

    def _running_job(self, principal: Principal, job_id: int) -> Job:
        job = self.jobs().get(job_id)
        if job is None:
            raise StepNotFound(f"no such job {job_id}")
        if principal.uid != job.uid and not self.is_admin(principal):
            raise StepPermissionDenied(f"job {job.display_id} belongs to {job.user}; only its owner may run steps in it")
        if job.state != JobState.RUNNING or job.allocation is None:
            raise StepNotFound(f"job {job.display_id} is {job.state.value}, not RUNNING: steps run only in a running job")
        return job

    def _task_environment(self, job: Job, request: StepRequest) -> Mapping[str, str]:
        """The environment gsrun passed, as srun's tasks get it: with srun's own --ntasks-per-node (Lightning's
        SLURMEnvironment refuses more than one task without SLURM_NTASKS_PER_NODE), and without the
        MASTER_ADDR and MASTER_PORT that Garrison gave the batch script where they are still its values: srun
        sets neither, so the step's tasks meet at the step's own head node and port (plan_step_tasks); a value
        the script exported itself is kept."""
        env = dict(request.env)
        if request.ntasks_per_node is not None:
            env["SLURM_NTASKS_PER_NODE"] = str(request.ntasks_per_node)
        batch = self.batch_rendezvous(job)
        if batch is not None:
            for name, value in (("MASTER_ADDR", batch[0]), ("MASTER_PORT", str(batch[1]))):
                if env.get(name) == value:
                    del env[name]
        return env

    def busy(self, job_id: int) -> dict[str, tuple[frozenset[int], frozenset[int]]]:
        held: dict[str, tuple[set[int], set[int]]] = {}
        for running in self.running.values():
            if running.step.job_id != job_id:
                continue
            for node in running.step.layout.nodes:
                gpus, cpus = held.setdefault(node.node, (set(), set()))
                gpus.update(node.held_gpus)
                cpus.update(node.held_cpus)
        return {node: (frozenset(g), frozenset(c)) for node, (g, c) in held.items()}

    def _allocate_id(self, job_id: int) -> int:
        if job_id not in self._next_id:
            last = self.store.last_step_id(job_id)
            self._next_id[job_id] = 0 if last is None else last + 1
        step_id = self._next_id[job_id]
        self._next_id[job_id] = step_id + 1
        return step_id

    def start(self, principal: Principal, job_id: int, request: StepRequest, client: StepClient,
              umask: int | None = None) -> Step:
        """Place and start a step; StepRefused, StepNotFound or StepPermissionDenied say why not."""
        job = self._running_job(principal, job_id)
        check_request(request)
        assert job.allocation is not None
        layout = place_step(job.allocation, self.busy(job_id), request, job.display_id)
        step_id = self._allocate_id(job_id)
        step = Step(
            job_id=job_id, step_id=step_id, name=request.name or request.argv[0].rsplit("/", 1)[-1][:200],
            user=job.user, uid=job.uid, argv=request.argv, layout=layout, start_time=self.now(),
        )
        self.store.save_step(step)  # store first: a step the controller forgets would never show
        running = RunningStep(step=step, request=request, client=client, pending_nodes=set(layout.node_names))
        self.running[running.key] = running
        master = self.address_of(layout.nodes[0].node)
        env = self._task_environment(job, request)
        for index, node in enumerate(layout.nodes):
            description = StepLaunchDescription(
                job_id=job_id, step_id=step_id, user=job.user, uid=job.uid, gid=job.gid, argv=request.argv,
                env=env, cwd=request.cwd, layout=layout, node_index=index, master_addr=master,
                master_port=step_master_port(job_id, step_id), kill_wait_s=self.kill_wait_s,
                pty=request.pty, unbuffered=request.unbuffered, umask=umask if umask is not None else job.spec.umask,
            )
            running.launches[node.node] = description
            if not self.send(node.node, LaunchStep(description)):
                running.errors.append(f"node {node.node} is not connected")
                running.pending_nodes.discard(node.node)
                for task in node.tasks:
                    running.exits[task] = 1
        log.info("step %s started: %d tasks on %s", step.display_id, layout.ntasks, ",".join(layout.node_names))
        if not running.pending_nodes:
            self._finish(running)
        return step

    def node_connected(self, node: str) -> None:
        """A node's agent has a new link: the launches it may have missed go again (the steps still waiting
        for its result; a step recovered after a controller restart was launched by the old one, and its
        agent has it unless the node lost its disk), and so does a rewind it has not answered yet: gsrun may
        take its step up again before the node's agent is back with the restarted controller, and a rewind
        sent then went nowhere (the agent would only send again from the old controller's acknowledgement,
        past what gsrun has, and that output would be dropped as sent before the rewind)."""
        for running in self.running.values():
            if node not in running.pending_nodes:
                continue
            description = running.launches.get(node)
            if description is not None:
                self.send(node, LaunchStep(description))
            if running.rewinding and node not in running.rewind_heard:
                streams = tuple((task, stream, running.rewinding[(task, stream)])
                                for step_node in running.step.layout.nodes if step_node.node == node
                                for task in step_node.tasks for stream in STREAMS
                                if (task, stream) in running.rewinding)
                if streams and self.send(node, AckStepOutput(running.step.job_id, running.step.step_id, streams,
                                                             rewind=True)):
                    running.rewound_at = self.now()  # REWIND_WAIT_S counts from a rewind the agent can read

    def attach(self, principal: Principal, job_id: int, step_id: int, client: StepClient,
               have: dict[tuple[int, int], int] | None) -> Step:
        """gsrun takes up a step it started, on a new stream (its old one broke: a controller restart, a reset
        link). ``have``: how far gsrun has each stream's output (None: it cannot say, e.g. output came without
        offsets); the agents send again from there. Returns the step; one that has ended already comes back
        ended (its exit code is gsrun's), and nothing is sent to the client for it."""
        running = self.running.get((job_id, step_id))
        if running is not None:
            step = running.step
        else:
            stored = [s for s in self.store.query_steps([job_id], limit=1_000_000) if s.step_id == step_id]
            if not stored:
                raise StepNotFound(f"no such step {job_id}.{step_id}")
            step = stored[0]
        if step.uid != principal.uid and not self.is_admin(principal):
            raise StepPermissionDenied(f"step {step.display_id} belongs to {step.user}; only its owner may take it up")
        if running is None:
            return step
        if running.client is not None:
            # Its owner's gsrun attaches only after losing its stream, which this side has not noticed yet (a
            # TCP link that died silently): the new stream takes over, and the old one is closed.
            running.client.notice(f"step {running.step.display_id} was taken up on another stream")
            running.client.close()
        running.client = client
        running.attach_by = None
        log.info("step %s taken up again by its gsrun", running.step.display_id)
        if have is not None:
            self._rewind(running, have)
        else:
            self._use_held_results(running)  # nothing can be sent again: the results stand
        return running.step

    def _rewind(self, running: RunningStep, have: dict[tuple[int, int], int]) -> None:
        """Have every node send its tasks' output again from where gsrun has it (what the old controller
        acknowledged but gsrun never got), and report its result again behind it."""
        for node in running.step.layout.nodes:
            streams = tuple((task, stream, have.get((task, stream), 0)) for task in node.tasks for stream in STREAMS)
            for task, stream, offset in streams:
                running.received[(task, stream)] = offset
                running.rewinding[(task, stream)] = offset
            if node.node in running.pending_nodes:
                self.send(node.node, AckStepOutput(running.step.job_id, running.step.step_id, streams, rewind=True))
        running.recovered = False  # offsets are known from here on
        running.rewound_at = self.now()

    def _use_held_results(self, running: RunningStep) -> None:
        for node, result in list(running.held_results.items()):
            del running.held_results[node]
            if running.key in self.running:
                self._node_finished(node, running, result)

    def client_gone(self, job_id: int, step_id: int, client: StepClient | None = None) -> None:
        """gsrun's stream ended before the step did: gsrun was killed or its host is gone, or the link between
        them broke. gsrun takes the step up again if it can (``attach``); one that does not within
        ``LOST_CLIENT_GRACE_S`` is taken for dead and, as srun's death, the step is stopped. ``client``: the
        stream that ended, if a newer one may have taken its place."""
        running = self.running.get((job_id, step_id))
        if running is None or (client is not None and running.client is not client):
            return
        running.client = None
        running.attach_by = self.now() + LOST_CLIENT_GRACE_S
        running.lost_reason = "its gsrun went away"

    def cancel(self, principal: Principal, job_id: int, step_id: int, signal: int | None = None) -> None:
        """gcancel JOBID.STEP (with -s: signal the step's tasks only)."""
        job = self.jobs().get(job_id)
        if job is None:
            raise StepNotFound(f"no such job {job_id}")
        if principal.uid != job.uid and not self.is_admin(principal):
            raise StepPermissionDenied(f"job {job.display_id} belongs to {job.user}; only its owner may cancel its steps")
        running = self.running.get((job_id, step_id))
        if running is None:
            raise StepNotFound(f"step {job_id}.{step_id} is not running")
        if signal is not None:
            self.signal(job_id, step_id, signal)
            return
        log.info("%s cancelled step %s", principal.user, running.step.display_id)
        self._stop(running, "terminate", cancelled=True)

    def signal(self, job_id: int, step_id: int, signum: int) -> None:
        running = self.running.get((job_id, step_id))
        if running is not None:
            for node in running.pending_nodes:
                self.send(node, SignalStep(job_id, step_id, "signal", signum))

    def stdin(self, job_id: int, step_id: int, data: bytes = b"", window: tuple[int, int] | None = None) -> None:
        running = self.running.get((job_id, step_id))
        if running is not None and running.request.pty:
            self.send(running.step.layout.nodes[0].node, StepStdin(job_id, step_id, data, window))

    def _stop(self, running: RunningStep, action: str, *, cancelled: bool = False) -> None:
        running.cancelled = running.cancelled or cancelled
        for node in running.pending_nodes:
            self.send(node, SignalStep(running.step.job_id, running.step.step_id, action))

    # ---------------------------------------------------------------------------------------------
    # Agents

    def agent_event(self, node: str, event: StepEvent) -> None:
        key = (event.job_id, event.step_id)
        running = self.running.get(key)
        if isinstance(event, StepOutputReceived):
            if running is not None:
                self._output(node, running, event)
            return
        if isinstance(event, StepTasksExited):
            if running is not None:
                self._tasks_exited(running, event.exits)
            return
        # StepNodeFinished: recorded; acknowledged (so the agent forgets the step and its output) once the whole
        # step has ended, so that a controller restart before then finds every node still holding the output
        # its gsrun may not have got. A node reporting on a step already ended (by its job's end, say) is
        # acknowledged at once.
        if running is not None and node in running.pending_nodes:
            if running.awaiting_client:
                # The gsrun still to come may need the output: once it is back, the agent sends it again from
                # where gsrun has it, and then reports again (sent once per rewind).
                running.held_results[node] = event
                return
            running.held_results.pop(node, None)
            self._node_finished(node, running, event)
            return
        self.send(node, AckStep(event.job_id, event.step_id))

    def _node_finished(self, node: str, running: RunningStep, event: StepNodeFinished) -> None:
        self._tasks_exited(running, event.exits)
        if event.error:
            running.errors.append(f"{node}: {event.error}")
            if running.client is not None:
                running.client.notice(f"step {running.step.display_id} on {node}: {event.error}")
            for step_node in running.step.layout.nodes:
                if step_node.node == node:
                    for task in step_node.tasks:
                        running.exits.setdefault(task, 1)
        running.pending_nodes.discard(node)
        running.reported_nodes.append(node)
        if not running.pending_nodes:
            self._finish(running)

    def _output(self, node: str, running: RunningStep, event: StepOutputReceived) -> None:
        """Hand the output on once: an agent sends again, after a reconnect, what it sent since the last
        acknowledgement, and what is already here is dropped by its offset. Each piece is acknowledged, so
        that the agent's next resend starts there."""
        if running.awaiting_client:
            return  # not acknowledged: the agents send it again from where gsrun has it when it is back
        data = event.data
        start: int | None = None
        if event.offset is not None:
            stream = (event.task, event.stream)
            rewound_to = running.rewinding.get(stream)
            if rewound_to is not None:
                if event.offset > rewound_to:
                    return  # sent before the agent read the rewind: it comes again from rewound_to
                del running.rewinding[stream]
                running.rewind_heard.add(node)
            have = running.received.get(stream, None if running.recovered else 0)
            data, running.received[stream] = new_output(have, event.offset, event.data)
            start = running.received[stream] - len(data)
            if have is not None and event.offset > have:
                log.warning("step %s task %d: output from offset %d lost (%d bytes missing)",
                            running.step.display_id, event.task, have, event.offset - have)
            self.send(node, AckStepOutput(event.job_id, event.step_id,
                                          ((event.task, event.stream, running.received[stream]),)))
        if data and running.client is not None:
            running.client.output(event.task, event.stream, data, start)

    def _tasks_exited(self, running: RunningStep, exits: Iterable[tuple[int, int]]) -> None:
        for task, code in exits:
            running.exits[task] = code
            if code != 0 and running.request.kill_on_bad_exit and not running.killing:
                running.killing = True
                if running.client is not None:
                    running.client.notice(f"task {task} exited with exit code {code}: stopping the other tasks "
                                          "(--kill-on-bad-exit)")
                self._stop(running, "terminate")

    def _finish(self, running: RunningStep) -> None:
        self.running.pop(running.key, None)
        step = running.step
        for node in running.reported_nodes:
            self.send(node, AckStep(step.job_id, step.step_id))
        job = self.jobs().get(step.job_id)
        if not running.cancelled and (job is None or job.state != JobState.RUNNING):
            # The job's end reached the step's tasks first (the attempt's stop signals its whole cgroup, the
            # steps' included): the step was cancelled with its job, as scancel's are.
            running.cancelled = True
            running.errors.append("the job ended")
            if running.client is not None:
                running.client.notice(f"job {step.job_id} ended: stopping step {step.display_id}")
        codes = tuple(running.exits.get(task, 1) for node in step.layout.nodes for task in node.tasks)
        exit_code = step_exit_code(codes)
        if running.cancelled:
            state = StepState.CANCELLED
        else:
            state = StepState.COMPLETED if exit_code == 0 else StepState.FAILED
        ended = replace(step, state=state, exit_code=exit_code, end_time=self.now(),
                        reason="; ".join(running.errors)[:500])
        self.store.save_step(ended)
        log.info("step %s ended %s exit=%d", step.display_id, state.value, exit_code)
        if running.client is not None:
            running.client.ended(ended, codes)

    # ---------------------------------------------------------------------------------------------
    # The job's end

    def check_jobs(self) -> None:
        """Stop the steps of jobs that are no longer running (a step never outlives its job). Their nodes'
        results still end them; a node that is gone for good never answers, so its tasks count as killed
        once the job has ended."""
        jobs = self.jobs()
        now = self.now()
        for running in list(self.running.values()):
            if running.awaiting_client and running.attach_by is not None and now >= running.attach_by:
                log.info("step %s: %s: stopping it", running.step.display_id, running.lost_reason)
                running.attach_by = None
                running.errors.append(running.lost_reason)
                self._use_held_results(running)
                if running.key in self.running:
                    self._stop(running, "terminate", cancelled=True)
                continue
            if running.rewound_at is not None and now - running.rewound_at >= REWIND_WAIT_S:
                # An agent older than rewinds never sends again nor reports again: after a while, output past
                # the offsets is taken, and the results it gave stand.
                running.rewound_at = None
                running.rewinding.clear()
                for node in list(running.held_results):
                    if node not in running.rewind_heard:
                        self._node_finished(node, running, running.held_results.pop(node))
                if running.key not in self.running:
                    continue
            job = jobs.get(running.step.job_id)
            # COMPLETING: a preemption's (or cancel's) grace, in which the job's processes, its steps' tasks
            # among them, are warned and may checkpoint; the steps end with the attempt, as in Slurm.
            if job is not None and job.state in (JobState.RUNNING, JobState.COMPLETING):
                continue
            if not running.cancelled:
                if running.client is not None:
                    running.client.notice(f"job {running.step.job_id} ended: stopping step {running.step.display_id}")
                self._stop(running, "kill", cancelled=True)
                running.errors.append("the job ended")
            if job is None or job.state.is_terminal:
                for node in list(running.pending_nodes):
                    for step_node in running.step.layout.nodes:
                        if step_node.node == node:
                            for task in step_node.tasks:
                                running.exits.setdefault(task, 128 + 9)
                running.pending_nodes.clear()
                self._finish(running)


def new_output(have: int | None, offset: int, data: bytes) -> tuple[bytes, int]:
    """What of ``data`` (a stream's bytes from ``offset`` on) is new to a receiver that has the stream up to
    ``have`` (None: it does not know, and takes the bytes as they come), and how far it has the stream then.
    Bytes before ``have`` were received already (a resend after a reconnect): dropped. A gap (``offset`` past
    ``have``: bytes lost for good) cannot be filled; what comes after it still goes."""
    end = offset + len(data)
    if have is None or offset >= have:
        return data, end
    if end <= have:
        return b"", have
    return data[have - offset:], end


def check_request(request: StepRequest) -> None:
    """What the controller checks of a step request before placing it (it never trusts gsrun)."""
    if not request.argv or not request.argv[0]:
        raise StepRefused(RefusalKind.INVALID, "no command to run")
    if sum(len(a.encode(errors="replace")) + 1 for a in request.argv) > MAX_STEP_ARGV_BYTES:
        raise StepRefused(RefusalKind.INVALID, f"the command line exceeds {MAX_STEP_ARGV_BYTES} bytes")
    if any("\0" in a for a in request.argv):
        raise StepRefused(RefusalKind.INVALID, "the command line holds a NUL byte")
    env_bytes = sum(len(k.encode(errors="replace")) + len(v.encode(errors="replace")) + 2 for k, v in request.env.items())
    if env_bytes > MAX_STEP_ENV_BYTES:
        raise StepRefused(RefusalKind.INVALID, f"the environment exceeds {MAX_STEP_ENV_BYTES} bytes")
    for key, value in request.env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise StepRefused(RefusalKind.INVALID, f"invalid environment variable name {key[:60]!r}")
    if not request.cwd.startswith("/") or "\0" in request.cwd:
        raise StepRefused(RefusalKind.INVALID, f"the working directory must be an absolute path, not {request.cwd[:200]!r}")
    if request.gpu_bind.value == "single" and (len(request.gpu_bind_arg) != 1 or request.gpu_bind_arg[0] < 1):
        raise StepRefused(RefusalKind.INVALID, "--gpu-bind=single:N needs one number N of at least 1")
    if request.gpu_bind.value == "map_gpu" and not request.gpu_bind_arg:
        raise StepRefused(RefusalKind.INVALID, "--gpu-bind=map_gpu: needs a list of GPU ids")
    if request.cpu_bind.value == "map_cpu" and not request.cpu_bind_arg:
        raise StepRefused(RefusalKind.INVALID, "--cpu-bind=map_cpu: needs a list of CPU ids")
    if len(request.nodelist) > MAX_STEP_NODES or len(request.name) > 200:
        raise StepRefused(RefusalKind.INVALID, "too many -w nodes or too long a step name")


MAX_STEP_NODES = 1024
