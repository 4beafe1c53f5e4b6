"""garrison-controller: the central daemon (gRPC for clients and agents, the queue, the scheduler)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from garrison import sdnotify
from garrison.config import ConfigError, ControllerConfig, GarrisonConfig, load_config
from garrison.logs import setup_logging

if TYPE_CHECKING:
    from garrison.controller.clock import Clock
    from garrison.controller.engine import Engine
    from garrison.controller.state import ClusterState
    from garrison.controller.store import PoolSettings
    from garrison.metrics_server import MetricsEndpoint

log = logging.getLogger("garrison.controller")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="garrison-controller",
        description="Garrison controller daemon: job queue, scheduler, and gRPC endpoint for clients and agents.",
    )
    parser.add_argument("--config", default=os.environ.get("GARRISON_CONFIG", "/etc/garrison/garrison.toml"),
                        help="TOML configuration file (default: $GARRISON_CONFIG or /etc/garrison/garrison.toml)")
    parser.add_argument("command", nargs="?", choices=["serve", "migrate"], default="serve",
                        help="serve (default) or migrate: apply database migrations and exit")
    return parser.parse_args(argv)


async def serve(config: GarrisonConfig) -> None:
    # No cyclic garbage collection while the controller imports itself and loads its jobs: what that creates
    # lives as long as the process, and each collection of the older generations walked the whole growing
    # heap (~0.1 s of a restart's CPU with 50,000 jobs). Once loaded, it is frozen out of later collections.
    gc.disable()
    try:
        await _serve(config)
    finally:
        gc.enable()


async def _serve(config: GarrisonConfig) -> None:
    import grpc

    from garrison.auth import AuthError, CredentialService, load_or_create_key
    from garrison.controller import metrics
    from garrison.controller.clock import SystemClock
    from garrison.controller.engine import Engine
    from garrison.controller.events import log_job_change
    from garrison.controller.ratelimit import AuthFailureLimiter, RateLimiter, RefusalLog
    from garrison.controller.rendezvous import (
        RendezvousPorts,
        ephemeral_range,
        port_secret,
        warn_if_ephemeral,
    )
    from garrison.controller.rpc.accounting import AccountingService
    from garrison.controller.rpc.admin import AdminService
    from garrison.controller.rpc.local import LocalLimits, LocalServer
    from garrison.controller.rpc.security import (
        RequestDecodeGuard,
        SecurityService,
        listen,
        open_token_registry,
    )
    from garrison.controller.rpc.services import AgentLinkService, Authenticator, ControllerService
    from garrison.controller.startup_checks import check_controller_paths, make_database_private
    from garrison.controller.state import ClusterState
    from garrison.controller.store import open_store
    from garrison.model.lease import fence_delay_s
    from garrison.protos.v1 import accounting_pb2_grpc as apb_grpc
    from garrison.protos.v1 import admin_pb2_grpc as admin_grpc
    from garrison.protos.v1 import garrison_pb2_grpc as pb_grpc
    from garrison.protos.v1 import security_pb2_grpc as spb_grpc

    cfg = config.controller
    # What the controller writes (its database, its token registry, its logs' rotations) is its own alone;
    # the sockets any user may reach are opened up explicitly.
    os.umask(0o077)
    check_controller_paths(config)
    clock = SystemClock()
    store = open_store(cfg.database, _pool_settings(cfg))
    make_database_private(cfg.database)
    state = ClusterState(store, cfg.heartbeat_timeout_s, fence_delay_s(cfg.node_lease_s, cfg.kill_wait_s))
    state.job_observers += [metrics.job_changed, log_job_change]
    state.load(clock.now(), cfg.finished_job_retention_s)
    # The modules, the configuration and the jobs just loaded are there for good: later collections need not
    # walk them (which leaves the few hundred objects of cyclic garbage that the start-up made, uncollected).
    gc.freeze()
    gc.enable()
    try:
        key = load_or_create_key(Path(cfg.key_file))
    except AuthError as exc:
        raise ConfigError(f"{config.path}: controller.key_file: {exc}") from None
    credentials = CredentialService(cfg.credential_socket, key, lifetime_s=cfg.credential_lifetime_s)
    credentials.start()

    rendezvous = RendezvousPorts(port_secret(key), cfg.rendezvous_ports)
    overlap = warn_if_ephemeral(cfg.rendezvous_ports, ephemeral_range())
    if overlap is not None:
        log.warning("%s", overlap)
    engine = Engine(cfg, state, clock, rendezvous)
    tokens = open_token_registry(cfg, clock.now, config.path)
    limiter = RateLimiter(cfg.request_rate_per_s, cfg.request_burst)
    failures = AuthFailureLimiter(cfg.auth_failure_rate_per_s, cfg.auth_failure_burst, warn=log.warning)
    refusals = RefusalLog(lambda line: log.warning("%s", line), burst=cfg.refusal_log_burst)
    auth = Authenticator(key, clock.now, tokens=tokens, limiter=limiter, failures=failures, refusals=refusals)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)], interceptors=[RequestDecodeGuard()])
    client_service = ControllerService(engine, auth, cfg.credential_socket, cfg.local_socket)
    pb_grpc.add_ControllerServicer_to_server(client_service, server)
    agent_link = AgentLinkService(engine, auth, set(cfg.agent_uids), require_certificate=bool(cfg.tls_cert),
                                  revoked_file=cfg.tls_revoked_agents)
    pb_grpc.add_AgentLinkServicer_to_server(agent_link, server)
    spb_grpc.add_SecurityServicer_to_server(SecurityService(engine, auth, tokens), server)
    admin_service = AdminService(engine, auth)
    admin_grpc.add_AdminServicer_to_server(admin_service, server)
    accounting_service = AccountingService(engine.accounting_query, auth, clock, engine.is_admin)
    apb_grpc.add_AccountingServicer_to_server(accounting_service, server)
    transport = listen(server, cfg, config.path)  # TLS, or plain text on loopback only
    await server.start()
    state.listening(clock.now())  # nodes' silence counts from here: until now they were refused
    local_limits = LocalLimits(
        connections_per_uid=cfg.local_max_connections_per_user,
        buffer_per_uid=cfg.local_max_buffer_per_user_mb << 20,
        buffer_total=cfg.local_max_buffer_total_mb << 20,
        frame_timeout_s=cfg.local_frame_timeout_s,
    )
    local = LocalServer(
        cfg.local_socket, client_service, limits=local_limits, admin_servicer=admin_service,
        accounting_servicer=accounting_service,
        refused=lambda uid, why: refusals.refused(("RESOURCE_EXHAUSTED", "local socket", "uid", uid),
                                                  f"refused a local connection of uid {uid}: {why}"),
    ) if cfg.local_socket else None
    if local is not None:
        await local.start()
    engine.start()
    # The CPU time to here is what a restart costs before it serves (imports, loading the jobs), which a
    # loaded machine does not stretch as it stretches the wall-clock time (tests/benchmarks/scale.py).
    log.info("controller listening: %s (database %s; %.2f s of CPU since start)", transport,
             cfg.database.split("://")[0], time.process_time())
    metrics_endpoint = await _serve_metrics(config, state, clock, engine)
    # Ready once every endpoint configured answers (the metrics' too).
    sdnotify.ready(f"serving on {cfg.address}: {len(state.jobs)} jobs, {len(state.nodes)} nodes known")

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("controller stopping")
    sdnotify.stopping()
    if metrics_endpoint is not None:
        metrics_endpoint.stop()
    if local is not None:
        await local.stop()
    await engine.stop()
    refusals.flush()
    await server.stop(grace=1.0)
    credentials.stop()
    store.close()


def _pool_settings(cfg: ControllerConfig) -> PoolSettings:
    from garrison.controller.store import PoolSettings

    return PoolSettings(
        size=cfg.database_pool_size,
        max_overflow=cfg.database_max_overflow,
        timeout_s=cfg.database_pool_timeout_s,
        recycle_s=cfg.database_pool_recycle_s,
    )


async def _serve_metrics(config: GarrisonConfig, state: ClusterState, clock: Clock,
                         engine: Engine) -> MetricsEndpoint | None:
    """The Prometheus endpoint on [controller] metrics_address, if set; the cluster gauges are sampled on
    this (the event loop's) thread.

    Started once the controller serves, with prometheus-client and the HTTP server it brings imported in a
    worker thread meanwhile: ~0.03 s of CPU that a restart's first requests no longer wait for (issue 23)."""
    address = config.controller.metrics_address
    if not address:
        return None
    from garrison.controller import metrics

    await asyncio.to_thread(_import_metrics_endpoint)
    from garrison.metrics_server import serve_metrics

    metrics.install_cluster_collector(state, clock, asyncio.get_running_loop(), engine.between_plans)
    try:
        endpoint = serve_metrics(address, metrics.registry())
    except OSError as exc:
        raise ConfigError(f"{config.path}: controller.metrics_address: cannot listen on {address}: {exc}") from None
    log.info("metrics on http://%s/metrics", address)
    return endpoint


def _import_metrics_endpoint() -> None:
    from garrison.controller import metrics
    from garrison.metrics_server import serve_metrics  # noqa: F401 - imported here, off the event loop

    metrics.registry()


def _migrate(config: GarrisonConfig) -> int:
    """garrison-controller migrate: bring the database to the newest schema; say from which revision."""
    from sqlalchemy.exc import SQLAlchemyError

    from garrison.controller.store import UnsupportedDatabaseURL, upgrade
    from garrison.controller.store.migrate import head_revision, schema_revision

    database = config.controller.database
    backend = database.split("://")[0]
    try:
        before = schema_revision(database)
        upgrade(database)
        after = schema_revision(database)
    except UnsupportedDatabaseURL as exc:
        raise ConfigError(f"{config.path}: controller.database: {exc}") from None
    except SQLAlchemyError as exc:
        # A migration runs in one transaction: a failure leaves the database as it was.
        detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        print(f"garrison-controller: migrate: database {backend}: {detail}", file=sys.stderr)
        return 1
    if before == after:
        print(f"database {backend} is at the latest schema ({after}); nothing to do")
    else:
        print(f"database {backend} migrated from {before or 'empty'} to {after} (latest: {head_revision()})")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    setup_logging("controller")
    try:
        config = load_config(args.config)
        if args.command == "migrate":
            return _migrate(config)
        asyncio.run(serve(config))
    except ConfigError as exc:
        print(f"garrison-controller: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
