"""The store's schema, declared once for SQLite and PostgreSQL.

The Alembic migrations in ``migrations/versions/`` must build exactly this schema; a unit test runs them on
an empty database and compares the result with ``metadata`` (``alembic.autogenerate.compare_metadata``).
So a change here needs a new migration, which ``alembic revision --autogenerate`` can draft.

Times are float epoch seconds. Values that only the controller interprets (a job's spec, an attempt's
allocation, a node's inventory) are JSON text columns (see ``serde.py``); the columns beside them are the ones
worth querying or indexing.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    false,
)

# Deterministic constraint names, so that later migrations can drop or alter them by name on both backends.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_name)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

# Job ids and uids are unsigned 32-bit values or more, past PostgreSQL's INTEGER. On SQLite every integer is
# 64-bit anyway, and only a column typed exactly INTEGER PRIMARY KEY becomes the rowid (no extra index).
JobId = BigInteger().with_variant(Integer(), "sqlite")

jobs = Table(
    "jobs",
    metadata,
    Column("job_id", JobId, primary_key=True, autoincrement=False),
    Column("array_job_id", BigInteger, nullable=True),
    Column("array_task_id", Integer, nullable=True),
    Column("name", Text, nullable=False),
    Column("user_name", Text, nullable=False),
    Column("uid", BigInteger, nullable=False),
    Column("gid", BigInteger, nullable=False),
    Column("account", Text, nullable=False),
    Column("partition", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("priority", Integer, nullable=False),
    Column("time_limit_s", Integer, nullable=False),
    Column("submit_time", Double, nullable=False),
    Column("start_time", Double, nullable=True),
    Column("end_time", Double, nullable=True),
    Column("exit_code", Integer, nullable=True),
    Column("restart_count", Integer, nullable=False),
    # The spec is stored once however many jobs share it (every task of an array): see job_specs below. No
    # foreign key: SQLite cannot add one to an existing table without rebuilding it, and rebuilding the jobs
    # table would cascade-delete its attempts; the store writes a job's spec in the job's own transaction.
    # (The server default only lets migration 0003 add the column to existing rows; the store always sets it.)
    Column("spec_key", Text, nullable=False, server_default=""),
    Index(None, "state"),
    Index(None, "user_name"),
    Index(None, "spec_key"),
)

# Job specs by content (migration 0003): an array of 100,000 tasks, or of 300 with a 1 MB script, stores its
# spec once. The key is a digest of the spec's JSON text (serde.spec_key); a spec no job refers to any more
# is deleted with the last of its jobs (SqlStore.delete_jobs).
job_specs = Table(
    "job_specs",
    metadata,
    Column("spec_key", Text, primary_key=True),
    Column("spec_json", Text, nullable=False),
)

# A large array being written in chunks (controller/bulk.py): its jobs are ids [first_job_id, first_job_id +
# job_count). A row still here at start-up is a submission the controller died in the middle of, whose client
# never got its job id: load() deletes its jobs.
unfinished_submissions = Table(
    "unfinished_submissions",
    metadata,
    Column("first_job_id", JobId, primary_key=True, autoincrement=False),
    Column("job_count", BigInteger, nullable=False),
)

job_attempts = Table(
    "job_attempts",
    metadata,
    Column(
        "job_id",
        JobId,
        ForeignKey("jobs.job_id", ondelete="CASCADE"),
        primary_key=True,
        autoincrement=False,
    ),
    Column("attempt", Integer, primary_key=True, autoincrement=False),
    Column("allocation_json", Text, nullable=False),
    Column("start_time", Double, nullable=False),
    Column("end_time", Double, nullable=True),
    Column("state", Text, nullable=False),
    Column("exit_code", Integer, nullable=True),
    Column("reason", Text, nullable=False),
    # What the attempt used (serde.usage_to_json), once it has ended on a contained node; NULL: not measured.
    Column("usage_json", Text, nullable=True),
    # Ended FAILED because its launch failed before any rank ran: retried, and not a --max-restarts failure.
    Column("launch_failed", Boolean, nullable=False, server_default=false()),
)

nodes = Table(
    "nodes",
    metadata,
    Column("name", Text, primary_key=True),
    Column("state", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("last_heartbeat", Double, nullable=False),
    Column("inventory_json", Text, nullable=False),
)

# A queryable copy of each node's GPUs (which node holds GPU uuid X?). The node's inventory_json stays the
# source the controller loads from, since it also carries the NVLink and topology matrices.
gpus = Table(
    "gpus",
    metadata,
    Column("node", Text, ForeignKey("nodes.name", ondelete="CASCADE"), primary_key=True),
    Column("gpu_index", Integer, primary_key=True, autoincrement=False),
    Column("uuid", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("memory_mib", BigInteger, nullable=False),
    Column("pci_bus_id", Text, nullable=False),
    Column("numa_node", Integer, nullable=False),
)

# The job id sequence, one row (id = 1). A counter row rather than a database sequence because SQLite has
# none, and because reserving a block of ids for a job array is one UPDATE ... RETURNING on both backends.
COUNTER_ROW_ID = 1
counters = Table(
    "counters",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("next_job_id", BigInteger, nullable=False),
    CheckConstraint(f"id = {COUNTER_ROW_ID}", name="single_row"),
)


# -- Scheduling policy (migration 0002): the accounting data gadmin manages, decayed usage, job holds ---------
# Small tables, rewritten as a whole on every admin change (SqlStore.save_accounting), so they carry no
# foreign keys between them: Accounting (garrison/model/accounts.py) validates the whole before it is saved.
# Lists are JSON text, like the job spec.

accounts = Table(
    "accounts",
    metadata,
    Column("name", Text, primary_key=True),
    Column("parent", Text, nullable=True),
    Column("shares", Integer, nullable=False),
    Column("allowed_qos_json", Text, nullable=False),
    Column("description", Text, nullable=False),
)

users = Table(
    "users",
    metadata,
    Column("name", Text, primary_key=True),
    Column("default_account", Text, nullable=False),
)

# A user's membership of an account (Slurm's association), with its fair-share shares.
user_accounts = Table(
    "user_accounts",
    metadata,
    Column("user_name", Text, primary_key=True),
    Column("account", Text, primary_key=True),
    Column("shares", Integer, nullable=False),
    Index(None, "account"),
)

coordinators = Table(
    "coordinators",
    metadata,
    Column("user_name", Text, primary_key=True),
    Column("account", Text, primary_key=True),
)

qos = Table(
    "qos",
    metadata,
    Column("name", Text, primary_key=True),
    Column("priority", Integer, nullable=False),
    Column("preempts_json", Text, nullable=False),
    Column("max_gpus_per_user", Integer, nullable=True),
    Column("max_jobs_per_user", Integer, nullable=True),
    Column("max_time_s", BigInteger, nullable=True),
    Column("grace_s", Integer, nullable=False),
    Column("description", Text, nullable=False),
)

quotas = Table(
    "quotas",
    metadata,
    Column("kind", Text, primary_key=True),
    Column("name", Text, primary_key=True),
    Column("max_gpus", Integer, nullable=True),
    Column("max_jobs", Integer, nullable=True),
    Column("max_gpu_hours", Double, nullable=True),
    CheckConstraint("kind IN ('account', 'user')", name="kind"),
)

partitions = Table(
    "partitions",
    metadata,
    Column("name", Text, primary_key=True),
    Column("position", Integer, nullable=False),  # the order partitions are listed (and defaulted) in
    Column("nodes_json", Text, nullable=False),
    Column("default_time_s", BigInteger, nullable=False),
    Column("max_time_s", BigInteger, nullable=False),
    Column("is_default", Boolean, nullable=False),
    Column("allowed_accounts_json", Text, nullable=False),
    Column("allowed_qos_json", Text, nullable=False),
    Column("priority", Integer, nullable=False),
)

# Key/value settings of the policy: whether the accounting data was seeded from the configuration, the
# default account and QoS, association enforcement, and when usage was last decayed.
policy_settings = Table(
    "policy_settings",
    metadata,
    Column("key", Text, primary_key=True),
    Column("value", Text, nullable=False),
)

# GPU-seconds per (account, user): decayed (fair share), since the quota period began, and in all.
usage_ledger = Table(
    "usage_ledger",
    metadata,
    Column("account", Text, primary_key=True),
    Column("user_name", Text, primary_key=True),
    Column("decayed_gpu_s", Double, nullable=False),
    Column("period_gpu_s", Double, nullable=False),
    Column("total_gpu_s", Double, nullable=False),
)

job_holds = Table(
    "job_holds",
    metadata,
    Column("job_id", JobId, ForeignKey("jobs.job_id", ondelete="CASCADE"), primary_key=True, autoincrement=False),
    Column("by_admin", Boolean, nullable=False),
)

# -- Database outages (migration 0003_storefaults) ----------------------------------------------------------

# The decision to stop an attempt (controller/lifecycle.py), written with the job's COMPLETING state, so that
# a restarted controller records the attempt as it was decided (PREEMPTED, not NODE_FAIL) and keeps what
# is left of a preemption's grace period instead of terminating the victim at once.
attempt_stops = Table(
    "attempt_stops",
    metadata,
    Column("job_id", JobId, ForeignKey("jobs.job_id", ondelete="CASCADE"), primary_key=True, autoincrement=False),
    Column("attempt", Integer, primary_key=True, autoincrement=False),
    Column("outcome", Text, nullable=False),
    Column("requeue_as", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("terminate_at", Double, nullable=True),
)

# Job steps (gsrun): one row per step, written when it starts and again when it ends. The layout (its
# nodes, tasks, GPUs and CPUs) and the command are JSON only the controller reads.
job_steps = Table(
    "job_steps",
    metadata,
    Column("job_id", JobId, ForeignKey("jobs.job_id", ondelete="CASCADE"), primary_key=True, autoincrement=False),
    Column("step_id", Integer, primary_key=True, autoincrement=False),
    Column("name", Text, nullable=False),
    Column("user_name", Text, nullable=False),
    Column("uid", BigInteger, nullable=False),
    Column("argv_json", Text, nullable=False),
    Column("layout_json", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("start_time", Double, nullable=False),
    Column("end_time", Double, nullable=True),
    Column("exit_code", Integer, nullable=True),
    Column("reason", Text, nullable=False),
)
