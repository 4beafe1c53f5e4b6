"""initial schema: jobs, job_attempts, nodes, gpus, counters

Revision ID: 0001
Revises:
Create Date: 2026-11-30 05:26:30.228642
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A migration is a frozen snapshot: it spells out its types instead of importing schema.py, which moves on.
JobId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("job_id", JobId, autoincrement=False, nullable=False),
        sa.Column("array_job_id", sa.BigInteger(), nullable=True),
        sa.Column("array_task_id", sa.Integer(), nullable=True),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("user_name", sa.Text(), nullable=False),
        sa.Column("uid", sa.BigInteger(), nullable=False),
        sa.Column("gid", sa.BigInteger(), nullable=False),
        sa.Column("account", sa.Text(), nullable=False),
        sa.Column("partition", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("time_limit_s", sa.Integer(), nullable=False),
        sa.Column("submit_time", sa.Double(), nullable=False),
        sa.Column("start_time", sa.Double(), nullable=True),
        sa.Column("end_time", sa.Double(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("restart_count", sa.Integer(), nullable=False),
        sa.Column("spec_json", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_jobs")),
    )
    op.create_index(op.f("ix_jobs_state"), "jobs", ["state"], unique=False)
    op.create_index(op.f("ix_jobs_user_name"), "jobs", ["user_name"], unique=False)

    op.create_table(
        "job_attempts",
        sa.Column("job_id", JobId, autoincrement=False, nullable=False),
        sa.Column("attempt", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("allocation_json", sa.Text(), nullable=False),
        sa.Column("start_time", sa.Double(), nullable=False),
        sa.Column("end_time", sa.Double(), nullable=True),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.job_id"], name=op.f("fk_job_attempts_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "attempt", name=op.f("pk_job_attempts")),
    )

    op.create_table(
        "nodes",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("last_heartbeat", sa.Double(), nullable=False),
        sa.Column("inventory_json", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_nodes")),
    )

    op.create_table(
        "gpus",
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("gpu_index", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("uuid", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("memory_mib", sa.BigInteger(), nullable=False),
        sa.Column("pci_bus_id", sa.Text(), nullable=False),
        sa.Column("numa_node", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["node"], ["nodes.name"], name=op.f("fk_gpus_node_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("node", "gpu_index", name=op.f("pk_gpus")),
    )

    counters = op.create_table(
        "counters",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("next_job_id", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_counters_single_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_counters")),
    )
    # The one counter row; job ids start at 1.
    op.bulk_insert(counters, [{"id": 1, "next_job_id": 1}])


def downgrade() -> None:
    op.drop_table("counters")
    op.drop_table("gpus")
    op.drop_table("nodes")
    op.drop_table("job_attempts")
    op.drop_index(op.f("ix_jobs_user_name"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_state"), table_name="jobs")
    op.drop_table("jobs")
