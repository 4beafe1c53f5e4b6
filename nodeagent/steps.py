"""The agent's job steps on this node: start a step's tasks, stream their output, report their exits.

Each step on this node has a directory ``STATE_DIR/steps/<job>.<step>/`` and its own detached supervisor
(nodeagent/supervisor/, as a job attempt has), so the tasks run as the job's user in their own process
groups, and survive an agent restart like attempts do. The tasks write stdout and stderr to files in the
directory's ``io/`` (out-TASK, err-TASK); the agent reads them from where it last stopped and sends the
bytes on its link to the controller, each piece with its offset in its file. The disk is the buffer: a task
never blocks on a slow link, the agent's memory holds at most one chunk per file, and what was not sent yet
is still there after an agent restart. A --pty step's task 0 is nodeagent/steps_pty.py, which runs the
command on a pseudo-terminal; the bytes typed at gsrun come to it through a FIFO in ``io/``.

Exactly once: output queued on a link that then breaks (the controller restarts, the stream is reset, the
agent is killed) may never have arrived. The controller acknowledges output by offset; the agent keeps the
acknowledged offsets (``sent.json``) and, on every new link, reads again from them. What arrives twice is
dropped by the controller, which knows how far it has each stream (controller/steps.py, ``new_output``).

The step ends on this node when every task has ended and its output is all sent; the controller's
acknowledgement of that result lets the agent remove the directory.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import struct
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from garrison.model.steps import StepLaunchDescription
from garrison.nodeagent.jobfiles import remove_tree
from garrison.nodeagent.jobs import _check_same_identity, _groups_of, _usable_cpus, node_defaults
from garrison.nodeagent.launch.env import plan_step_tasks
from garrison.nodeagent.supervisor import client as supervisor
from garrison.nodeagent.supervisor.spec import LaunchSpec, RankSpec
from garrison.protos.v1 import garrison_pb2 as pb

log = logging.getLogger("garrison.agent.steps")

STEPS_DIR = "steps"
IO_DIR = "io"
SENT_FILE = "sent.json"
PTY_INPUT = "pty.in"
CHUNK_BYTES = 64 << 10
MAX_BYTES_PER_TICK = 1 << 20  # per step: the link carries every job's events too
MAX_OUTBOX = 256  # messages waiting on the link beyond which no more output is read this tick (16 MiB)
PTY_RELAY = str(Path(__file__).resolve().with_name("steps_pty.py"))
FRAME = struct.Struct("!cI")
OUTPUT_PREFIXES = {1: "out", 2: "err"}  # stream -> its files' prefix in io/


@dataclass
class LocalStep:
    job_id: int
    step_id: int
    directory: Path
    tasks: tuple[int, ...]
    pty: bool
    sent: dict[str, int] = field(default_factory=dict)  # output file name -> bytes read and queued on the link
    acked: dict[str, int] = field(default_factory=dict)  # output file name -> bytes the controller has (sent.json)
    acked_changed: bool = False
    unbuffered: bool = False  # -u: output goes as it is written, not held back to whole lines
    reported: set[int] = field(default_factory=set)  # tasks whose exit was sent
    finished_sent: bool = False
    result: pb.StepNodeResult | None = None  # the last one sent
    pty_fd: int | None = None
    pty_pending: bytes = b""

    @property
    def key(self) -> tuple[int, int]:
        return self.job_id, self.step_id


class StepRunner:
    def __init__(self, state_dir: Path, allow_root_jobs: bool, send: Callable[[pb.AgentMessage], None],
                 outbox_size: Callable[[], int], forkserver: Callable[[], Path | None],
                 step_cgroup: Callable[[int, int], dict[str, str] | None] = lambda job_id, step_id: None,
                 slurm_path: str | None = None, controller: str = "",
                 visible_gpus: Callable[[int], tuple[int, ...] | None] = lambda job_id: None,
                 tmp_dir: Callable[[int], str | None] = lambda job_id: None) -> None:
        self.slurm_path = slurm_path  # Slurm's command names, first on every task's PATH (garrison.slurmpath)
        self.controller = controller  # its address, for the commands in tasks that lack it (node_defaults)
        self.steps_dir = state_dir / STEPS_DIR
        self.steps_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.steps_dir, 0o711)
        self.allow_root_jobs = allow_root_jobs
        self.send = send
        self.outbox_size = outbox_size
        self.forkserver = forkserver
        self.revive_forkserver: Callable[[], bool] | None = None  # the agent's: a fork server that died again
        self.step_cgroup = step_cgroup  # the step's cgroup, a child of its job's attempt's (nodeagent/jobs.py)
        self.visible_gpus = visible_gpus  # the GPUs its job's devices cgroup lets it open here (jobs.py)
        self.tmp_dir = tmp_dir  # its job's attempt's scratch directory here (SLURM_TMPDIR; jobs.py)
        self.local: dict[tuple[int, int], LocalStep] = {}
        self.acks = True  # the controller acknowledges output (RegisterAck.step_output_acks); told at each link
        # The last results the controller acknowledged (the steps forgotten since), newest last: a restarted
        # controller still waiting for a step (its other nodes had not ended) asks again, by a rewind or a
        # signal, and gets the result rather than "not running here", which would fail the step.
        self.forgotten: dict[tuple[int, int], pb.StepNodeResult] = {}

    def step_dir(self, job_id: int, step_id: int) -> Path:
        return self.steps_dir / f"{job_id}.{step_id}"

    # ---------------------------------------------------------------------------------------------
    # What the controller says

    def handle(self, message: pb.ControllerMessage) -> None:
        kind = message.WhichOneof("kind")
        if kind == "launch_step":
            self._launch(message.launch_step)
        elif kind == "signal_step":
            self._signal(message.signal_step)
        elif kind == "step_input":
            self._input(message.step_input)
        elif kind == "step_ack":
            self._forget(message.step_ack.job_id, message.step_ack.step_id)
        elif kind == "step_output_ack":
            self._output_acked(message.step_output_ack)

    def _launch(self, message: pb.StepLaunch) -> None:
        from garrison.wire.convert_steps import step_launch_from_pb

        key = (message.job_id, message.step_id)
        if key in self.local:
            return  # a resent launch
        try:
            description = step_launch_from_pb(message)
            self.start(description)
        except Exception as exc:  # the step fails on this node; the agent and other steps go on
            log.warning("step %d.%d did not start: %s", key[0], key[1], exc)
            self.send(pb.AgentMessage(step_result=pb.StepNodeResult(
                job_id=key[0], step_id=key[1], error=f"step launch failed: {exc}"[:500],
                exits=[pb.StepTaskExit(task=t, exit_code=1) for n in message.nodes[message.node_index:][:1]
                       for t in n.tasks])))

    def start(self, step: StepLaunchDescription) -> None:
        directory = self.step_dir(step.job_id, step.step_id)
        if directory.exists():
            self._track(directory)
            return
        if step.uid == 0 and not self.allow_root_jobs:
            raise PermissionError("root jobs are not allowed on this node")
        if step.uid != os.getuid():
            _check_same_identity(step.user, step.uid)
        staging = directory.with_name(directory.name + ".new")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(mode=0o711)
        io_dir = staging / IO_DIR
        io_dir.mkdir(mode=0o700)
        if os.getuid() == 0 and step.uid != 0:
            os.chown(io_dir, step.uid, step.gid)
        final_io = str(directory / IO_DIR)
        plans = plan_step_tasks(step, final_io, self.slurm_path, defaults=node_defaults(step.user, self.controller),
                                visible_gpus=self.visible_gpus(step.job_id), tmp_dir=self.tmp_dir(step.job_id))
        here = step.here
        ranks = []
        for local, plan in enumerate(plans):
            argv = list(plan.argv)
            if step.pty and plan.rank == 0:
                os.mkfifo(io_dir / PTY_INPUT, 0o600)
                if os.getuid() == 0 and step.uid != 0:
                    os.chown(io_dir / PTY_INPUT, step.uid, step.gid)
                argv = [sys.executable, "-I", "-S", PTY_RELAY, os.path.join(final_io, PTY_INPUT), "--", *argv]
            cpus = list(here.task_cpus[local]) if here.task_cpus and here.task_cpus[local] else None
            ranks.append(RankSpec(rank=plan.rank, argv=argv, env=dict(plan.env), cwd=plan.cwd, stdout=plan.stdout,
                                  stderr=plan.stderr, cpus=cpus))
        # Its tasks join it before exec, as the attempt's ranks join theirs; its supervisor empties and removes it.
        cgroup = self.step_cgroup(step.job_id, step.step_id)
        spec = LaunchSpec(
            job_id=step.job_id, attempt=step.step_id, cgroup=cgroup, uid=step.uid, gid=step.gid,
            groups=_groups_of(step.user, step.gid) if step.uid != os.getuid() else [],
            user=step.user, ranks=ranks, kill_wait_s=step.kill_wait_s, notify_socket=None, umask=step.umask,
            cpus=_usable_cpus(tuple(sorted({c for cpus in here.task_cpus for c in cpus}))) if not any(
                r.cpus for r in ranks) else None,
        )
        (staging / "tasks.json").write_text(json.dumps({"tasks": list(here.tasks), "pty": step.pty,
                                                         "unbuffered": step.unbuffered}))
        staging.rename(directory)
        supervisor.spawn(directory, spec, forkserver=self.forkserver(), revive=self.revive_forkserver)
        self._track(directory)
        log.info("step %d.%d started: tasks %s", step.job_id, step.step_id, ",".join(map(str, here.tasks)))

    def _track(self, directory: Path) -> LocalStep | None:
        head, _, tail = directory.name.partition(".")
        if not (head.isdigit() and tail.isdigit()):
            return None
        key = (int(head), int(tail))
        if key in self.local:
            return self.local[key]
        try:
            info = json.loads((directory / "tasks.json").read_text())
            tasks = tuple(int(t) for t in info["tasks"])
            pty = bool(info.get("pty"))
            unbuffered = bool(info.get("unbuffered"))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        try:
            sent = {str(k): int(v) for k, v in json.loads((directory / SENT_FILE).read_text()).items()}
        except (OSError, ValueError, AttributeError):
            sent = {}
        step = LocalStep(job_id=key[0], step_id=key[1], directory=directory, tasks=tasks, pty=pty, sent=dict(sent),
                         acked=sent, unbuffered=unbuffered)
        self.local[key] = step
        return step

    def scan(self) -> None:
        """After an agent restart: every step directory left is a step still running or unreported."""
        for entry in sorted(self.steps_dir.iterdir()):
            if entry.is_dir() and not entry.name.endswith(".new"):
                self._track(entry)

    def reconnected(self) -> None:
        """A new link: what was sent on the old one and not acknowledged may be lost (queued in our outbox or
        in flight when it broke), so it goes again, from the acknowledged offsets; and so do the tasks'
        exits (--kill-on-bad-exit acts on them; the controller takes one twice as once) and the results."""
        for step in self.local.values():
            step.sent = dict(step.acked)
            step.reported.clear()
            step.finished_sent = False

    def controller_acks(self, acks: bool) -> None:
        """Whether this link's controller acknowledges output. One that does not (older than offsets) would
        never move the acknowledged offsets: output counts as had once it is queued, as it did before."""
        self.acks = acks
        if not acks:
            for step in self.local.values():
                self._count_as_acked(step)

    def _count_as_acked(self, step: LocalStep) -> None:
        if step.acked != step.sent:
            step.acked = dict(step.sent)
            step.acked_changed = True

    def _output_acked(self, message: pb.StepOutputAck) -> None:
        step = self.local.get((message.job_id, message.step_id))
        if step is None:
            if message.rewind:  # a restarted controller takes the step up again: it has ended here
                self._not_here(message.job_id, message.step_id)
            return
        if message.rewind:
            # A restarted controller whose gsrun took the step up again has the output only up to these
            # offsets (what the old one acknowledged, gsrun never got): send again from them, and the tasks'
            # exits and the result again behind that output, as after a new link.
            for acked in message.streams:
                name = f"{OUTPUT_PREFIXES.get(acked.stream, '?')}-{acked.task}"
                if acked.offset < step.acked.get(name, 0):
                    step.acked[name] = acked.offset
                    step.acked_changed = True
                if acked.offset < step.sent.get(name, 0):
                    step.sent[name] = acked.offset
            step.reported.clear()
            step.finished_sent = False
            return
        for acked in message.streams:
            name = f"{OUTPUT_PREFIXES.get(acked.stream, '?')}-{acked.task}"
            if acked.offset > step.acked.get(name, 0):
                step.acked[name] = acked.offset
                step.acked_changed = True

    def _signal(self, message: pb.StepSignal) -> None:
        step = self.local.get((message.job_id, message.step_id))
        if step is None:
            self._not_here(message.job_id, message.step_id)  # so that the controller does not wait for us
            return
        self._deliver(step, message.action, message.signal)

    def _deliver(self, step: LocalStep, action: int, signum: int) -> None:
        if action == pb.SignalJob.TERMINATE:
            supervisor.terminate(step.directory)
        elif action == pb.SignalJob.KILL:
            supervisor.kill_now(step.directory)
        elif signum:
            try:
                supervisor.send(step.directory, signum)
            except ValueError:
                log.warning("step %d.%d: no signal %d", step.job_id, step.step_id, signum)

    def signal_job(self, job_id: int, signum: int, batch_only: int = 0) -> None:
        """A signal for the whole job reaches its steps' tasks here, unless it is the job's batch-only one."""
        if signum == batch_only:
            return
        for step in self.local.values():
            if step.job_id == job_id and not step.finished_sent:
                self._deliver(step, pb.SignalJob.SIGNAL, signum)

    def kill_job(self, job_id: int) -> None:
        """The job's attempt ended on this node: a step never outlives its job."""
        for step in self.local.values():
            if step.job_id == job_id:
                supervisor.kill_now(step.directory)

    def _input(self, message: pb.StepInput) -> None:
        step = self.local.get((message.job_id, message.step_id))
        if step is None or not step.pty:
            return
        if message.data:
            step.pty_pending += FRAME.pack(b"d", len(message.data)) + message.data
        if message.HasField("window"):
            body = struct.pack("!HH", message.window.rows, message.window.cols)
            step.pty_pending += FRAME.pack(b"w", len(body)) + body
        self._flush_input(step)

    def _flush_input(self, step: LocalStep) -> None:
        if not step.pty_pending:
            return
        if step.pty_fd is None:
            try:
                # Non-blocking: ENXIO until the relay has opened its end. io/ is the job user's: a link
                # there must not make the agent write the user's bytes anywhere else.
                fd = os.open(step.directory / IO_DIR / PTY_INPUT, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
            except OSError:
                return
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.close(fd)
                log.warning("step %d.%d: %s is not a FIFO; input dropped", step.job_id, step.step_id, PTY_INPUT)
                step.pty_pending = b""
                return
            step.pty_fd = fd
        try:
            written = os.write(step.pty_fd, step.pty_pending)
            step.pty_pending = step.pty_pending[written:]
        except BlockingIOError:
            pass
        except OSError:
            os.close(step.pty_fd)
            step.pty_fd = None

    def _forget(self, job_id: int, step_id: int) -> None:
        step = self.local.pop((job_id, step_id), None)
        if step is not None and step.result is not None:
            self.forgotten[(job_id, step_id)] = step.result
            while len(self.forgotten) > MAX_FORGOTTEN_RESULTS:
                del self.forgotten[next(iter(self.forgotten))]
        if step is not None and step.pty_fd is not None:
            os.close(step.pty_fd)
        remove_tree(self.step_dir(job_id, step_id))

    # ---------------------------------------------------------------------------------------------
    # Output and exits, every tick

    def tick(self) -> None:
        for step in list(self.local.values()):
            try:
                self._poll(step)
            except Exception:
                log.exception("step %d.%d: polling failed", step.job_id, step.step_id)

    def _poll(self, step: LocalStep) -> None:
        self.save_acked(step)
        if step.finished_sent:
            return
        self._flush_input(step)
        status = supervisor.read_status(step.directory)
        finished = status is not None and status.state == "finished"
        if status is None and not supervisor.is_alive(step.directory):
            status = supervisor.read_status(step.directory)
            finished = status is not None and status.state == "finished"
            if status is None:
                self._send_result(step, {t: 1 for t in step.tasks}, "the step's supervisor died before it started")
                return
        supervisor_gone = status is not None and not finished and not supervisor.is_alive(step.directory)
        if status is not None and supervisor_gone:
            # It may have written its final status and exited between our two looks (a step's tasks all ending
            # at once): look again before calling it dead, or the tasks it had not yet seen end would count as
            # failed (exit 1) and the step as killed by its supervisor's death.
            status = supervisor.read_status(step.directory) or status
            finished = status.state == "finished"
            supervisor_gone = not finished
        exits = _ended_tasks(status)
        # A task that has ended writes no more: the rest of its last line goes too.
        drained = self._send_output(step, all_ended=finished or supervisor_gone, ended=exits.keys())
        fresh = [pb.StepTaskExit(task=t, exit_code=c) for t, c in exits.items() if t not in step.reported]
        if fresh and not finished:
            step.reported.update(e.task for e in fresh)
            self.send(pb.AgentMessage(step_exits=pb.StepTaskExits(
                job_id=step.job_id, step_id=step.step_id, exits=fresh)))
        if finished and drained:
            assert status is not None
            self._send_result(step, {t: exits.get(t, 1) for t in step.tasks}, status.error or "")
        elif supervisor_gone:
            supervisor.kill_orphans(step.directory)
            if drained:
                self._send_result(step, {t: exits.get(t, 1) for t in step.tasks}, "the step's supervisor died")

    def save_acked(self, step: LocalStep) -> None:
        """Keep the acknowledged offsets on disk (once a tick at most, however many acknowledgements came),
        for the agent after a restart to send from."""
        if step.acked_changed:
            step.acked_changed = False
            tmp = step.directory / (SENT_FILE + ".tmp")
            tmp.write_text(json.dumps(step.acked))
            os.replace(tmp, step.directory / SENT_FILE)

    def _send_result(self, step: LocalStep, exits: dict[int, int], error: str) -> None:
        step.finished_sent = True
        result = pb.StepNodeResult(job_id=step.job_id, step_id=step.step_id, error=error,
                                   exits=[pb.StepTaskExit(task=t, exit_code=c) for t, c in sorted(exits.items())])
        step.result = result
        self.send(pb.AgentMessage(step_result=result))

    def _not_here(self, job_id: int, step_id: int) -> None:
        """The controller asks about a step this node does not have: its result again if it ended here (and the
        controller restarted before its other nodes ended), else that nothing of it runs here."""
        result = self.forgotten.get((job_id, step_id))
        if result is None:
            result = pb.StepNodeResult(job_id=job_id, step_id=step_id, error="not running here")
        self.send(pb.AgentMessage(step_result=result))

    def _send_output(self, step: LocalStep, all_ended: bool = False, ended: Collection[int] = ()) -> bool:
        """Send what the tasks wrote since last time (a bounded amount); True when nothing is left.

        Whole lines, as srun delivers them (slurmstepd buffers each task's output by line unless -u): gsrun
        writes every task's stdout and stderr into one file or terminal, so a line sent in two pieces could
        have another task's (or its own stderr's) bytes land in its middle. A line's end is waited for while
        its task runs, unless the line is longer than a chunk; a --pty or -u step's bytes go as they come."""
        budget = MAX_BYTES_PER_TICK
        drained = True
        for task in step.tasks:
            whole_lines = not (step.pty or step.unbuffered or all_ended or task in ended)
            for stream, prefix in OUTPUT_PREFIXES.items():
                name = f"{prefix}-{task}"
                offset = step.sent.get(name, 0)
                try:
                    with _open_user_file(step.directory / IO_DIR / name, stat.S_ISREG) as output:
                        output.seek(offset)
                        while budget > 0 and self.outbox_size() < MAX_OUTBOX:
                            wanted = min(CHUNK_BYTES, budget)
                            data = output.read(wanted)
                            if not data:
                                break
                            if whole_lines:
                                cut = data.rfind(b"\n") + 1
                                if cut == 0 and len(data) < CHUNK_BYTES:
                                    output.seek(offset)  # a line still being written: the rest comes later
                                    break
                                if 0 < cut < len(data):
                                    data = data[:cut]
                                    output.seek(offset + cut)
                            self.send(pb.AgentMessage(step_output=pb.StepOutput(
                                job_id=step.job_id, step_id=step.step_id, task=task, stream=stream, data=data,
                                offset=offset)))
                            offset += len(data)
                            budget -= len(data)
                        if output.read(1):
                            drained = False
                except FileNotFoundError:
                    continue
                except OSError as exc:  # not a plain file the task wrote: never read through a link
                    log.warning("step %d.%d: not reading %s: %s", step.job_id, step.step_id, name, exc)
                    continue
                step.sent[name] = offset
        if not self.acks:
            self._count_as_acked(step)
        return drained


MAX_FORGOTTEN_RESULTS = 4096  # ~100 bytes each


def _ended_tasks(status: supervisor.SupervisorStatus | None) -> dict[int, int]:
    """task -> exit code, of the tasks the supervisor's status says have ended (1 where it has none)."""
    if status is None:
        return {}
    return {rank.rank: rank.exit_code if rank.exit_code is not None else 1 for rank in status.ranks if rank.ended}


def _open_user_file(path: Path, kind: Callable[[int], bool]) -> BinaryIO:
    """Open a file in a step's io/ (the job user's directory) for reading, without following a link the
    user may have put there, and only if it is of the expected kind: the agent reads as root."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not kind(os.fstat(fd).st_mode):
            raise OSError(f"{path.name} is not a plain file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
