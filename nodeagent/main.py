"""garrison-agent: the per-node daemon (GPU discovery, job launch under supervisors, link to the controller)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from typing import TYPE_CHECKING

from garrison.config import ConfigError, GarrisonConfig, load_config
from garrison.logs import setup_logging

if TYPE_CHECKING:
    from garrison.metrics_server import MetricsEndpoint

log = logging.getLogger("garrison.agent")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="garrison-agent",
        description="Garrison node agent: discovers GPUs through NVML and runs job ranks for the controller.",
    )
    parser.add_argument("--config", default=os.environ.get("GARRISON_CONFIG", "/etc/garrison/garrison.toml"),
                        help="TOML configuration file (default: $GARRISON_CONFIG or /etc/garrison/garrison.toml)")
    return parser.parse_args(argv)


async def _run(agent) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.stop)
    await agent.run()


def _serve_metrics(config: GarrisonConfig, node_name: str) -> MetricsEndpoint | None:
    """The Prometheus endpoint on [agent] metrics_address, if set: GPUs through NVML and the jobs here."""
    address = config.agent.metrics_address
    if not address:
        return None
    from pathlib import Path

    from garrison.metrics_server import serve_metrics
    from garrison.nodeagent.metrics import node_registry

    registry = node_registry(node_name, Path(config.agent.state_dir) / "jobs")
    try:
        endpoint = serve_metrics(address, registry)
    except OSError as exc:
        raise ConfigError(f"{config.path}: agent.metrics_address: cannot listen on {address}: {exc}") from None
    log.info("metrics on http://%s/metrics", address)
    return endpoint


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    setup_logging("agent")
    try:
        config = load_config(args.config)
        cfg = config.agent
        from garrison.tls import TlsError, check_agent_transport

        try:
            check_agent_transport(cfg.controller, cfg.tls_cert)
        except TlsError as exc:
            raise ConfigError(f"{config.path}: agent.controller: {exc}") from None
        node_name = cfg.node_name or socket.gethostname()
        model = ""
        from garrison.machines.description import load_description, resolve_topology
        from garrison.nodeagent.gpu import discovery, fake_nvml

        if cfg.fake_topology:
            try:
                path = resolve_topology(cfg.fake_topology)
                description = load_description(path)
            except ValueError as exc:
                raise ConfigError(f"{config.path}: agent.fake_topology: {exc}") from None
            fake_nvml.install_fake_nvml(description, node_name)
            model = str(description.get("name", ""))
        inventory = discovery.discover(node_name)
        if model or cfg.features:
            from dataclasses import replace

            inventory = replace(inventory, model=model, features=cfg.features)
        log.info("node %s: %d GPUs (%s)", node_name, len(inventory.gpus), model or "NVML")

        from garrison.nodeagent.agent import Agent

        agent = Agent(cfg, node_name, inventory, config.controller.allow_root_jobs)
        metrics_endpoint = _serve_metrics(config, node_name)
        try:
            asyncio.run(_run(agent))
        finally:
            if metrics_endpoint is not None:
                metrics_endpoint.stop()
    except ConfigError as exc:
        print(f"garrison-agent: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
