"""Which settings exist, of what type, with what defaults: the typed shape of garrison.toml.

Only frozen dataclasses and constants, so a program that is handed a configuration (the scheduler, the
agent, gsim) can name its types without importing the code that reads the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_CONFIG_PATH = Path("/etc/garrison/garrison.toml")


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
    priority_weight_small_job: int | None = None
    # Attained service (controller/sched/attained.py, Tiresias' two-queue LAS): the high queue's weight, the
    # GPU-hours of service below which a job is in it, the starvation guard's multiple of its last run.
    priority_weight_attained_service: int | None = None
    priority_attained_threshold_gpu_hours: float | None = None
    priority_attained_starvation: float | None = None
    priority_max_age_s: int | None = None  # None: the preset's
    priority_time_limit_short_s: int | None = None
    priority_time_limit_long_s: int | None = None
    fairshare_half_life_s: int = 7 * 86400
    quota_period_s: int = 30 * 86400
    backfill: bool | None = None
    backfill_reservations: int | None = None
    # backfill_reservations counts only jobs that are not overdue; every overdue job gets a reservation too.
    backfill_reserve_every_overdue: bool | None = None  # None: the preset's
    backfill_max_job_test: int = 500
    backfill_window_s: int = 2 * 86400
    backfill_resolution_s: int = 60
    max_starts_per_cycle: int = 10_000
    preemption: bool = False
    # How far a preempted job's --signal lead time may lengthen its QoS grace (sched/preemption.py).
    preempt_max_grace_s: int = 300
    # With preemption on, a job in attained service's high queue may preempt running jobs in the low queue.
    preempt_attained_service: bool = False
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
    # How long the controller retries writing an agent's report (a job's start or end, a registration) while
    # the database is unavailable, before it drops the agent's stream so that the agent reports it again.
    store_retry_s: float = 60.0
    metrics_address: str = ""  # HOST:PORT of the Prometheus endpoint; empty: none
    state_dir: str = "/var/lib/garrison/controller"
    credential_socket: str = "/run/garrison/auth.sock"
    local_socket: str = "/run/garrison/controller.sock"  # the Controller RPCs for local clients, no grpc
    key_file: str = "/var/lib/garrison/controller/credential.key"
    credential_lifetime_s: float = 300.0  # short: a stolen credential is worth little (issue 20)
    heartbeat_interval_s: float = 5.0
    heartbeat_timeout_s: float = 30.0
    # The node lease (fencing, docs/operations.md): a node's ranks run at most this long past the last
    # heartbeat the controller answered; a controller outage shorter than this kills nothing.
    node_lease_s: float = 60.0
    # The longest time between scheduling cycles: changes trigger one at once (controller/cycles.py); this
    # only recomputes what moves with the clock alone (priorities' age, fair share, quotas).
    schedule_interval_s: float = 30.0
    # SIGTERM to SIGKILL: Slurm's KillWait default, which users' checkpoint-on-SIGTERM handlers are written for.
    kill_wait_s: float = 30.0
    # galloc renews its allocation's lease every third of this; a lease not renewed for this long (galloc
    # killed, its host gone) ends the allocation.
    allocation_keepalive_s: float = 30.0
    finished_job_retention_s: float = 300.0
    cluster_name: str = "garrison"  # SLURM_CLUSTER_NAME in every job
    # MASTER_PORT of each attempt (controller/rendezvous.py): below Linux's default ephemeral 32768-60999.
    rendezvous_ports: tuple[int, int] = (20000, 32767)
    max_launch_failures: int = 5  # failed launches in a row before a job ends FAILED (each backs off)
    allow_root_jobs: bool = False
    agent_uids: tuple[int, ...] = (0,)
    accounts: tuple[str, ...] = ("default",)
    default_account: str = "default"
    max_array_size: int = 100_000
    # Each user's jobs not yet ended (array tasks count one each), as Slurm's MaxSubmitJobs; 0: no cap.
    max_submit_jobs: int = 200_000
    # What one local user may hold of the local socket (controller/rpc/local.py, docs/security.md).
    local_max_connections_per_user: int = 16
    local_max_buffer_per_user_mb: int = 16
    local_max_buffer_total_mb: int = 64
    local_frame_timeout_s: float = 30.0
    # Refusals (authentication, permission, rate limits) logged per client and kind, at most, per 10 s; the
    # rest are counted in one line.
    refusal_log_burst: int = 20
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
    # With fake_topology: the CPUs the node offers (0: the host's), so that a local cluster on a small host can
    # stand for bigger nodes. Jobs are still bound to the CPUs the host really has (the chosen ones it has).
    fake_cpus: int = 0
    # Mutual TLS with the controller (docs/security.md): this node's certificate and key, and the cluster CA.
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    metrics_address: str = ""  # HOST:PORT of the Prometheus endpoint; empty: none
    features: tuple[str, ...] = ()  # node features that sbatch -C/--constraint selects on, e.g. ("a100", "ib")
    # Containment (docs/security.md): the agent's cgroup subtree in each v1 hierarchy (relative: below the
    # agent's own cgroup, i.e. systemd's delegated one; absolute: from the mount), whether jobs may run
    # unconfined where nothing can be enforced, and each job's task limit (pids.max).
    cgroup_root: str = "garrison"
    allow_unconfined: bool = False
    job_pids_max: int = 10_000
    # Which device files a job may open (JOB_DEVICE_POLICIES): "gpus", every device but the node's GPUs it
    # was not given (Slurm's ConstrainDevices=yes: InfiniBand, FUSE and the rest work as on the host), or
    # "allowlist", only its GPUs, the driver's control devices and the standard ones (null, zero, tty, ...).
    job_devices: str = "gpus"
    # Where each job attempt's scratch directory (SLURM_TMPDIR) is made, an absolute path on a local disk;
    # empty: inside the attempt's directory under state_dir.
    scratch_dir: str = ""


JOB_DEVICE_POLICIES = ("gpus", "allowlist")


@dataclass(frozen=True)
class GarrisonConfig:
    path: str
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
