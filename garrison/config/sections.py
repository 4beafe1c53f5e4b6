"""How each section of the file becomes its configuration object: [controller] (with its partitions,
accounts, users, quotas, QoS, switches and [controller.scheduler]) and [agent].

Each reader takes the section's TOML table and the dotted place it sits (for error messages), reads every
key through a TableReader so unknown keys are refused, then hands the result to garrison.config.checks.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from garrison.config.checks import check_agent, check_controller
from garrison.config.errors import ConfigError
from garrison.config.reader import TableReader, read_tables
from garrison.config.schema import (
    PRESET_TIME_LIMIT_LONG_S,
    PRESET_TIME_LIMIT_SHORT_S,
    AccountConfig,
    AgentConfig,
    ControllerConfig,
    PartitionConfig,
    QosConfig,
    QuotaConfig,
    SchedulerSettings,
    SwitchConfig,
    UserConfig,
)


def read_partition(table: Any, where: str) -> PartitionConfig:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table")
    s = TableReader(table, where)
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


def read_controller(table: Mapping[str, Any], where: str) -> ControllerConfig:
    d = ControllerConfig()
    s = TableReader(table, where)
    raw_partitions = s.get_typed("partitions", (list,), None)
    partitions = d.partitions
    if raw_partitions is not None:
        partitions = tuple(read_partition(t, f"{where}.partitions[{i}]") for i, t in enumerate(raw_partitions))
        if not partitions:
            raise ConfigError(f"{where}.partitions: at least one partition is needed")
        names = [p.name for p in partitions]
        if len(set(names)) != len(names):
            raise ConfigError(f"{where}.partitions: duplicate partition name")
        if sum(p.default for p in partitions) > 1:
            raise ConfigError(f"{where}.partitions: more than one default partition")
    account_settings = read_accounts(s.get_typed("accounts", (list,), None), f"{where}.accounts", d.account_settings)
    accounts = tuple(a.name for a in account_settings)
    cfg = ControllerConfig(
        address=s.get_str("address", d.address),
        database=s.get_str("database", d.database),
        database_pool_size=s.get_int("database_pool_size", d.database_pool_size, 1),
        database_max_overflow=s.get_int("database_max_overflow", d.database_max_overflow),
        database_pool_timeout_s=s.get_number("database_pool_timeout_s", d.database_pool_timeout_s, 0.1),
        database_pool_recycle_s=s.get_number("database_pool_recycle_s", d.database_pool_recycle_s, 1.0),
        store_retry_s=s.get_number("store_retry_s", d.store_retry_s, 0.1),
        metrics_address=s.get_str("metrics_address", d.metrics_address),
        state_dir=s.get_str("state_dir", d.state_dir),
        credential_socket=s.get_str("credential_socket", d.credential_socket),
        local_socket=s.get_str("local_socket", d.local_socket),
        key_file=s.get_str("key_file", d.key_file),
        credential_lifetime_s=s.get_number("credential_lifetime_s", d.credential_lifetime_s, 1.0),
        heartbeat_interval_s=s.get_number("heartbeat_interval_s", d.heartbeat_interval_s, 0.05),
        heartbeat_timeout_s=s.get_number("heartbeat_timeout_s", d.heartbeat_timeout_s, 0.1),
        node_lease_s=s.get_number("node_lease_s", d.node_lease_s, 0.1),
        schedule_interval_s=s.get_number("schedule_interval_s", d.schedule_interval_s, 0.01),
        kill_wait_s=s.get_number("kill_wait_s", d.kill_wait_s),
        allocation_keepalive_s=s.get_number("allocation_keepalive_s", d.allocation_keepalive_s, 1.0),
        finished_job_retention_s=s.get_number("finished_job_retention_s", d.finished_job_retention_s),
        cluster_name=_cluster_name(s.get_str("cluster_name", d.cluster_name), s.where),
        rendezvous_ports=_port_range(s.get_str("rendezvous_ports", "{}-{}".format(*d.rendezvous_ports)), s.where),
        max_launch_failures=s.get_int("max_launch_failures", d.max_launch_failures, 1),
        allow_root_jobs=s.get_bool("allow_root_jobs", d.allow_root_jobs),
        agent_uids=s.get_int_list("agent_uids", d.agent_uids),
        accounts=accounts,
        default_account=s.get_str("default_account", d.default_account),
        max_array_size=s.get_int("max_array_size", d.max_array_size, 1),
        max_submit_jobs=s.get_int("max_submit_jobs", d.max_submit_jobs, 0),
        local_max_connections_per_user=s.get_int("local_max_connections_per_user",
                                                 d.local_max_connections_per_user, 1),
        local_max_buffer_per_user_mb=s.get_int("local_max_buffer_per_user_mb", d.local_max_buffer_per_user_mb, 9),
        local_max_buffer_total_mb=s.get_int("local_max_buffer_total_mb", d.local_max_buffer_total_mb, 9),
        local_frame_timeout_s=s.get_number("local_frame_timeout_s", d.local_frame_timeout_s, 0.1),
        refusal_log_burst=s.get_int("refusal_log_burst", d.refusal_log_burst, 1),
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
        **read_policy(s, where, d),
    )
    s.finish()
    check_controller(cfg, where)
    if cfg.tls_ca and not cfg.tls_revoked_agents:
        cfg = replace(cfg, tls_revoked_agents=os.path.join(os.path.dirname(cfg.tls_ca), "revoked"))
    return cfg


def read_accounts(value: Any, where: str, default: tuple[AccountConfig, ...]) -> tuple[AccountConfig, ...]:
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
        s = TableReader(item, f"{where}[{i}]")
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


def read_policy(s: TableReader, where: str, d: ControllerConfig) -> dict[str, Any]:
    """The scheduling policy's keys of the [controller] section (checked across keys by checks.py)."""
    users = []
    for u, at in read_tables(s.get_typed("users", (list,), None), f"{where}.users"):
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
    for q, at in read_tables(s.get_typed("quotas", (list,), None), f"{where}.quotas"):
        hours = q.get_number("max_gpu_hours", 0.0) if "max_gpu_hours" in q.table else None
        quotas.append(QuotaConfig(
            account=q.get_str("account", ""),
            user=q.get_str("user", ""),
            max_gpus=q.get_optional_int("max_gpus"),
            max_jobs=q.get_optional_int("max_jobs"),
            max_gpu_hours=hours,
        ))
        q.finish()
        if bool(quotas[-1].account) == bool(quotas[-1].user):
            raise ConfigError(f"{at}: give exactly one of account and user")
    qos_table = d.qos
    raw_qos = s.get_typed("qos", (list,), None)
    if raw_qos is not None:
        parsed = []
        for q, at in read_tables(raw_qos, f"{where}.qos"):
            parsed.append(QosConfig(
                name=q.get_str("name", ""),
                priority=q.get_int("priority", 0),
                preempts=q.get_str_list("preempts", ()),
                max_gpus_per_user=q.get_optional_int("max_gpus_per_user"),
                max_jobs_per_user=q.get_optional_int("max_jobs_per_user"),
                max_time_s=q.get_duration("max_time", 0) if "max_time" in q.table else None,
                grace_s=q.get_duration("grace_time", 60),
            ))
            q.finish()
            if not parsed[-1].name:
                raise ConfigError(f"{at}.name: a QoS needs a name")
        qos_table = tuple(parsed)
    switches = []
    for w, at in read_tables(s.get_typed("switches", (list,), None), f"{where}.switches"):
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
        "scheduler": read_scheduler(s.get_typed("scheduler", (dict,), None), f"{where}.scheduler"),
    }


def read_scheduler(table: Mapping[str, Any] | None, where: str) -> SchedulerSettings:
    d = SchedulerSettings()
    s = TableReader(table or {}, where)

    def weight(key: str) -> int | None:
        return s.get_int(key, 0) if key in s.table else None

    def duration(key: str) -> int | None:
        return s.get_duration(key, 0) if key in s.table else None

    def number(key: str) -> float | None:
        return s.get_number(key, 0.0) if key in s.table else None

    settings = SchedulerSettings(
        policy=s.get_str("policy", d.policy),
        priority_weight_age=weight("priority_weight_age"),
        priority_weight_fairshare=weight("priority_weight_fairshare"),
        priority_weight_qos=weight("priority_weight_qos"),
        priority_weight_job_size=weight("priority_weight_job_size"),
        priority_weight_partition=weight("priority_weight_partition"),
        priority_weight_time_limit=weight("priority_weight_time_limit"),
        priority_weight_small_job=weight("priority_weight_small_job"),
        priority_weight_attained_service=weight("priority_weight_attained_service"),
        priority_attained_threshold_gpu_hours=number("priority_attained_threshold_gpu_hours"),
        priority_attained_starvation=number("priority_attained_starvation"),
        priority_max_age_s=duration("priority_max_age"),
        priority_time_limit_short_s=duration("priority_time_limit_short"),
        priority_time_limit_long_s=duration("priority_time_limit_long"),
        fairshare_half_life_s=s.get_duration("fairshare_half_life", d.fairshare_half_life_s),
        quota_period_s=s.get_duration("quota_period", d.quota_period_s),
        backfill=s.get_bool("backfill", False) if "backfill" in s.table else None,
        backfill_reservations=weight("backfill_reservations"),
        backfill_reserve_every_overdue=(s.get_bool("backfill_reserve_every_overdue", False)
                                        if "backfill_reserve_every_overdue" in s.table else None),
        backfill_max_job_test=s.get_int("backfill_max_job_test", d.backfill_max_job_test, 1),
        backfill_window_s=s.get_duration("backfill_window", d.backfill_window_s),
        backfill_resolution_s=s.get_duration("backfill_resolution", d.backfill_resolution_s),
        max_starts_per_cycle=s.get_int("max_starts_per_cycle", d.max_starts_per_cycle, 1),
        preemption=s.get_bool("preemption", d.preemption),
        preempt_max_grace_s=s.get_duration("preempt_max_grace", d.preempt_max_grace_s),
        preempt_attained_service=s.get_bool("preempt_attained_service", d.preempt_attained_service),
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
    if settings.priority_weight_attained_service and not settings.priority_attained_threshold_gpu_hours:
        raise ConfigError(f"{where}.priority_attained_threshold_gpu_hours: must be positive when "
                          "priority_weight_attained_service is set")
    if settings.preempt_attained_service and not (settings.preemption and settings.priority_weight_attained_service):
        raise ConfigError(f"{where}.preempt_attained_service: needs preemption = true and "
                          "priority_weight_attained_service set")
    short = settings.priority_time_limit_short_s or PRESET_TIME_LIMIT_SHORT_S
    long = settings.priority_time_limit_long_s or PRESET_TIME_LIMIT_LONG_S
    if short >= long:
        raise ConfigError(f"{where}: priority_time_limit_short ({short}s) must be below priority_time_limit_long "
                          f"({long}s)")
    return settings


def read_agent(table: Mapping[str, Any], where: str) -> AgentConfig:
    d = AgentConfig()
    s = TableReader(table, where)
    cfg = AgentConfig(
        controller=s.get_str("controller", d.controller),
        node_name=s.get_str("node_name", d.node_name),
        address=s.get_str("address", d.address),
        state_dir=s.get_str("state_dir", d.state_dir),
        credential_socket=s.get_str("credential_socket", d.credential_socket),
        fake_topology=s.get_str("fake_topology", d.fake_topology),
        fake_cpus=s.get_int("fake_cpus", d.fake_cpus, minimum=0),
        tls_cert=s.get_str("tls_cert", d.tls_cert),
        tls_key=s.get_str("tls_key", d.tls_key),
        tls_ca=s.get_str("tls_ca", d.tls_ca),
        metrics_address=s.get_str("metrics_address", d.metrics_address),
        features=s.get_str_list("features", d.features),
        cgroup_root=s.get_str("cgroup_root", d.cgroup_root),
        allow_unconfined=s.get_bool("allow_unconfined", d.allow_unconfined),
        job_pids_max=s.get_int("job_pids_max", d.job_pids_max, minimum=1),
        job_devices=s.get_str("job_devices", d.job_devices),
        scratch_dir=s.get_str("scratch_dir", d.scratch_dir),
    )
    s.finish()
    check_agent(cfg, where)
    return cfg


_PORT_RANGE = re.compile(r"^(\d{1,5})-(\d{1,5})$")


def _port_range(value: str, where: str) -> tuple[int, int]:
    """rendezvous_ports = "LOW-HIGH": unprivileged ports, LOW <= HIGH."""
    match = _PORT_RANGE.match(value.strip())
    if match is None or not 1024 <= int(match[1]) <= int(match[2]) <= 65535:
        raise ConfigError(f"{where}.rendezvous_ports: expected LOW-HIGH within 1024-65535 (e.g. 20000-32767), "
                          f"got {value[:40]!r}")
    return int(match[1]), int(match[2])


_CLUSTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _cluster_name(value: str, where: str) -> str:
    """A name jobs see as SLURM_CLUSTER_NAME: letters, digits and ._- as Slurm's ClusterName."""
    if not _CLUSTER_NAME.match(value):
        raise ConfigError(f"{where}.cluster_name: 1-64 letters, digits and ._- (starting with a letter or digit)")
    return value
