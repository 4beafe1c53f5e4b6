"""The one TOML configuration file shared by the controller, the agents and the CLI.

Every key is validated on load; an error names the file and the key (``ConfigError``). Unknown keys are
errors too, because a misspelt setting that is silently ignored is worse than a refusal to start.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
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
    allowed_qos: tuple[str, ...] = ()  # empty: any QoS
    priority: int = 0  # the partition priority factor (scaled against the highest partition priority)


# -- Scheduling policy seeds (the scheduling issue): read on the controller's first start into the store,
#    then managed with gadmin. See docs/admin.md, "Scheduling policy".


@dataclass(frozen=True)
class AccountConfig:
    name: str
    parent: str = ""  # empty: a top-level account
    shares: int = 1
    allowed_qos: tuple[str, ...] = ()
    description: str = ""


@dataclass(frozen=True)
class UserConfig:
    name: str
    accounts: tuple[str, ...]
    default_account: str = ""  # empty: the first of accounts
    shares: int = 1
    coordinator_of: tuple[str, ...] = ()


@dataclass(frozen=True)
class QuotaConfig:
    account: str = ""  # exactly one of account and user
    user: str = ""
    max_gpus: int | None = None
    max_jobs: int | None = None
    max_gpu_hours: float | None = None


@dataclass(frozen=True)
class QosConfig:
    name: str
    priority: int = 0
    preempts: tuple[str, ...] = ()
    max_gpus_per_user: int | None = None
    max_jobs_per_user: int | None = None
    max_time_s: int | None = None
    grace_s: int = 60


@dataclass(frozen=True)
class SwitchConfig:
    """One network switch, like a SwitchName line of Slurm's topology.conf: leaf switches list nodes,
    upper ones list switches."""

    name: str
    nodes: tuple[str, ...] = ()
    switches: tuple[str, ...] = ()


DEFAULT_QOS = (
    QosConfig("low", priority=0),
    QosConfig("normal", priority=10),
    QosConfig("high", priority=20, preempts=("low",)),
    QosConfig("urgent", priority=40, preempts=("low", "normal")),
)


# Every preset's bounds of the time-limit priority factor (controller/sched/priority.py PriorityWeights; a
# test keeps them equal). Repeated here so reading a config file never imports the scheduling core.
PRESET_TIME_LIMIT_SHORT_S = 3600
PRESET_TIME_LIMIT_LONG_S = 7 * 86400


@dataclass(frozen=True)
class SchedulerSettings:
    """[controller.scheduler]: the scheduling core's tunables (controller/sched/cycle.py SchedulerConfig)."""

    policy: str = "garrison"  # the preset the settings below start from: fifo | fifo-easy | garrison
    priority_weight_age: int | None = None  # None: the preset's value
    priority_weight_fairshare: int | None = None
    priority_weight_qos: int | None = None
    priority_weight_job_size: int | None = None
    priority_weight_partition: int | None = None
    priority_weight_time_limit: int | None = None
    priority_max_age_s: int | None = None  # None: the preset's
    priority_time_limit_short_s: int | None = None
    priority_time_limit_long_s: int | None = None
    fairshare_half_life_s: int = 7 * 86400
    quota_period_s: int = 30 * 86400
    backfill: bool | None = None
    backfill_reservations: int | None = None
    backfill_max_job_test: int = 500
    backfill_window_s: int = 2 * 86400
    backfill_resolution_s: int = 60
    max_starts_per_cycle: int = 10_000
    preemption: bool = False
    usage_save_interval_s: float = 30.0


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
    # Security (docs/security.md). TLS: all three files or none; with them, agents must use agent_address
    # (mutual TLS) and plain text is refused. Without them, only loopback addresses are allowed.
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    agent_address: str = ""  # HOST:PORT where agents connect with their node certificates (TLS only)
    # Revoked agent certificates (gadmin cert revoke); empty: the file "revoked" next to tls_ca.
    tls_revoked_agents: str = ""
    token_key_file: str = ""  # empty: state_dir/token.key (created 0600 on first start)
    token_max_lifetime_s: int = 365 * 86400
    request_rate_per_s: float = 50.0  # per user, sustained; 0: unlimited
    request_burst: int = 200  # per user, at once
    auth_failure_rate_per_s: float = 5.0  # failed authentications per peer host, sustained; 0: unlimited
    auth_failure_burst: int = 50  # per peer host, at once
    partitions: tuple[PartitionConfig, ...] = (PartitionConfig(name="main", default=True),)
    # Scheduling policy (docs/admin.md, "Scheduling policy"); accounts above lists every account's name.
    admins: tuple[str, ...] = ()  # users who may run gadmin (besides root and the controller's own user)
    admin_groups: tuple[str, ...] = ()  # Unix groups whose members may
    account_settings: tuple[AccountConfig, ...] = (AccountConfig("default"),)
    users: tuple[UserConfig, ...] = ()
    quotas: tuple[QuotaConfig, ...] = ()
    qos: tuple[QosConfig, ...] = DEFAULT_QOS
    default_qos: str = "normal"
    enforce_associations: bool = False
    switches: tuple[SwitchConfig, ...] = ()
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)


@dataclass(frozen=True)
class AgentConfig:
    controller: str = "127.0.0.1:6817"
    node_name: str = ""  # empty: the host name
    address: str = ""  # what other ranks use as MASTER_ADDR; empty: the node name
    state_dir: str = "/var/lib/garrison/agent"
    credential_socket: str = "/run/garrison/auth.sock"
    fake_topology: str = ""  # empty: real NVML; else dgx-a100 | dgx1v | pcie4 | pcie8 | a TOML path
    # Mutual TLS with the controller (docs/security.md): this node's certificate and key, and the cluster CA.
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
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
        allowed_qos=s.get_str_list("allowed_qos", ()),
        priority=s.get_int("priority", 0),
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
    account_settings = _accounts(s._get("accounts", (list,), None), f"{where}.accounts", d.account_settings)
    accounts = tuple(a.name for a in account_settings)
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
        tls_cert=s.get_str("tls_cert", d.tls_cert),
        tls_key=s.get_str("tls_key", d.tls_key),
        tls_ca=s.get_str("tls_ca", d.tls_ca),
        agent_address=s.get_str("agent_address", d.agent_address),
        tls_revoked_agents=s.get_str("tls_revoked_agents", d.tls_revoked_agents),
        token_key_file=s.get_str("token_key_file", d.token_key_file),
        token_max_lifetime_s=s.get_duration("token_max_lifetime", d.token_max_lifetime_s),
        request_rate_per_s=s.get_number("request_rate_per_s", d.request_rate_per_s),
        request_burst=s.get_int("request_burst", d.request_burst, 1),
        auth_failure_rate_per_s=s.get_number("auth_failure_rate_per_s", d.auth_failure_rate_per_s),
        auth_failure_burst=s.get_int("auth_failure_burst", d.auth_failure_burst, 1),
        partitions=partitions,
        account_settings=account_settings,
        **_policy(s, where, d),
    )
    s.finish()
    _check_policy(cfg, where)
    if cfg.default_account not in cfg.accounts:
        raise ConfigError(f"{where}.default_account: {cfg.default_account!r} is not in accounts")
    if cfg.heartbeat_timeout_s <= cfg.heartbeat_interval_s:
        raise ConfigError(f"{where}.heartbeat_timeout_s: must exceed heartbeat_interval_s")
    _check_address(cfg.address, f"{where}.address")
    _check_tls(cfg.tls_cert, cfg.tls_key, cfg.tls_ca, where)
    if cfg.agent_address:
        _check_address(cfg.agent_address, f"{where}.agent_address")
        if not cfg.tls_cert:
            raise ConfigError(f"{where}.agent_address: only used with TLS (set tls_cert, tls_key, tls_ca)")
        if cfg.agent_address == cfg.address:
            raise ConfigError(f"{where}.agent_address: must differ from address (agents use mutual TLS)")
    elif cfg.tls_cert:
        raise ConfigError(f"{where}.agent_address: required with TLS (the port agents reach with mutual TLS)")
    if cfg.token_max_lifetime_s <= 0:
        raise ConfigError(f"{where}.token_max_lifetime: must be positive")
    if cfg.metrics_address:
        _check_address(cfg.metrics_address, f"{where}.metrics_address")
    if cfg.tls_ca and not cfg.tls_revoked_agents:
        cfg = replace(cfg, tls_revoked_agents=os.path.join(os.path.dirname(cfg.tls_ca), "revoked"))
    return cfg


def _tables(value: Any, where: str) -> list[tuple[_Section, str]]:
    if value is None:
        return []
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise ConfigError(f"{where}[{i}]: expected a table")
        out.append((_Section(item, f"{where}[{i}]"), f"{where}[{i}]"))
    return out


def _optional_int(s: _Section, key: str) -> int | None:
    return s.get_int(key, 0) if key in s.table else None


def _accounts(value: Any, where: str, default: tuple[AccountConfig, ...]) -> tuple[AccountConfig, ...]:
    """accounts = ["default", {name = "physics", shares = 2}, {name = "theory", parent = "physics"}]"""
    if value is None:
        return default
    out = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            out.append(AccountConfig(item))
            continue
        if not isinstance(item, dict):
            raise ConfigError(f"{where}[{i}]: expected an account name or a table")
        s = _Section(item, f"{where}[{i}]")
        account = AccountConfig(
            name=s.get_str("name", ""),
            parent=s.get_str("parent", ""),
            shares=s.get_int("shares", 1, 1),
            allowed_qos=s.get_str_list("allowed_qos", ()),
            description=s.get_str("description", ""),
        )
        s.finish()
        if not account.name:
            raise ConfigError(f"{where}[{i}].name: an account needs a name")
        out.append(account)
    names = [a.name for a in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: duplicate account name")
    for i, account in enumerate(out):
        if account.parent and account.parent not in names:
            raise ConfigError(f"{where}[{i}].parent: unknown account {account.parent!r}")
    return tuple(out)


def _policy(s: _Section, where: str, d: ControllerConfig) -> dict[str, Any]:
    """The scheduling policy's keys of the [controller] section (validated across keys by _check_policy)."""
    users = []
    for u, at in _tables(s._get("users", (list,), None), f"{where}.users"):
        accounts = u.get_str_list("accounts", ())
        users.append(UserConfig(
            name=u.get_str("name", ""),
            accounts=accounts,
            default_account=u.get_str("default_account", accounts[0] if accounts else ""),
            shares=u.get_int("shares", 1, 1),
            coordinator_of=u.get_str_list("coordinator_of", ()),
        ))
        u.finish()
        if not users[-1].name or not accounts:
            raise ConfigError(f"{at}: a user needs a name and at least one account")
    quotas = []
    for q, at in _tables(s._get("quotas", (list,), None), f"{where}.quotas"):
        hours = q.get_number("max_gpu_hours", 0.0) if "max_gpu_hours" in q.table else None
        quotas.append(QuotaConfig(
            account=q.get_str("account", ""),
            user=q.get_str("user", ""),
            max_gpus=_optional_int(q, "max_gpus"),
            max_jobs=_optional_int(q, "max_jobs"),
            max_gpu_hours=hours,
        ))
        q.finish()
        if bool(quotas[-1].account) == bool(quotas[-1].user):
            raise ConfigError(f"{at}: give exactly one of account and user")
    qos_table = d.qos
    raw_qos = s._get("qos", (list,), None)
    if raw_qos is not None:
        parsed = []
        for q, at in _tables(raw_qos, f"{where}.qos"):
            parsed.append(QosConfig(
                name=q.get_str("name", ""),
                priority=q.get_int("priority", 0),
                preempts=q.get_str_list("preempts", ()),
                max_gpus_per_user=_optional_int(q, "max_gpus_per_user"),
                max_jobs_per_user=_optional_int(q, "max_jobs_per_user"),
                max_time_s=q.get_duration("max_time", 0) if "max_time" in q.table else None,
                grace_s=q.get_duration("grace_time", 60),
            ))
            q.finish()
            if not parsed[-1].name:
                raise ConfigError(f"{at}.name: a QoS needs a name")
        qos_table = tuple(parsed)
    switches = []
    for w, at in _tables(s._get("switches", (list,), None), f"{where}.switches"):
        switches.append(SwitchConfig(
            name=w.get_str("name", ""), nodes=w.get_str_list("nodes", ()), switches=w.get_str_list("switches", ())
        ))
        w.finish()
        if not switches[-1].name or bool(switches[-1].nodes) == bool(switches[-1].switches):
            raise ConfigError(f"{at}: a switch needs a name and either nodes or switches")
    return {
        "admins": s.get_str_list("admins", d.admins),
        "admin_groups": s.get_str_list("admin_groups", d.admin_groups),
        "users": tuple(users),
        "quotas": tuple(quotas),
        "qos": qos_table,
        "default_qos": s.get_str("default_qos", d.default_qos if raw_qos is None else ""),
        "enforce_associations": s.get_bool("enforce_associations", d.enforce_associations),
        "switches": tuple(switches),
        "scheduler": _scheduler(s._get("scheduler", (dict,), None), f"{where}.scheduler"),
    }


def _scheduler(table: Mapping[str, Any] | None, where: str) -> SchedulerSettings:
    d = SchedulerSettings()
    s = _Section(table or {}, where)

    def weight(key: str) -> int | None:
        return s.get_int(key, 0) if key in s.table else None

    def duration(key: str) -> int | None:
        return s.get_duration(key, 0) if key in s.table else None

    settings = SchedulerSettings(
        policy=s.get_str("policy", d.policy),
        priority_weight_age=weight("priority_weight_age"),
        priority_weight_fairshare=weight("priority_weight_fairshare"),
        priority_weight_qos=weight("priority_weight_qos"),
        priority_weight_job_size=weight("priority_weight_job_size"),
        priority_weight_partition=weight("priority_weight_partition"),
        priority_weight_time_limit=weight("priority_weight_time_limit"),
        priority_max_age_s=duration("priority_max_age"),
        priority_time_limit_short_s=duration("priority_time_limit_short"),
        priority_time_limit_long_s=duration("priority_time_limit_long"),
        fairshare_half_life_s=s.get_duration("fairshare_half_life", d.fairshare_half_life_s),
        quota_period_s=s.get_duration("quota_period", d.quota_period_s),
        backfill=s.get_bool("backfill", False) if "backfill" in s.table else None,
        backfill_reservations=weight("backfill_reservations"),
        backfill_max_job_test=s.get_int("backfill_max_job_test", d.backfill_max_job_test, 1),
        backfill_window_s=s.get_duration("backfill_window", d.backfill_window_s),
        backfill_resolution_s=s.get_duration("backfill_resolution", d.backfill_resolution_s),
        max_starts_per_cycle=s.get_int("max_starts_per_cycle", d.max_starts_per_cycle, 1),
        preemption=s.get_bool("preemption", d.preemption),
        usage_save_interval_s=s.get_number("usage_save_interval_s", d.usage_save_interval_s, 1.0),
    )
    s.finish()
    if settings.policy not in ("fifo", "fifo-easy", "garrison"):
        raise ConfigError(f"{where}.policy: expected fifo, fifo-easy or garrison, got {settings.policy!r}")
    for key in ("priority_max_age_s", "priority_time_limit_short_s", "priority_time_limit_long_s",
                "fairshare_half_life_s", "quota_period_s", "backfill_window_s"):
        value = getattr(settings, key)
        if value is not None and value <= 0:
            raise ConfigError(f"{where}.{key.removesuffix('_s')}: must be positive")
    short = settings.priority_time_limit_short_s or PRESET_TIME_LIMIT_SHORT_S
    long = settings.priority_time_limit_long_s or PRESET_TIME_LIMIT_LONG_S
    if short >= long:
        raise ConfigError(f"{where}: priority_time_limit_short ({short}s) must be below priority_time_limit_long "
                          f"({long}s)")
    return settings


def _check_policy(cfg: ControllerConfig, where: str) -> None:
    """Cross-key checks: every name a policy key mentions must exist."""
    accounts = set(cfg.accounts)
    qos = {q.name for q in cfg.qos}
    if cfg.default_qos and cfg.default_qos not in qos:
        raise ConfigError(f"{where}.default_qos: {cfg.default_qos!r} is not in qos")
    for q in cfg.qos:
        for other in q.preempts:
            if other not in qos or other == q.name:
                raise ConfigError(f"{where}.qos: {q.name!r} may not preempt {other!r}")
    for a in cfg.account_settings:
        for name in a.allowed_qos:
            if name not in qos:
                raise ConfigError(f"{where}.accounts: {a.name!r} allows unknown QoS {name!r}")
    for u in cfg.users:
        for name in (*u.accounts, *u.coordinator_of):
            if name not in accounts:
                raise ConfigError(f"{where}.users: {u.name!r} names unknown account {name!r}")
        if u.default_account not in u.accounts:
            raise ConfigError(f"{where}.users: {u.name!r}: default_account is not one of its accounts")
    for quota in cfg.quotas:
        if quota.account and quota.account not in accounts:
            raise ConfigError(f"{where}.quotas: unknown account {quota.account!r}")
    for part in cfg.partitions:
        for name in part.allowed_accounts:
            if name not in accounts:
                raise ConfigError(f"{where}.partitions: {part.name!r} allows unknown account {name!r}")
        for name in part.allowed_qos:
            if name not in qos:
                raise ConfigError(f"{where}.partitions: {part.name!r} allows unknown QoS {name!r}")
    switch_names = [w.name for w in cfg.switches]
    if len(set(switch_names)) != len(switch_names):
        raise ConfigError(f"{where}.switches: duplicate switch name")
    for w in cfg.switches:
        for child in w.switches:
            if child not in switch_names:
                raise ConfigError(f"{where}.switches: {w.name!r} names unknown switch {child!r}")


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
        tls_cert=s.get_str("tls_cert", d.tls_cert),
        tls_key=s.get_str("tls_key", d.tls_key),
        tls_ca=s.get_str("tls_ca", d.tls_ca),
        metrics_address=s.get_str("metrics_address", d.metrics_address),
    )
    s.finish()
    _check_address(cfg.controller, f"{where}.controller")
    _check_tls(cfg.tls_cert, cfg.tls_key, cfg.tls_ca, where)
    if cfg.metrics_address:
        _check_address(cfg.metrics_address, f"{where}.metrics_address")
    return cfg


def _check_tls(cert: str, key: str, ca: str, where: str) -> None:
    given = {"tls_cert": cert, "tls_key": key, "tls_ca": ca}
    if any(given.values()) and not all(given.values()):
        missing = next(name for name, value in given.items() if not value)
        raise ConfigError(f"{where}.{missing}: TLS needs tls_cert, tls_key and tls_ca together")


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
