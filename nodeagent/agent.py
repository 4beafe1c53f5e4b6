"""The node agent: discovers GPUs, keeps one stream to the controller, runs job attempts on this node.

The link reconnects with backoff; each (re)connection starts with a Register carrying the inventory, the
attempts still running here and the results the controller has not acknowledged, so the controller can
reconcile after either side restarts. Jobs never depend on the agent process: they run under detached
supervisors and their results wait on disk until acknowledged.

The node lease (nodeagent/lease.py) is the one exception, on purpose: every Register and heartbeat asks
for it, and the supervisors stop their ranks once no grant has renewed it for the lease's length. An
agent that finds its lease run out (it was frozen, or cut off from the controller) knows it may have been
declared dead: it stops every attempt here and registers again at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import grpc

from garrison import sdnotify
from garrison.auth import AuthError
from garrison.config import AgentConfig
from garrison.logs import kv
from garrison.loopback_listener import UntrustedListener, check_loopback_listener
from garrison.model.domain import NodeInventory
from garrison.nodeagent.containment.interface import Containment
from garrison.nodeagent.health import StateDirHealth
from garrison.nodeagent.jobs import AttemptResult, JobManager, RefusedLaunch
from garrison.nodeagent.lease import LEASE_FILE, NodeLease
from garrison.nodeagent.steps import StepRunner
from garrison.nodeagent.supervisor.core import boottime
from garrison.nodeagent.supervisor.forkserver import MAX_IDLE_SUPERVISORS, start_forkserver
from garrison.protos.v1 import garrison_pb2 as pb
from garrison.protos.v1 import garrison_pb2_grpc as pb_grpc
from garrison.slurmpath import ensure_slurm_path
from garrison.tls import TlsError, agent_channel
from garrison.wire import convert
from garrison.wire.batching import take_batch

log = logging.getLogger("garrison.agent")

CREDENTIAL_METADATA = "x-garrison-credential"
INITIAL_BACKOFF_S = 0.1
MAX_BACKOFF_S = 2.0
RESCAN_INTERVAL_S = 1.0
STEP_POLL_INTERVAL_S = 0.02  # how often running steps' output is read and sent (gsrun --pty's latency)
MAX_EARLY_NOTIFICATIONS = 10_000  # notifications kept for launches not done yet (beyond: the rescan finds them)
# A lone start report waits this long for company before it is written: the controller needs it for nothing
# urgent (the job runs either way), and a trivial job's result follows within milliseconds, so both go as one
# write (each write or read of the stream costs its side ~130 us of Python: 4-13% more jobs/s for an array of
# trivial jobs, 0.3-0.5 ms less CPU a job, the controller's part most).
START_REPORT_LINGER_S = 0.005
STEP_MESSAGE_KINDS = frozenset({"launch_step", "signal_step", "step_input", "step_ack", "step_output_ack"})


def result_to_pb(result: AttemptResult) -> pb.JobResult:
    message = pb.JobResult(
        job_id=result.job_id,
        attempt=result.attempt,
        ranks=[pb.RankResult(rank=r.rank, exit_code=r.exit_code, error=r.error) for r in result.ranks],
        error=result.error,
        finished_at=result.finished_at,
        lease_expired=result.lease_expired,
        supervisor_lost=result.supervisor_lost,
        out_of_memory=result.out_of_memory,
    )
    if result.usage is not None:
        message.usage.CopyFrom(usage_to_pb(result.usage))
    return message


def usage_to_pb(usage: dict[str, int]) -> pb.ContainmentUsage:
    """The supervisor's cgroup figures (and NVML's, if any) as the wire's."""
    message = pb.ContainmentUsage(oom_kills=usage.get("oom_kills", 0))
    if "max_rss_bytes" in usage:
        message.max_rss_bytes = usage["max_rss_bytes"]
    if "cpu_time_ns" in usage:
        message.cpu_time_s = usage["cpu_time_ns"] / 1e9
    if "gpu_utilization_milli_pct" in usage:
        message.gpu_utilization_pct = usage["gpu_utilization_milli_pct"] / 1000
    if "gpu_memory_bytes" in usage:
        message.gpu_memory_bytes = usage["gpu_memory_bytes"]
    return message


class LeaseLost(Exception):
    """The node's lease ran out while connected (the agent was frozen, or no grant came): re-register."""


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        node_name: str,
        inventory: NodeInventory,
        allow_root_jobs: bool,
        containment: Containment | None = None,
        gpu_minors: Mapping[int, int] | None = None,
    ) -> None:
        self.config = config
        self.node_name = node_name
        self.inventory = inventory
        self.state_dir = Path(config.state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.notify_path = str(self.state_dir / "notify.sock")
        self.lease = NodeLease(self.state_dir / LEASE_FILE)
        self.health = StateDirHealth(self.state_dir)  # a full or failing state directory drains the node
        # Slurm's command names (srun, scontrol, ...) first on every job's and step's PATH, as scripts expect.
        slurm_path = ensure_slurm_path()
        # Every GPU of the node, so that those a job was not given are denied to it (NVML's minors where known).
        minors = {gpu.index: (gpu_minors or {}).get(gpu.index, gpu.index) for gpu in inventory.gpus}
        self.jobs = JobManager(self.state_dir, self.notify_path, allow_root_jobs, lease_file=self.lease.path,
                               containment=containment, pids_max=config.job_pids_max, gpu_minors=minors,
                               slurm_path=str(slurm_path) if slurm_path else None, controller=config.controller,
                               job_devices=config.job_devices, scratch_dir=config.scratch_dir)
        self._registered = False  # in the current session: the controller accepted the registration
        self.active: set[tuple[int, int]] = set()
        self.checkpoints: dict[tuple[int, int], float] = {}  # last reported checkpoint-mark time
        self.outbox: asyncio.Queue[pb.AgentMessage] | None = None
        self._writing = 0  # messages taken from the outbox whose write has not finished (still "on the link")
        # This link's controller reads AgentMessage.batch (its RegisterAck said so): several messages per write.
        self._controller_batches = False
        self.heartbeat_interval_s = 5.0
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="launch")
        self._forkserver: subprocess.Popen[bytes] | None = None
        self._forkserver_lock = threading.Lock()  # launch threads may find it dead at once
        # Acknowledged attempts' job directories and cgroups are removed on a thread of their own, which the
        # stream's reader does not wait for: removing a directory of a dozen files is a quarter of the
        # agent's work per job, and the launches, releases and signals read after an acknowledgement (and
        # the launch threads) would otherwise wait behind it. One thread: removals need no parallelism.
        self._cleanup = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="cleanup")
        # Attempts whose supervisor said it ended before their launch was done here (a trivial job): their launch
        # looks for the result at once. Otherwise a launch needs no look of its own: the notification comes.
        self._ended_before_launched: dict[tuple[int, int], None] = {}
        self._checking: set[tuple[int, int]] = set()  # attempts whose result is being read now
        self._check_again: set[tuple[int, int]] = set()
        self._lookups: set[asyncio.Task[None]] = set()
        # Launches under way, by attempt: a signal or release for the attempt waits for its launch, so that it
        # never overtakes it (a batch hands the agent the launch and the signal in the same turn).
        self._launching: dict[tuple[int, int], asyncio.Task[None]] = {}
        self._stop = asyncio.Event()
        # Job steps (gsrun): their own supervisors, output streamed from their files (nodeagent/steps.py).
        self.steps = StepRunner(self.state_dir, allow_root_jobs, self._send, self._outbox_size,
                                lambda: self.jobs.forkserver, self.jobs.step_cgroup, self.jobs.slurm_path,
                                controller=config.controller, visible_gpus=self.jobs.visible_gpus,
                                tmp_dir=self.jobs.tmp_dir)

    def _in_background(self, work: Callable[..., object], *args: object) -> None:
        """Run ``work`` on the cleanup thread; nobody waits for it, so its failure is logged here."""

        def log_failure(future: concurrent.futures.Future[object]) -> None:
            if not future.cancelled() and future.exception() is not None:
                log.error("%s%r failed", getattr(work, "__name__", work), args, exc_info=future.exception())

        try:
            self._cleanup.submit(work, *args).add_done_callback(log_failure)
        except RuntimeError:  # shut down: the agent is stopping, and the work is done again after it starts
            pass

    def _outbox_size(self) -> int:
        # What is being written counts as waiting on the link: a batch takes many messages out at once.
        return self.outbox.qsize() + self._writing if self.outbox is not None else 1 << 30

    async def _step_loop(self) -> None:
        while True:
            await asyncio.sleep(STEP_POLL_INTERVAL_S if self.steps.local else 0.2)
            if self.outbox is not None:
                self.steps.tick()

    # ---------------------------------------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._forkserver = self._start_forkserver()
        self.jobs.revive_forkserver = self.steps.revive_forkserver = self._revive_forkserver
        notify = self._open_notify_socket()
        loop.add_reader(notify.fileno(), self._on_notify, notify)
        self._in_background(self.jobs.remove_leftover_removals)
        rescan = asyncio.create_task(self._rescan_loop())
        step_poll = asyncio.create_task(self._step_loop())
        try:
            await self._link_loop()
        finally:
            rescan.cancel()
            step_poll.cancel()
            loop.remove_reader(notify.fileno())
            notify.close()
            self._pool.shutdown(wait=False)
            # Removals not done yet are done again: the renamed ones at the next start, the others when the
            # controller acknowledges their results again after this agent has registered anew.
            self._cleanup.shutdown(wait=False, cancel_futures=True)
            with self._forkserver_lock:
                if self._forkserver is not None:
                    self._forkserver.terminate()
                    self._forkserver.wait()

    def _start_forkserver(self) -> subprocess.Popen[bytes] | None:
        """Start the supervisor fork server; jobs still start without it, only slower."""
        path = self.state_dir / "forkserver.sock"
        try:
            # As many idle supervisors as one-GPU jobs can end together here, so that their replacements
            # reuse them rather than fork (MAX_IDLE_SUPERVISORS at least, for CPU-only jobs).
            server = start_forkserver(path, max_idle=max(MAX_IDLE_SUPERVISORS, len(self.inventory.gpus)))
        except (OSError, RuntimeError) as exc:
            log.warning("supervisor fork server did not start (%s); starting supervisors as new interpreters", exc)
            return None
        self.jobs.forkserver = path
        return server

    def _revive_forkserver(self) -> bool:
        """The fork server refused a connection: start it again if its process has ended (a stray kill, the
        OOM killer); True once one runs (a launch thread that found it dead at the same time as another
        finds it running again). Called from the launch threads, which live as long as the agent (the
        server dies with the thread that started it: PR_SET_PDEATHSIG)."""
        with self._forkserver_lock:
            current = self._forkserver
            if current is not None and current.poll() is None:
                return True
            if current is not None:
                log.warning("supervisor fork server exited (status %s): starting it again", current.returncode)
            self._forkserver = self._start_forkserver()
            return self._forkserver is not None

    def stop(self) -> None:
        self._stop.set()

    def _open_notify_socket(self) -> socket.socket:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.notify_path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(self.notify_path)
        # Supervisors run as the job's user and must be able to reach us.
        os.chmod(self.notify_path, 0o722)
        sock.setblocking(False)
        return sock

    def _on_notify(self, sock: socket.socket) -> None:
        while True:
            try:
                data = sock.recv(4096)
            except BlockingIOError:
                return
            try:
                note = json.loads(data)
                key = (int(note["job_id"]), int(note["attempt"]))
            except (ValueError, KeyError, TypeError):
                continue
            if key in self.active:
                self._check_attempt(key)
            else:  # its launch is not done yet (or it is not ours): the launch looks once it is
                self._ended_before_launched[key] = None
                while len(self._ended_before_launched) > MAX_EARLY_NOTIFICATIONS:
                    del self._ended_before_launched[next(iter(self._ended_before_launched))]

    def _check_attempt(self, key: tuple[int, int]) -> None:
        """Look for the attempt's result, off the event loop: reading it opens files the job controls (its
        torch error file), which must never stall the link and its heartbeats. One look per attempt at a
        time; a request during a look makes it look once more."""
        if key in self._checking:
            self._check_again.add(key)
            return
        self._checking.add(key)
        task = asyncio.get_running_loop().create_task(self._look_for_result(key))
        self._lookups.add(task)  # a task nobody references may be collected before it ends
        task.add_done_callback(self._lookups.discard)

    async def _look_for_result(self, key: tuple[int, int]) -> None:
        try:
            while True:
                self._check_again.discard(key)
                result = await asyncio.get_running_loop().run_in_executor(self._pool, self.jobs.result, *key)
                if result is not None or key not in self._check_again:
                    break
        except Exception:
            log.exception("reading the result of job=%d attempt=%d failed; the rescan tries again", *key)
            return
        finally:
            self._checking.discard(key)
            self._check_again.discard(key)
        if result is None:
            return
        self.active.discard(key)
        self._send(pb.AgentMessage(finished=result_to_pb(result)))
        self.steps.kill_job(key[0])  # a step never outlives its job
        exit_codes = ",".join(str(r.exit_code) for r in result.ranks)
        log.info("finished %s", kv(job=key[0], attempt=key[1], node=self.node_name, exit_codes=exit_codes,
                                   error=result.error))

    async def _rescan_loop(self) -> None:
        # A fallback for lost notifications and for supervisors that died: cheap, once a second.
        while True:
            await asyncio.sleep(RESCAN_INTERVAL_S)
            for key in list(self.active):
                self._check_attempt(key)
                self._check_checkpoint(key)

    def _checkpoint_marks(self, running: list[tuple[int, int]]) -> dict[tuple[int, int], float]:
        marks = {key: self.jobs.checkpoint_time(*key) for key in running}
        return {key: when for key, when in marks.items() if when is not None}

    def _check_checkpoint(self, key: tuple[int, int]) -> None:
        when = self.jobs.checkpoint_time(*key)
        if when is not None and when > self.checkpoints.get(key, 0.0):
            self.checkpoints[key] = when
            self._send(pb.AgentMessage(checkpointed=pb.Checkpointed(job_id=key[0], attempt=key[1], time=when)))

    def _report_fault(self) -> None:
        """Say the node's fault now, not at the next heartbeat: no more jobs should come here meanwhile."""
        self._send(pb.AgentMessage(heartbeat=pb.Heartbeat(time=time.time(), node_fault=self.health.fault)))

    def _send(self, message: pb.AgentMessage) -> None:
        if self.outbox is not None:
            self.outbox.put_nowait(message)

    # ---------------------------------------------------------------------------------------------

    async def _link_loop(self) -> None:
        backoff = INITIAL_BACKOFF_S
        while not self._stop.is_set():
            self._registered = False
            try:
                await self._session()
            except LeaseLost as exc:
                log.warning("%s", exc)
            except grpc.aio.AioRpcError as exc:
                log.warning("link to controller %s: %s", self.config.controller, exc.details() or exc.code().name)
                sdnotify.status(f"no link to the controller at {self.config.controller}: {exc.code().name}; retrying")
            except (OSError, AuthError, TlsError, UntrustedListener) as exc:
                # The controller (and its credential service) may not be up yet, or restarting: retry.
                log.warning("link to controller %s: %s", self.config.controller, exc)
                sdnotify.status(f"no link to the controller at {self.config.controller}: {exc}; retrying")
            if self._stop.is_set():
                return
            tried_at = boottime()  # the extension counts from here (NodeLease.extend_while_no_controller)
            refused = await asyncio.get_running_loop().run_in_executor(self._pool, self._controller_refuses)
            # The controller is down, not cut off from us: keep the running jobs (nodeagent/lease.py).
            if refused and self._extend_lease_while_no_controller(tried_at):
                log.info("controller %s refuses connections (not running): node lease extended by %.0fs",
                         self.config.controller, self.lease.duration_s or 0.0)
            if self._registered:
                # The link worked until now: the controller restarted or the stream was cut, so try again
                # at once, and only back off if that fails.
                backoff = INITIAL_BACKOFF_S
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    def _extend_lease_while_no_controller(self, refused_at: float) -> bool:
        try:
            return self.lease.extend_while_no_controller(refused_at)
        except OSError as error:
            if not self.health.record(error, "extending the node lease"):
                raise
            return False

    def _controller_refuses(self) -> bool:
        """Whether a TCP connection to the controller's address is refused (its host is up and nothing
        listens on its port), as opposed to timing out (a partition, or its host down)."""
        host, _, port = self.config.controller.rpartition(":")
        if not port.isdigit():
            return False
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                return False
        except ConnectionRefusedError:
            return True
        except OSError:
            return False

    def _credential(self) -> str:
        from garrison.auth import fetch_credential

        return fetch_credential(self.config.credential_socket)

    async def _session(self) -> None:
        loop = asyncio.get_running_loop()
        # With TLS the node certificate proves who we are; without (loopback only), a local credential.
        cfg = self.config
        if not cfg.tls_cert:
            # Plain text (loopback): our credential speaks for root; only to a port that root or we hold.
            await loop.run_in_executor(self._pool, check_loopback_listener, cfg.controller, "the agent's credential")
        credential = None if cfg.tls_cert else await loop.run_in_executor(self._pool, self._credential)
        if self.lease.expired():
            # The supervisors are stopping (or have stopped) their ranks by themselves; make sure of it, so that
            # what we report below is what the controller may count on.
            log.warning("node lease expired %.1fs ago: this node may have been declared dead; its attempts are "
                        "stopped, registering again", -(self.lease.remaining_s() or 0.0))
            await loop.run_in_executor(self._pool, self._stop_all_attempts)
        running, finished = await loop.run_in_executor(self._pool, self.jobs.scan)
        self.active = set(running)
        # The controller may have restarted and forgotten the checkpoint marks: they go with the registration.
        marks = await loop.run_in_executor(self._pool, self._checkpoint_marks, running)
        self.checkpoints = dict(marks)
        outbox: asyncio.Queue[pb.AgentMessage] = asyncio.Queue()
        outbox.put_nowait(
            pb.AgentMessage(
                register=pb.Register(
                    node_name=self.node_name,
                    inventory=convert.inventory_to_pb(self.inventory),
                    running=[pb.JobRef(job_id=j, attempt=a, checkpoint_time=marks.get((j, a), 0.0))
                             for j, a in running],
                    finished=[result_to_pb(r) for r in finished],
                    agent_version="0.1.0",
                    address=self.config.address or self.node_name,
                    lease_request=self.lease.request(),
                    accepts_batches=True,
                )
            )
        )
        self.outbox = outbox
        self._controller_batches = False  # until this link's controller says otherwise
        self.steps.scan()
        self.steps.reconnected()

        async with agent_channel(cfg.controller, cfg.tls_cert, cfg.tls_key, cfg.tls_ca) as channel:
            stub = pb_grpc.AgentLinkStub(channel)
            metadata = ((CREDENTIAL_METADATA, credential),) if credential is not None else ()
            # Written by a task of our own rather than through a request iterator: grpc's task consuming an
            # iterator is left pending (and its generator closed while running) when the stream is cancelled,
            # which logged "Task was destroyed" and "aclose()" errors on every reconnect.
            call = stub.Connect(metadata=metadata)
            reader = asyncio.create_task(self._read(call))
            writer = asyncio.create_task(self._write(call, outbox))
            heartbeats = asyncio.create_task(self._heartbeat_loop(outbox))
            stopper = asyncio.create_task(self._stop.wait())
            tasks = {reader, writer, heartbeats, stopper}
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task is not stopper:
                        task.result()  # the stream's end or error, or LeaseLost from the heartbeat loop
            finally:
                self.outbox = None
                call.cancel()
                for task in tasks:
                    task.cancel()
                # Wait for them to end, so a reconnect leaves no task behind to be destroyed while pending.
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _write(self, call: grpc.aio.StreamStreamCall, outbox: asyncio.Queue[pb.AgentMessage]) -> None:
        """Send the outbox's messages on the stream until it ends; its end or error is the reader's to report.

        To a controller that reads batches, what was queued by the time this task runs (this event-loop
        turn's messages, and those queued while the last write was under way) goes as one write
        (garrison/wire/batching.py): a grpc.aio write costs the loop ~130 us whatever it carries. A lone start
        report first waits START_REPORT_LINGER_S for what follows it (a trivial job's result)."""
        held: pb.AgentMessage | None = None
        while True:
            first = held if held is not None else await outbox.get()
            held = None
            message = first
            if self._controller_batches and outbox.empty() and first.WhichOneof("kind") == "started":
                await asyncio.sleep(START_REPORT_LINGER_S)
            if self._controller_batches:
                messages, held, _ = take_batch(first, outbox)
                if len(messages) > 1:
                    message = pb.AgentMessage(batch=pb.AgentMessages(messages=messages))
                self._writing = len(messages) + (held is not None)
            else:
                self._writing = 1
            try:
                await call.write(message)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                await asyncio.Event().wait()  # the stream has ended: wait to be cancelled with the session
                return
            finally:
                self._writing = 0

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        async for message in call:
            if message.WhichOneof("kind") == "batch":
                # One after the other, as if each had come alone: a launch before its signal or release.
                # (A batch inside a batch is never sent: _handle ignores it as an unknown kind.)
                for each in message.batch.messages:
                    await self._handle(each)
            else:
                await self._handle(message)

    async def _heartbeat_loop(self, outbox: asyncio.Queue[pb.AgentMessage]) -> None:
        session_started = boottime()
        while True:
            if self.lease.ran_out_since(session_started):
                # Frozen past the lease (SIGSTOP, a stalled host) or no grant for that long: the controller may
                # have declared this node dead and requeued its jobs. Stop everything and register again.
                await asyncio.get_running_loop().run_in_executor(self._pool, self._stop_all_attempts)
                raise LeaseLost(f"node lease expired {-(self.lease.remaining_s() or 0.0):.1f}s ago: "
                                "stopped every attempt here; registering again")
            if self.health.fault:  # off the loop: a failing disk may block
                await asyncio.get_running_loop().run_in_executor(self._pool, self.health.probe)
            outbox.put_nowait(pb.AgentMessage(heartbeat=pb.Heartbeat(time=time.time(),
                                                                     lease_request=self.lease.request(),
                                                                     node_fault=self.health.fault)))
            self._report_running_usage(outbox)
            await asyncio.sleep(self.heartbeat_interval_s)

    def _stop_all_attempts(self) -> None:
        """Terminate every attempt on this node (SIGTERM, the kill wait, SIGKILL): the lease has run out."""
        for job_id, attempt in self.jobs.attempts():
            if self.jobs.result(job_id, attempt) is None:
                log.warning("node lease expired: stopping %s", kv(job=job_id, attempt=attempt, node=self.node_name))
                self.jobs.stop_for_lease(job_id, attempt)

    def _report_running_usage(self, outbox: asyncio.Queue[pb.AgentMessage]) -> None:
        """With each heartbeat, what every running attempt has used so far (gjob shows it, as sstat)."""
        for job_id, attempt in sorted(self.active):
            usage = self.jobs.running_usage(job_id, attempt)
            if usage is not None:
                outbox.put_nowait(pb.AgentMessage(running_usage=pb.ContainmentRunningUsage(
                    job_id=job_id, attempt=attempt, usage=usage_to_pb(usage))))

    async def _handle(self, message: pb.ControllerMessage) -> None:
        kind = message.WhichOneof("kind")
        if kind == "registered":
            self.heartbeat_interval_s = message.registered.heartbeat_interval_s or self.heartbeat_interval_s
            self._registered = True
            self.steps.controller_acks(message.registered.step_output_acks)
            self._controller_batches = message.registered.accepts_batches
            log.info("registered with controller %s as %s", self.config.controller, self.node_name)
            # Ready for systemd (Type=notify) only now: the node is part of the cluster. Repeats are ignored.
            sdnotify.ready(f"registered with the controller at {self.config.controller} as {self.node_name}")
        elif kind == "launch":
            key = (message.launch.job_id, message.launch.attempt)
            launch = asyncio.get_running_loop().create_task(self._launch(message.launch))
            self._launching[key] = launch
            launch.add_done_callback(lambda done: self._launched(key, done))
        elif kind == "signal":
            sig = message.signal
            action = {pb.SignalJob.SIGNAL: "signal", pb.SignalJob.TERMINATE: "terminate", pb.SignalJob.KILL: "kill"}[
                sig.action
            ]
            key = (sig.job_id, sig.attempt)
            await self._launch_done(key)
            if action == "signal" and sig.signal:
                # gcancel -s, --signal and preemption warnings reach every task of the job's steps too, as
                # scancel's reach every step (but --signal=B: only the batch shell).
                self.steps.signal_job(sig.job_id, sig.signal, self.jobs.batch_signal(*key))
            known = await asyncio.get_running_loop().run_in_executor(
                self._pool, self.jobs.signal, sig.job_id, sig.attempt, action, sig.signal
            )
            if not known:
                # Nothing of that attempt runs here: say so, so the controller frees what it holds for it.
                self._send(pb.AgentMessage(finished=pb.JobResult(job_id=sig.job_id, attempt=sig.attempt, error="not running here")))
            elif self.jobs.is_placeholder(*key):
                self._check_attempt(key)
        elif kind == "lease":
            # On the loop, like the requests it answers: a few microseconds to rewrite the lease file.
            try:
                self.lease.granted(message.lease.request, message.lease.duration_s)
            except OSError as error:
                # A full disk: the lease is not renewed (the supervisors stop their ranks at its end, as for a
                # node cut off), the link stays, and the heartbeats say why, so the node is drained meanwhile.
                if not self.health.record(error, "renewing the node lease"):
                    raise
                self._report_fault()
        elif kind == "release":
            key = (message.release.job_id, message.release.attempt)
            await self._launch_done(key)
            await asyncio.get_running_loop().run_in_executor(self._pool, self.jobs.release, *key)
        elif kind in STEP_MESSAGE_KINDS:
            self.steps.handle(message)
        elif kind == "ack":
            key = (message.ack.job_id, message.ack.attempt)
            self.active.discard(key)
            self._in_background(self.jobs.acknowledge, *key)

    def _launched(self, key: tuple[int, int], launch: asyncio.Task[None]) -> None:
        if self._launching.get(key) is launch:
            del self._launching[key]

    async def _launch_done(self, key: tuple[int, int]) -> None:
        """Wait for the attempt's launch if one is under way here (its outcome is the launch's to report)."""
        launch = self._launching.get(key)
        if launch is not None:
            await asyncio.wait([launch])

    async def _launch(self, msg: pb.LaunchJob) -> None:
        key = (msg.job_id, msg.attempt)
        try:
            request = convert.launch_from_pb(msg)
            await asyncio.get_running_loop().run_in_executor(self._pool, self.jobs.launch, request)
        except RefusedLaunch as exc:
            self._send(pb.AgentMessage(finished=pb.JobResult(job_id=msg.job_id, attempt=msg.attempt, error=str(exc))))
            return
        except Exception as exc:
            log.exception("launch failed job=%d attempt=%d node=%s", key[0], key[1], self.node_name)
            if self.health.record(exc, f"launching job {key[0]}"):
                self._report_fault()
            self._send(
                pb.AgentMessage(
                    finished=pb.JobResult(job_id=msg.job_id, attempt=msg.attempt, error=f"launch failed: {exc}",
                                          launch_failed=True)
                )
            )
            return
        self.active.add(key)
        self._send(pb.AgentMessage(started=pb.JobStarted(job_id=msg.job_id, attempt=msg.attempt)))
        # The ranks may already have ended (a trivial job) before we started watching: their notification
        # was set aside above. (The rescan is the fallback for a lost one, as for any attempt.)
        if key in self._ended_before_launched:
            del self._ended_before_launched[key]
            self._check_attempt(key)
