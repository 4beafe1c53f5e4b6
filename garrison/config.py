"""The one TOML configuration file shared by the controller, the agents and the CLI.

Every key is validated on load; an error names the file and the key (``ConfigError``). Unknown keys are
errors too, because a misspelt setting that is silently ignored is worse than a refusal to start.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_CONFIG_PATH = Path("/etc/garrison/garrison.toml")


class ConfigError(ValueError):
    """A configuration problem, with the file and key in its one-line message."""


@dataclass(frozen=True)
class PartitionConfig:
    name: str
    nodes: tuple[str, ...] = ()  # empty: every node
    default_time_s: int = 3600
    max_time_s: int = 7 * 86400
    default: bool = False
    allowed_accounts: tuple[str, ...] = ()  # empty: any account


@dataclass(frozen=True)
class ControllerConfig:
    address: str = "127.0.0.1:6817"
    # In state_dir, the one directory the hardened systemd unit lets the controller write.
    database: str = "sqlite:////var/lib/garrison/controller/controller.db"
    # PostgreSQL connection pool (SQLite uses one connection per thread and ignores these).
    database_pool_size: int = 5
    database_max_overflow: int = 10
    database_pool_timeout_s: float = 30.0
    database_pool_recycle_s: float = 3600.0
    metrics_address: str = ""  # HOST:PORT of the Prometheus endpoint; empty: none
    state_dir: str = "/var/lib/garrison/controller"
    credential_socket: str = "/run/garrison/auth.sock"
    local_socket: str = "/run/garrison/controller.sock"  # the Controller RPCs for local clients, no grpc
    key_file: str = "/var/lib/garrison/controller/credential.key"
    credential_lifetime_s: float = 600.0
    heartbeat_interval_s: float = 5.0
    heartbeat_timeout_s: float = 30.0
    schedule_interval_s: float = 1.0
    kill_wait_s: float = 10.0
    finished_job_retention_s: float = 300.0
    allow_root_jobs: bool = False
    agent_uids: tuple[int, ...] = (0,)
    accounts: tuple[str, ...] = ("default",)
    default_account: str = "default"
    max_array_size: int = 100_000
    partitions: tuple[PartitionConfig, ...] = (PartitionConfig(name="main", default=True),)


@dataclass(frozen=True)
class AgentConfig:
    controller: str = "127.0.0.1:6817"
    node_name: str = ""  # empty: the host name
    address: str = ""  # what other ranks use as MASTER_ADDR; empty: the node name
    state_dir: str = "/var/lib/garrison/agent"
    credential_socket: str = "/run/garrison/auth.sock"
    fake_topology: str = ""  # empty: real NVML; else dgx-a100 | dgx1v | pcie4 | pcie8 | a TOML path
    metrics_address: str = ""  # HOST:PORT of the Prometheus endpoint; empty: none


@dataclass(frozen=True)
class GarrisonConfig:
    path: str
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)


def parse_duration(text: str | int | float, where: str) -> int:
    """Seconds from a number or a Slurm time string (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S)."""
    if isinstance(text, bool):
        raise ConfigError(f"{where}: expected a duration, got {text!r}")
    if isinstance(text, int | float):
        if text < 0:
            raise ConfigError(f"{where}: duration must not be negative")
        return int(text)
    try:
        days = 0
        rest = text.strip()
        if "-" in rest:
            day_text, rest = rest.split("-", 1)
            days = int(day_text)
            parts = [int(p) for p in rest.split(":")]
            if len(parts) > 3:
                raise ValueError
            hours, minutes, seconds = (parts + [0, 0, 0])[:3]
        else:
            parts = [int(p) for p in rest.split(":")]
            if len(parts) == 1:
                hours, minutes, seconds = 0, parts[0], 0
            elif len(parts) == 2:
                hours, minutes, seconds = 0, parts[0], parts[1]
            elif len(parts) == 3:
                hours, minutes, seconds = parts
            else:
                raise ValueError
        if min(days, hours, minutes, seconds) < 0:
            raise ValueError
    except ValueError:
        raise ConfigError(f"{where}: cannot parse duration {text!r}") from None
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


class _Section:
    """Reads typed keys out of one TOML table, remembering which were used."""

    def __init__(self, table: Mapping[str, Any], where: str) -> None:
        self.table = table
        self.where = where
        self.used: set[str] = set()

    def _get(self, key: str, kinds: tuple[type, ...], default: Any) -> Any:
        self.used.add(key)
        if key not in self.table:
            return default
        value = self.table[key]
        if isinstance(value, bool) and bool not in kinds:
            raise ConfigError(f"{self.where}.{key}: expected {kinds[0].__name__}, got {value!r}")
        if not isinstance(value, kinds):
            raise ConfigError(f"{self.where}.{key}: expected {kinds[0].__name__}, got {value!r}")
        return value

    def get_str(self, key: str, default: str) -> str:
        return str(self._get(key, (str,), default))

    def get_bool(self, key: str, default: bool) -> bool:
        return bool(self._get(key, (bool,), default))

    def get_number(self, key: str, default: float, minimum: float = 0.0) -> float:
        value = float(self._get(key, (int, float), default))
        if value < minimum:
            raise ConfigError(f"{self.where}.{key}: must be at least {minimum}")
        return value

    def get_int(self, key: str, default: int, minimum: int = 0) -> int:
        value = int(self._get(key, (int,), default))
        if value < minimum:
            raise ConfigError(f"{self.where}.{key}: must be at least {minimum}")
        return value

    def get_duration(self, key: str, default: int) -> int:
        self.used.add(key)
        if key not in self.table:
            return default
        return parse_duration(self.table[key], f"{self.where}.{key}")

    def get_str_list(self, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = self._get(key, (list,), None)
        if value is None:
            return default
        if not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{self.where}.{key}: expected a list of strings")
        return tuple(value)

    def get_int_list(self, key: str, default: tuple[int, ...]) -> tuple[int, ...]:
        value = self._get(key, (list,), None)
        if value is None:
            return default
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{self.where}.{key}: expected a list of integers")
        return tuple(value)

    def finish(self) -> None:
        unknown = sorted(set(self.table) - self.used)
        if unknown:
            raise ConfigError(f"{self.where}.{unknown[0]}: unknown setting")


def _partition(table: Any, where: str) -> PartitionConfig:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table")
    s = _Section(table, where)
    name = s.get_str("name", "")
    if not name:
        raise ConfigError(f"{where}.name: a partition needs a name")
    part = PartitionConfig(
        name=name,
        nodes=s.get_str_list("nodes", ()),
        default_time_s=s.get_duration("default_time", 3600),
        max_time_s=s.get_duration("max_time", 7 * 86400),
        default=s.get_bool("default", False),
        allowed_accounts=s.get_str_list("allowed_accounts", ()),
    )
    s.finish()
    if part.default_time_s <= 0 or part.max_time_s <= 0:
        raise ConfigError(f"{where}: time limits must be positive")
    if part.default_time_s > part.max_time_s:
        raise ConfigError(f"{where}.default_time: longer than max_time")
    return part


def _controller(table: Mapping[str, Any], where: str) -> ControllerConfig:
    d = ControllerConfig()
    s = _Section(table, where)
    raw_partitions = s._get("partitions", (list,), None)
    partitions = d.partitions
    if raw_partitions is not None:
        partitions = tuple(_partition(t, f"{where}.partitions[{i}]") for i, t in enumerate(raw_partitions))
        if not partitions:
            raise ConfigError(f"{where}.partitions: at least one partition is needed")
        names = [p.name for p in partitions]
        if len(set(names)) != len(names):
            raise ConfigError(f"{where}.partitions: duplicate partition name")
        if sum(p.default for p in partitions) > 1:
            raise ConfigError(f"{where}.partitions: more than one default partition")
    accounts = s.get_str_list("accounts", d.accounts)
    cfg = ControllerConfig(
        address=s.get_str("address", d.address),
        database=s.get_str("database", d.database),
        database_pool_size=s.get_int("database_pool_size", d.database_pool_size, 1),
        database_max_overflow=s.get_int("database_max_overflow", d.database_max_overflow),
        database_pool_timeout_s=s.get_number("database_pool_timeout_s", d.database_pool_timeout_s, 0.1),
        database_pool_recycle_s=s.get_number("database_pool_recycle_s", d.database_pool_recycle_s, 1.0),
        metrics_address=s.get_str("metrics_address", d.metrics_address),
        state_dir=s.get_str("state_dir", d.state_dir),
        credential_socket=s.get_str("credential_socket", d.credential_socket),
        local_socket=s.get_str("local_socket", d.local_socket),
        key_file=s.get_str("key_file", d.key_file),
        credential_lifetime_s=s.get_number("credential_lifetime_s", d.credential_lifetime_s, 1.0),
        heartbeat_interval_s=s.get_number("heartbeat_interval_s", d.heartbeat_interval_s, 0.05),
        heartbeat_timeout_s=s.get_number("heartbeat_timeout_s", d.heartbeat_timeout_s, 0.1),
        schedule_interval_s=s.get_number("schedule_interval_s", d.schedule_interval_s, 0.01),
        kill_wait_s=s.get_number("kill_wait_s", d.kill_wait_s),
        finished_job_retention_s=s.get_number("finished_job_retention_s", d.finished_job_retention_s),
        allow_root_jobs=s.get_bool("allow_root_jobs", d.allow_root_jobs),
        agent_uids=s.get_int_list("agent_uids", d.agent_uids),
        accounts=accounts,
        default_account=s.get_str("default_account", d.default_account),
        max_array_size=s.get_int("max_array_size", d.max_array_size, 1),
        partitions=partitions,
    )
    s.finish()
    if cfg.default_account not in cfg.accounts:
        raise ConfigError(f"{where}.default_account: {cfg.default_account!r} is not in accounts")
    if cfg.heartbeat_timeout_s <= cfg.heartbeat_interval_s:
        raise ConfigError(f"{where}.heartbeat_timeout_s: must exceed heartbeat_interval_s")
    _check_address(cfg.address, f"{where}.address")
    if cfg.metrics_address:
        _check_address(cfg.metrics_address, f"{where}.metrics_address")
    return cfg


def _agent(table: Mapping[str, Any], where: str) -> AgentConfig:
    d = AgentConfig()
    s = _Section(table, where)
    cfg = AgentConfig(
        controller=s.get_str("controller", d.controller),
        node_name=s.get_str("node_name", d.node_name),
        address=s.get_str("address", d.address),
        state_dir=s.get_str("state_dir", d.state_dir),
        credential_socket=s.get_str("credential_socket", d.credential_socket),
        fake_topology=s.get_str("fake_topology", d.fake_topology),
        metrics_address=s.get_str("metrics_address", d.metrics_address),
    )
    s.finish()
    _check_address(cfg.controller, f"{where}.controller")
    if cfg.metrics_address:
        _check_address(cfg.metrics_address, f"{where}.metrics_address")
    return cfg


def _check_address(address: str, where: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{where}: expected HOST:PORT, got {address!r}")


def parse_config(data: Mapping[str, Any], path: str) -> GarrisonConfig:
    unknown = sorted(set(data) - {"controller", "agent"})
    if unknown:
        raise ConfigError(f"{path}: {unknown[0]}: unknown section")
    try:
        controller = _controller(data.get("controller", {}), "controller")
        agent = _agent(data.get("agent", {}), "agent")
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return GarrisonConfig(path=path, controller=controller, agent=agent)


# Environment variables that override one setting of the file (the file's value, or the default, otherwise).
# For the settings that differ between otherwise identical hosts or containers.
ENV_OVERRIDES: dict[str, tuple[str, str]] = {
    "GARRISON_DATABASE": ("controller", "database"),
    "GARRISON_CONTROLLER_ADDRESS": ("controller", "address"),
    "GARRISON_CONTROLLER_METRICS_ADDRESS": ("controller", "metrics_address"),
    "GARRISON_AGENT_CONTROLLER": ("agent", "controller"),
    "GARRISON_NODE_NAME": ("agent", "node_name"),
    "GARRISON_AGENT_ADDRESS": ("agent", "address"),
    "GARRISON_AGENT_METRICS_ADDRESS": ("agent", "metrics_address"),
}


def apply_env_overrides(
    data: Mapping[str, Any], environ: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """``data`` with the settings named by ``ENV_OVERRIDES`` replaced from ``environ`` (set and non-empty),
    and which variable set which key (``{"controller.database": "GARRISON_DATABASE"}``)."""
    merged: dict[str, Any] = dict(data)
    origins: dict[str, str] = {}
    for variable, (section, key) in ENV_OVERRIDES.items():
        value = environ.get(variable)
        if not value:
            continue
        table = merged.get(section, {})
        if not isinstance(table, dict):
            continue  # parse_config reports the malformed section itself
        merged[section] = {**table, key: value}
        origins[f"{section}.{key}"] = variable
    return merged, origins


def load_config(path: str | Path, environ: Mapping[str, str] = os.environ) -> GarrisonConfig:
    import tomllib  # here, not at the top: the CLI usually finds the controller without reading a file

    path = Path(path)
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: configuration file not found") from None
    except PermissionError:
        raise ConfigError(f"{path}: permission denied") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    data, origins = apply_env_overrides(data, environ)
    try:
        return parse_config(data, str(path))
    except ConfigError as exc:
        # A bad value that came from the environment: say so, or the admin searches the file in vain.
        for key, variable in origins.items():
            if f": {key}:" in str(exc):
                raise ConfigError(f"{exc} (set by the environment variable {variable})") from None
        raise


def config_path_from_env(environ: Mapping[str, str] = os.environ) -> Path:
    return Path(environ.get("GARRISON_CONFIG") or DEFAULT_CONFIG_PATH)


def controller_address_from_env(environ: Mapping[str, str] = os.environ) -> str:
    """Where the CLI finds the controller: GARRISON_CONTROLLER, else the config file's address."""
    address = environ.get("GARRISON_CONTROLLER")
    if address:
        return address
    return load_config(config_path_from_env(environ)).controller.address
