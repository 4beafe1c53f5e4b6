"""garrison up / down: a whole local cluster (controller + agents with fake GPUs) in one directory.

`up` writes the configuration on first use and reuses it afterwards, so a second `up` on a partly dead
directory restarts only the dead daemons, at the same addresses.

Agent N is node ``nodeN`` at its own loopback address 127.0.1.N (cli/hostsfile.py). As root, `up` gives
those names to /etc/hosts in a block of this cluster's own, so that a script taking MASTER_ADDR from
$SLURM_JOB_NODELIST resolves it; `down` removes the block.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TextIO

import click

from garrison.cli.client import Client, CliError, fail
from garrison.cli.hostsfile import node_address, update_hosts
from garrison.config import ConfigError, load_config
from garrison.slurmpath import ensure_slurm_path, slurm_path_dir

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
DEFAULT_TOPOLOGY = "dgx-a100"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _toml_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _controller_section(state_dir: Path, port: int, allow_root: bool, database: str | None = None) -> str:
    agent_uids = sorted({0, os.getuid()})
    return "\n".join(
        [
            "[controller]",
            f"address = {_toml_str(f'127.0.0.1:{port}')}",
            f"database = {_toml_str(database or 'sqlite:///' + str(state_dir / 'controller.db'))}",
            f"state_dir = {_toml_str(str(state_dir / 'controller'))}",
            f"credential_socket = {_toml_str(str(state_dir / 'auth.sock'))}",
            f"local_socket = {_toml_str(str(state_dir / 'controller.sock'))}",
            f"key_file = {_toml_str(str(state_dir / 'controller' / 'credential.key'))}",
            "heartbeat_interval_s = 1.0",
            "heartbeat_timeout_s = 10.0",
            # A local cluster's node lease: a silent node's jobs move on 15 + 5 + 3 s after it fell silent.
            "node_lease_s = 15.0",
            "kill_wait_s = 5.0",
            "finished_job_retention_s = 600.0",
            f"allow_root_jobs = {'true' if allow_root else 'false'}",
            f"agent_uids = [{', '.join(str(u) for u in agent_uids)}]",
            "",
        ]
    )


# The node features (sbatch -C) a fake node of each built-in machine gets: its GPU model, as sites commonly
# name them, and its GPU interconnect. A machine description given as a file gets none.
FAKE_NODE_FEATURES = {
    "dgx-a100": ("a100", "nvswitch"),
    "dgx1v": ("v100", "nvlink"),
    "pcie4": ("a6000",),
    "pcie8": ("l40s",),
}


def local_cgroup_root(state_dir: Path, node: int) -> str:
    """garrison-up/<the state dir's name and a hash of its path>/node<N>: unique per cluster and node."""
    import hashlib

    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:8]
    return f"garrison-up/{state_dir.resolve().name}-{digest}/node{node}"


def _leading_keys(extra: str) -> list[str]:
    """The ``key = value`` lines of ``extra`` before its first table header."""
    keys = []
    for line in extra.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            break
        if "=" in stripped and not stripped.startswith("#"):
            keys.append(stripped)
    return keys


def _write_configs(state_dir: Path, topologies: list[str], database: str | None = None, extra: str = "",
                   fake_cpus: int = 0) -> None:
    allow_root = os.geteuid() == 0
    controller = _controller_section(state_dir, _free_port(), allow_root, database)
    if extra:
        # Keys before its first table are [controller] keys: one that garrison up also sets (its 1 s heartbeat,
        # say) is taken from the extra file instead, since TOML refuses a key given twice. Then tables such as
        # [controller.scheduler] or [[controller.qos]], after the [controller] keys.
        given = {line.split("=", 1)[0].strip() for line in _leading_keys(extra)}
        controller = "\n".join(line for line in controller.split("\n")
                               if "=" not in line or line.split("=", 1)[0].strip() not in given)
        controller += "\n" + extra.rstrip() + "\n"
    (state_dir / "garrison.toml").write_text(controller)
    for i, topology in enumerate(topologies, start=1):
        topo = topology if topology in ("dgx-a100", "dgx1v", "pcie4", "pcie8") else str(Path(topology).resolve())
        agent = "\n".join(
            [
                "[agent]",
                f"controller = {_toml_str(_address(state_dir))}",
                f"node_name = {_toml_str(f'node{i}')}",
                f"address = {_toml_str(node_address(i))}",
                f"state_dir = {_toml_str(str(state_dir / f'agent-{i}'))}",
                f"credential_socket = {_toml_str(str(state_dir / 'auth.sock'))}",
                f"fake_topology = {_toml_str(topo)}",
                f"fake_cpus = {fake_cpus}",
                f"features = [{', '.join(_toml_str(f) for f in FAKE_NODE_FEATURES.get(topo, ()))}]",
                # Each local cluster and node its own cgroup subtree (clusters side by side never share
                # one); a developer's machine without writable cgroups still runs the jobs, unconfined.
                f"cgroup_root = {_toml_str(local_cgroup_root(state_dir, i))}",
                "allow_unconfined = true",
                "",
            ]
        )
        (state_dir / f"agent-{i}.toml").write_text(controller + "\n" + agent)


def _address(state_dir: Path) -> str:
    return load_config(state_dir / "garrison.toml").controller.address


def _pid_alive(pid_file: Path, marker: str) -> int | None:
    """The pid in pid_file if that process is alive and really is our daemon (pids get reused)."""
    try:
        pid = int(pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError):
        return None
    # A process still inside execve (Popen returns as soon as the child's exec has begun) shows an empty
    # command line for a moment: that is the daemon we have just started, not a stranger.
    if cmdline.strip() and marker not in cmdline:
        return None
    try:
        with open(f"/proc/{pid}/stat") as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                return None
    except OSError:
        return None
    return pid


def _start(args: list[str], log_path: Path, pid_file: Path) -> int:
    env = dict(os.environ)
    env.pop("NOTIFY_SOCKET", None)
    # A daemon's log names users, jobs and refused requests: its user's alone.
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with open(log_fd, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            env=env,
        )
    pid_file.write_text(f"{proc.pid}\n")
    return proc.pid


def _wait_for(what: str, check, deadline: float) -> None:  # type: ignore[no-untyped-def]
    delay = 0.02
    while True:
        if check():
            return
        if time.monotonic() > deadline:
            raise CliError(f"timed out waiting for {what}")
        time.sleep(delay)  # polling an external process with backoff, bounded by the deadline
        delay = min(delay * 1.5, 0.5)


def _agent_configs(state_dir: Path) -> list[Path]:
    return sorted(state_dir.glob("agent-*.toml"), key=lambda p: int(p.stem.split("-")[1]))


def _check_database_url(url: str) -> None:
    # Only the shape: the CLI stays free of SQLAlchemy, and the controller reports what it cannot open.
    if not url.startswith(("sqlite:///", "postgresql://", "postgresql+psycopg://")):
        raise CliError(
            f"--database {url!r}: expected sqlite:///PATH or postgresql+psycopg://USER@HOST:PORT/DATABASE", 2
        )


def _check_state_dir(state_dir: Path) -> None:
    """The state dir holds the cluster's keys, database and sockets: never one another user made first (a
    key of theirs in it would let them forge root's credentials). Created here if missing, 0755 so that job
    users reach the sockets and their attempts' files; each daemon checks its own paths again at start."""
    from garrison.trusted_paths import UntrustedPath, ensure_trusted_dir

    try:
        ensure_trusted_dir(state_dir, "--state-dir", mode=0o755)
        for inner in ("controller", *(p.stem for p in _agent_configs(state_dir))):
            if os.path.lexists(state_dir / inner):
                ensure_trusted_dir(state_dir / inner, "--state-dir's")
    except UntrustedPath as exc:
        raise CliError(str(exc)) from None


def cluster_up(
    state_dir: Path, agents: int | None, topologies: list[str], database: str | None = None, extra_config: str = "",
    fake_cpus: int = 0,
) -> str:
    state_dir = state_dir.resolve()
    if database is not None:
        _check_database_url(database)
        configured = state_dir / "garrison.toml"
        if configured.exists() and load_config(configured).controller.database != database:
            raise CliError(f"{configured} already uses another database; garrison down and use a new --state-dir "
                           "to change it", 2)
    _check_state_dir(state_dir)
    if len(str(state_dir / "auth.sock")) > 100:
        raise CliError(f"state dir path too long for a Unix socket: {state_dir}")
    if not (state_dir / "garrison.toml").exists():
        count = agents if agents is not None else (len(topologies) if len(topologies) > 1 else 2)
        if len(topologies) > 1 and len(topologies) != count:
            raise CliError(f"--fake-topology given {len(topologies)} times for {count} agents", 2)
        names = topologies if len(topologies) == count else [topologies[0] if topologies else DEFAULT_TOPOLOGY] * count
        from garrison.machines.description import resolve_topology

        for name in names:
            try:
                resolve_topology(name)
            except ValueError as exc:
                raise CliError(str(exc), 2) from None
        _write_configs(state_dir, names, database, extra_config, fake_cpus)
        try:
            load_config(state_dir / "garrison.toml")
        except ConfigError as exc:
            (state_dir / "garrison.toml").unlink()
            raise CliError(f"--extra-config: {exc}", 2) from None
    config = state_dir / "garrison.toml"
    if os.geteuid() == 0:
        print(f"garrison up: running as root: jobs may run as root on this local cluster "
              f"(allow_root_jobs = true in {config})", file=sys.stderr)
    address = _address(state_dir)
    deadline = time.monotonic() + READY_TIMEOUT_S
    if _pid_alive(state_dir / "controller.pid", str(config)) is None:
        _start(["-m", "garrison.controller.main", "--config", str(config)],
               state_dir / "controller.log", state_dir / "controller.pid")

    def controller_ready() -> bool:
        if _pid_alive(state_dir / "controller.pid", str(config)) is None:
            raise CliError(f"the controller exited; see {state_dir / 'controller.log'}")
        return Path(load_config(config).controller.credential_socket).exists() and _answers_hello(address)

    # Agents started before the controller serves would only retry with backoff, slowing `up` down.
    _wait_for("the controller to serve", controller_ready, deadline)
    agent_configs = _agent_configs(state_dir)
    for agent_config in agent_configs:
        name = agent_config.stem
        if _pid_alive(state_dir / f"{name}.pid", str(agent_config)) is None:
            _start(["-m", "garrison.nodeagent.main", "--config", str(agent_config)],
                   state_dir / f"{name}.log", state_dir / f"{name}.pid")
    wanted = {f"node{p.stem.split('-')[1]}" for p in agent_configs}

    def all_registered() -> bool:
        if _pid_alive(state_dir / "controller.pid", str(config)) is None:
            raise CliError(f"the controller exited; see {state_dir / 'controller.log'}")
        try:
            with Client(address) as client:
                from garrison.protos.v1 import garrison_pb2 as pb

                nodes = client.call("ListNodes", pb.ListNodesRequest()).nodes
        except CliError:
            return False
        up = {n.name for n in nodes if n.state in ("UP", "DRAIN")}
        return wanted <= up

    _wait_for("every agent to register", all_registered, deadline)
    _name_nodes(state_dir, agent_configs)
    return address


def _node_names(agent_configs: list[Path]) -> list[tuple[str, str]]:
    return [(node_address(int(p.stem.split("-")[1])), f"node{p.stem.split('-')[1]}") for p in agent_configs]


def _name_nodes(state_dir: Path, agent_configs: list[Path]) -> None:
    """As root, this cluster's block in /etc/hosts; otherwise say once that the names will not resolve."""
    entries = _node_names(agent_configs)
    if os.geteuid() != 0:
        names = ", ".join(name for _, name in entries)
        print(f"garrison up: not root: node names ({names}) will not resolve here (no /etc/hosts entries); "
              "jobs get their head node's address in MASTER_ADDR", file=sys.stderr)
        return
    try:
        update_hosts(state_dir, entries)
    except OSError as exc:
        raise CliError(f"cannot write the node names to /etc/hosts: {exc}") from None


def _answers_hello(address: str) -> bool:
    import grpc

    from garrison.protos.v1 import garrison_pb2 as pb
    from garrison.protos.v1 import garrison_pb2_grpc as pb_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            pb_grpc.ControllerStub(channel).Hello(pb.HelloRequest(), timeout=1.0)
        except grpc.RpcError:
            return False
    return True


def _stop_pid(pid_file: Path, marker: str) -> None:
    pid = _pid_alive(pid_file, marker)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        try:
            _wait_for(f"pid {pid} to exit", lambda: _pid_alive(pid_file, marker) is None,
                      time.monotonic() + STOP_TIMEOUT_S)
        except CliError:
            os.kill(pid, signal.SIGKILL)
    pid_file.unlink(missing_ok=True)


def cluster_down(state_dir: Path) -> None:
    state_dir = state_dir.resolve()
    if not (state_dir / "garrison.toml").exists():
        raise CliError(f"{state_dir} holds no local cluster (no garrison.toml)")
    agent_configs = _agent_configs(state_dir)
    for agent_config in agent_configs:
        _stop_pid(state_dir / f"{agent_config.stem}.pid", str(agent_config))
    if agent_configs:
        _kill_leftover_jobs(agent_configs)
    _stop_pid(state_dir / "controller.pid", str(state_dir / "garrison.toml"))
    if os.geteuid() == 0:
        try:
            update_hosts(state_dir, [])
        except OSError as exc:
            raise CliError(f"cannot remove the node names from /etc/hosts: {exc}") from None


def _kill_leftover_jobs(agent_configs: list[Path]) -> None:
    """Jobs outlive a stopped agent by design; a torn-down cluster must not. The agent's own program kills
    them (the CLI does not import the agent), once every agent is stopped."""
    done = subprocess.run(
        [sys.executable, "-m", "garrison.nodeagent.leftovers", *map(str, agent_configs)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise CliError(f"killing the stopped agents' jobs failed: {done.stderr.strip() or done.returncode}")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def garrison() -> None:
    """Garrison local cluster management."""


@garrison.command()
@click.option("--state-dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory for the cluster's configuration, database, logs and pid files.")
@click.option("--agents", type=click.IntRange(1, 64), default=None, help="Number of agents (default 2).")
@click.option("--fake-topology", "topologies", multiple=True,
              help="dgx-a100, dgx1v, pcie4, pcie8 or a TOML file: once for all agents, or once per agent.")
@click.option("--database", default=None, metavar="URL",
              help="The controller's database (default: SQLite in the state dir), e.g. "
                   "postgresql+psycopg://postgres@127.0.0.1:5432/garrison; used when the state dir is new.")
@click.option("--extra-config", "extra_config", default=None, type=click.File("r"), metavar="FILE",
              help="TOML added to the controller configuration written for a new state dir: [controller] "
                   "keys first (one garrison up sets itself, e.g. heartbeat_interval_s, is replaced), then "
                   "tables, e.g. [controller.scheduler] preemption = true, or [[controller.qos]] entries.")
@click.option("--fake-cpus", type=click.IntRange(0, 4096), default=0, metavar="N",
              help="CPUs each fake node offers (default: the host's), for scripts written for bigger nodes; "
                   "jobs are still bound to the CPUs the host has. Used when the state dir is new.")
def up(state_dir: Path, agents: int | None, topologies: tuple[str, ...], database: str | None,
       extra_config: TextIO | None, fake_cpus: int) -> None:
    """Start (or restart what is dead of) a local cluster and print its export line."""
    try:
        extra = extra_config.read() if extra_config is not None else ""
        address = cluster_up(state_dir, agents, list(topologies), database, extra, fake_cpus)
    except CliError as exc:
        fail("garrison up", exc)
    click.echo(f"export GARRISON_CONTROLLER={address}")


@garrison.command()
@click.option("--state-dir", required=True, type=click.Path(file_okay=False, path_type=Path))
def down(state_dir: Path) -> None:
    """Stop a local cluster's daemons and their jobs."""
    try:
        cluster_down(state_dir)
    except CliError as exc:
        fail("garrison down", exc)


@garrison.command("slurm-path")
def slurm_path() -> None:
    """Print the directory of Slurm's command names (sbatch, srun, squeue, ...) for a PATH:
    export PATH="$(garrison slurm-path):$PATH"."""
    directory = ensure_slurm_path()
    if directory is None:
        click.echo(f"garrison slurm-path: {slurm_path_dir()} does not exist and cannot be made by this user "
                   "(an admin runs `garrison slurm-path` once after installing)", err=True)
        sys.exit(1)
    click.echo(str(directory))


def main() -> None:
    garrison(prog_name="garrison")


if __name__ == "__main__":
    main()
