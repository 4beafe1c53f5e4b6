"""garrison-agent: the per-node daemon (GPU discovery, job launch under supervisors, link to the controller)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from pathlib import Path
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
    parser.add_argument("--check", action="store_true",
                        help="Print what this node can enforce on jobs (cgroup controllers) and exit: 0 if the agent "
                             "would start, 1 if it would refuse to.")
    return parser.parse_args(argv)


def _check(config: GarrisonConfig) -> int:
    """garrison-agent --check: what containment this host allows, and whether the agent would start."""
    from garrison.nodeagent.containment import probe

    containment = probe.probe(config.agent.cgroup_root)
    for line in probe.report(containment.capabilities):
        print(line)
    if containment.capabilities.confined:
        return 0
    if config.agent.allow_unconfined:
        print("jobs would run unconfined (allow_unconfined = true)")
        return 0
    print("the agent would refuse to start: nothing can be enforced and allow_unconfined is false")
    return 1


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
        if args.check:
            return _check(config)
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
            from garrison.nodeagent.fakehost import take_node_name

            if take_node_name(node_name):  # before any thread: see fakehost.py
                log.info("node %s: its jobs see %s as their host name", node_name, node_name)
            try:
                path = resolve_topology(cfg.fake_topology)
                description = load_description(path)
            except ValueError as exc:
                raise ConfigError(f"{config.path}: agent.fake_topology: {exc}") from None
            fake_nvml.install_fake_nvml(description, node_name)
            model = str(description.get("name", ""))
        inventory = discovery.discover(node_name)
        from dataclasses import replace

        from garrison.nodeagent.containment import probe

        try:
            containment = probe.choose(cfg.cgroup_root, cfg.allow_unconfined)
        except probe.NothingEnforceable as exc:
            raise ConfigError(str(exc)) from None
        if cfg.fake_topology and cfg.fake_cpus:
            inventory = replace(inventory, cpus=cfg.fake_cpus)
        inventory = replace(inventory, model=model, features=cfg.features,
                            containment=containment.capabilities.summary())
        log.info("node %s: %d GPUs (%s)", node_name, len(inventory.gpus), model or "NVML")
        log.info("node %s: containment %s", node_name, containment.capabilities.summary())
        for check in containment.capabilities.checks:
            if not check.usable:
                log.warning("node %s: %s not enforced: %s", node_name, check.name, check.detail)

        from garrison.trusted_paths import UntrustedPath, ensure_trusted_dir

        try:
            # Job users traverse it to their attempt's script and files (0755; each attempt's dir is 0711).
            ensure_trusted_dir(Path(cfg.state_dir), "agent.state_dir", mode=0o755)
        except UntrustedPath as exc:
            raise ConfigError(f"{config.path}: {exc}") from None
        from garrison.nodeagent.agent import Agent
        from garrison.nodeagent.gpu.minors import device_minors

        minors = device_minors(gpu.index for gpu in inventory.gpus)
        agent = Agent(cfg, node_name, inventory, config.controller.allow_root_jobs, containment, minors)
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
