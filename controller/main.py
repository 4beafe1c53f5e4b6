"""garrison-controller: the central daemon (gRPC for clients and agents, the queue, the scheduler)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from garrison.config import ConfigError, GarrisonConfig, load_config
from garrison.logs import setup_logging

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
    import grpc

    from garrison.auth import CredentialService, load_or_create_key
    from garrison.controller.clock import SystemClock
    from garrison.controller.engine import Engine
    from garrison.controller.rpc.local import LocalServer
    from garrison.controller.rpc.services import AgentLinkService, Authenticator, ControllerService
    from garrison.controller.state import ClusterState
    from garrison.controller.store import open_store
    from garrison.protos.v1 import garrison_pb2_grpc as pb_grpc

    cfg = config.controller
    Path(cfg.state_dir).mkdir(parents=True, exist_ok=True)
    clock = SystemClock()
    store = open_store(cfg.database)
    state = ClusterState(store, cfg.heartbeat_timeout_s)
    state.load(clock.now(), cfg.finished_job_retention_s)
    key = load_or_create_key(Path(cfg.key_file))
    credentials = CredentialService(cfg.credential_socket, key, lifetime_s=cfg.credential_lifetime_s)
    credentials.start()

    engine = Engine(cfg, state, clock)
    auth = Authenticator(key, clock.now)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    client_service = ControllerService(engine, auth, cfg.credential_socket, cfg.local_socket)
    pb_grpc.add_ControllerServicer_to_server(client_service, server)
    pb_grpc.add_AgentLinkServicer_to_server(AgentLinkService(engine, auth, set(cfg.agent_uids)), server)
    port = server.add_insecure_port(cfg.address)
    if port == 0:
        raise ConfigError(f"{config.path}: controller.address: cannot listen on {cfg.address}")
    await server.start()
    local = LocalServer(cfg.local_socket, client_service) if cfg.local_socket else None
    if local is not None:
        await local.start()
    engine.start()
    log.info("controller listening on %s (database %s)", cfg.address, cfg.database.split("://")[0])
    _notify_ready()

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("controller stopping")
    if local is not None:
        await local.stop()
    await engine.stop()
    await server.stop(grace=1.0)
    credentials.stop()
    store.close()


def _notify_ready() -> None:
    """sd_notify READY=1 when run by systemd as Type=notify (no libsystemd needed)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    import socket

    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(b"READY=1", address)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    setup_logging("controller")
    try:
        config = load_config(args.config)
        if args.command == "migrate":
            from garrison.controller.store import upgrade

            upgrade(config.controller.database)
            print(f"database {config.controller.database.split('://')[0]} is at the latest schema")
            return 0
        asyncio.run(serve(config))
    except ConfigError as exc:
        print(f"garrison-controller: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
