"""The checks that span several keys of a section, made once its keys are read: every name a policy key
mentions exists, addresses are HOST:PORT, TLS files come all three or none, and the controller's
heartbeat, agent address and token settings agree with each other."""

from __future__ import annotations

from garrison.config.errors import ConfigError
from garrison.config.schema import JOB_DEVICE_POLICIES, AgentConfig, ControllerConfig
from garrison.model.features import ConstraintError, check_feature_names


def check_controller(cfg: ControllerConfig, where: str) -> None:
    """The [controller] section's checks across keys: names the policy mentions, addresses, TLS files."""
    check_policy_names(cfg, where)
    if cfg.default_account not in cfg.accounts:
        raise ConfigError(f"{where}.default_account: {cfg.default_account!r} is not in accounts")
    if cfg.heartbeat_timeout_s <= cfg.heartbeat_interval_s:
        raise ConfigError(f"{where}.heartbeat_timeout_s: must exceed heartbeat_interval_s")
    if cfg.node_lease_s < 2 * cfg.heartbeat_interval_s:
        # One late heartbeat must not stop a node's jobs.
        raise ConfigError(f"{where}.node_lease_s: must be at least twice heartbeat_interval_s")
    check_address(cfg.address, f"{where}.address")
    check_tls_files(cfg.tls_cert, cfg.tls_key, cfg.tls_ca, where)
    if cfg.agent_address:
        check_address(cfg.agent_address, f"{where}.agent_address")
        if not cfg.tls_cert:
            raise ConfigError(f"{where}.agent_address: only used with TLS (set tls_cert, tls_key, tls_ca)")
        if cfg.agent_address == cfg.address:
            raise ConfigError(f"{where}.agent_address: must differ from address (agents use mutual TLS)")
    elif cfg.tls_cert:
        raise ConfigError(f"{where}.agent_address: required with TLS (the port agents reach with mutual TLS)")
    if cfg.token_max_lifetime_s <= 0:
        raise ConfigError(f"{where}.token_max_lifetime: must be positive")
    if cfg.metrics_address:
        check_address(cfg.metrics_address, f"{where}.metrics_address")


def check_agent(cfg: AgentConfig, where: str) -> None:
    """The [agent] section's checks across keys: the addresses it dials and serves, its TLS files."""
    check_address(cfg.controller, f"{where}.controller")
    check_tls_files(cfg.tls_cert, cfg.tls_key, cfg.tls_ca, where)
    if cfg.metrics_address:
        check_address(cfg.metrics_address, f"{where}.metrics_address")
    if cfg.job_devices not in JOB_DEVICE_POLICIES:
        raise ConfigError(f"{where}.job_devices: one of {', '.join(repr(p) for p in JOB_DEVICE_POLICIES)} "
                          f"(not {cfg.job_devices!r})")
    if cfg.scratch_dir and (not cfg.scratch_dir.startswith("/") or ".." in cfg.scratch_dir.split("/")):
        raise ConfigError(f"{where}.scratch_dir: must be an absolute path (not {cfg.scratch_dir!r})")
    if not cfg.cgroup_root.strip("/") or ".." in cfg.cgroup_root.split("/"):
        raise ConfigError(f"{where}.cgroup_root: must name a directory below a cgroup (not {cfg.cgroup_root!r})")
    try:
        check_feature_names(cfg.features, f"{where}.features")
    except ConstraintError as exc:
        raise ConfigError(str(exc)) from None


def check_policy_names(cfg: ControllerConfig, where: str) -> None:
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


def check_tls_files(cert: str, key: str, ca: str, where: str) -> None:
    given = {"tls_cert": cert, "tls_key": key, "tls_ca": ca}
    if any(given.values()) and not all(given.values()):
        missing = next(name for name, value in given.items() if not value)
        raise ConfigError(f"{where}.{missing}: TLS needs tls_cert, tls_key and tls_ca together")


def check_address(address: str, where: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{where}: expected HOST:PORT, got {address!r}")
