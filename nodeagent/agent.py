"""The node agent: discovers GPUs, keeps one stream to the controller, runs job attempts on this node.

The link reconnects with backoff; each (re)connection starts with a Register carrying the inventory, the
attempts still running here and the results the controller has not acknowledged, so the controller can
reconcile after either side restarts. Jobs never depend on the agent process: they run under detached
supervisors and their results wait on disk until acknowledged.
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
import time
from pathlib import Path

import grpc

from garrison import sdnotify
from garrison.auth import AuthError
from garrison.config import AgentConfig
from garrison.logs import kv
from garrison.model.domain import LAUNCH_FAILED_PREFIX as LAUNCH_FAILED
from garrison.model.domain import NodeInventory
from garrison.nodeagent.jobs import AttemptResult, JobManager, RefusedLaunch
from garrison.nodeagent.supervisor.forkserver import start_forkserver
from garrison.protos.v1 import garrison_pb2 as pb
from garrison.protos.v1 import garrison_pb2_grpc as pb_grpc
from garrison.tls import TlsError, agent_channel
from garrison.wire import convert

log = logging.getLogger("garrison.agent")

CREDENTIAL_METADATA = "x-garrison-credential"
MAX_BACKOFF_S = 5.0
RESCAN_INTERVAL_S = 1.0


def result_to_pb(result: AttemptResult) -> pb.JobResult:
    return pb.JobResult(
        job_id=result.job_id,
        attempt=result.attempt,
        ranks=[pb.RankResult(rank=r.rank, exit_code=r.exit_code, error=r.error) for r in result.ranks],
        error=result.error,
        finished_at=result.finished_at,
    )


class Agent:
    def __init__(self, config: AgentConfig, node_name: str, inventory: NodeInventory, allow_root_jobs: bool) -> None:
        self.config = config
        self.node_name = node_name
        self.inventory = inventory
        self.state_dir = Path(config.state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.notify_path = str(self.state_dir / "notify.sock")
        self.jobs = JobManager(self.state_dir, self.notify_path, allow_root_jobs)
        self.active: set[tuple[int, int]] = set()
        self.checkpoints: dict[tuple[int, int], float] = {}  # last reported checkpoint-mark time
        self.outbox: asyncio.Queue[pb.AgentMessage] | None = None
        self.heartbeat_interval_s = 5.0
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="launch")
        self._stop = asyncio.Event()

    # ---------------------------------------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        forkserver = self._start_forkserver()
        notify = self._open_notify_socket()
        loop.add_reader(notify.fileno(), self._on_notify, notify)
        rescan = asyncio.create_task(self._rescan_loop())
        try:
            await self._link_loop()
        finally:
            rescan.cancel()
            loop.remove_reader(notify.fileno())
            notify.close()
            self._pool.shutdown(wait=False)
            if forkserver is not None:
                forkserver.terminate()
                forkserver.wait()

    def _start_forkserver(self) -> subprocess.Popen[bytes] | None:
        """Start the supervisor fork server; jobs still start without it, only slower."""
        path = self.state_dir / "forkserver.sock"
        try:
            server = start_forkserver(path)
        except (OSError, RuntimeError) as exc:
            log.warning("supervisor fork server did not start (%s); starting supervisors as new interpreters", exc)
            return None
        self.jobs.forkserver = path
        return server

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
            if key in self.active:  # before that, the launch path checks the attempt itself
                self._check_attempt(key)

    def _check_attempt(self, key: tuple[int, int]) -> None:
        result = self.jobs.result(*key)
        if result is None:
            return
        self.active.discard(key)
        self._send(pb.AgentMessage(finished=result_to_pb(result)))
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

    def _send(self, message: pb.AgentMessage) -> None:
        if self.outbox is not None:
            self.outbox.put_nowait(message)

    # ---------------------------------------------------------------------------------------------

    async def _link_loop(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            connected_at = time.monotonic()
            try:
                await self._session()
            except grpc.aio.AioRpcError as exc:
                log.warning("link to controller %s: %s", self.config.controller, exc.details() or exc.code().name)
                sdnotify.status(f"no link to the controller at {self.config.controller}: {exc.code().name}; retrying")
            except (OSError, AuthError, TlsError) as exc:
                # The controller (and its credential service) may not be up yet, or restarting: retry.
                log.warning("link to controller %s: %s", self.config.controller, exc)
                sdnotify.status(f"no link to the controller at {self.config.controller}: {exc}; retrying")
            if self._stop.is_set():
                return
            if time.monotonic() - connected_at > 10:
                backoff = 0.1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    def _credential(self) -> str:
        from garrison.auth import fetch_credential

        return fetch_credential(self.config.credential_socket)

    async def _session(self) -> None:
        loop = asyncio.get_running_loop()
        # With TLS the node certificate proves who we are; without (loopback only), a local credential.
        cfg = self.config
        credential = None if cfg.tls_cert else await loop.run_in_executor(self._pool, self._credential)
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
                )
            )
        )
        self.outbox = outbox

        async def outgoing():  # type: ignore[no-untyped-def]
            while True:
                yield await outbox.get()

        async with agent_channel(cfg.controller, cfg.tls_cert, cfg.tls_key, cfg.tls_ca) as channel:
            stub = pb_grpc.AgentLinkStub(channel)
            metadata = ((CREDENTIAL_METADATA, credential),) if credential is not None else ()
            call = stub.Connect(outgoing(), metadata=metadata)
            heartbeats = asyncio.create_task(self._heartbeat_loop(outbox))
            stopper = asyncio.create_task(self._stop.wait())
            try:
                reader = asyncio.create_task(self._read(call))
                done, _ = await asyncio.wait({reader, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if reader in done:
                    reader.result()
                else:
                    reader.cancel()
                    call.cancel()
            finally:
                heartbeats.cancel()
                stopper.cancel()
                self.outbox = None

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        async for message in call:
            await self._handle(message)

    async def _heartbeat_loop(self, outbox: asyncio.Queue[pb.AgentMessage]) -> None:
        while True:
            outbox.put_nowait(pb.AgentMessage(heartbeat=pb.Heartbeat(time=time.time())))
            await asyncio.sleep(self.heartbeat_interval_s)

    async def _handle(self, message: pb.ControllerMessage) -> None:
        kind = message.WhichOneof("kind")
        if kind == "registered":
            self.heartbeat_interval_s = message.registered.heartbeat_interval_s or self.heartbeat_interval_s
            log.info("registered with controller %s as %s", self.config.controller, self.node_name)
            # Ready for systemd (Type=notify) only now: the node is part of the cluster. Repeats are ignored.
            sdnotify.ready(f"registered with the controller at {self.config.controller} as {self.node_name}")
        elif kind == "launch":
            asyncio.get_running_loop().create_task(self._launch(message.launch))
        elif kind == "signal":
            sig = message.signal
            action = {pb.SignalJob.SIGNAL: "signal", pb.SignalJob.TERMINATE: "terminate", pb.SignalJob.KILL: "kill"}[
                sig.action
            ]
            key = (sig.job_id, sig.attempt)
            known = await asyncio.get_running_loop().run_in_executor(
                self._pool, self.jobs.signal, sig.job_id, sig.attempt, action, sig.signal
            )
            if not known:
                # Nothing of that attempt runs here: say so, so the controller frees what it holds for it.
                self._send(pb.AgentMessage(finished=pb.JobResult(job_id=sig.job_id, attempt=sig.attempt, error="not running here")))
            elif self.jobs.is_placeholder(*key):
                self._check_attempt(key)
        elif kind == "ack":
            key = (message.ack.job_id, message.ack.attempt)
            self.active.discard(key)
            await asyncio.get_running_loop().run_in_executor(self._pool, self.jobs.acknowledge, *key)

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
            self._send(
                pb.AgentMessage(
                    finished=pb.JobResult(job_id=msg.job_id, attempt=msg.attempt, error=f"{LAUNCH_FAILED}: {exc}")
                )
            )
            return
        self.active.add(key)
        self._send(pb.AgentMessage(started=pb.JobStarted(job_id=msg.job_id, attempt=msg.attempt)))
        # The ranks may already have ended (a trivial job) before we started watching.
        self._check_attempt(key)
