"""scheduling policy: accounts, users, QoS, quotas, partitions, decayed usage, job holds

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 06:10:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A migration is a frozen snapshot: it spells out its types instead of importing schema.py, which moves on.
JobId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "accounts",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("parent", sa.Text(), nullable=True),
        sa.Column("shares", sa.Integer(), nullable=False),
        sa.Column("allowed_qos_json", sa.Text(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_accounts")),
    )
    op.create_table(
        "users",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("default_account", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_users")),
    )
    op.create_table(
        "user_accounts",
        sa.Column("user_name", sa.Text(), nullable=False),
        sa.Column("account", sa.Text(), nullable=False),
        sa.Column("shares", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("user_name", "account", name=op.f("pk_user_accounts")),
    )
    op.create_index(op.f("ix_user_accounts_account"), "user_accounts", ["account"], unique=False)
    op.create_table(
        "coordinators",
        sa.Column("user_name", sa.Text(), nullable=False),
        sa.Column("account", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("user_name", "account", name=op.f("pk_coordinators")),
    )
    op.create_table(
        "qos",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("preempts_json", sa.Text(), nullable=False),
        sa.Column("max_gpus_per_user", sa.Integer(), nullable=True),
        sa.Column("max_jobs_per_user", sa.Integer(), nullable=True),
        sa.Column("max_time_s", sa.BigInteger(), nullable=True),
        sa.Column("grace_s", sa.Integer(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_qos")),
    )
    op.create_table(
        "quotas",
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("max_gpus", sa.Integer(), nullable=True),
        sa.Column("max_jobs", sa.Integer(), nullable=True),
        sa.Column("max_gpu_hours", sa.Double(), nullable=True),
        sa.CheckConstraint("kind IN ('account', 'user')", name=op.f("ck_quotas_kind")),
        sa.PrimaryKeyConstraint("kind", "name", name=op.f("pk_quotas")),
    )
    op.create_table(
        "partitions",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("nodes_json", sa.Text(), nullable=False),
        sa.Column("default_time_s", sa.BigInteger(), nullable=False),
        sa.Column("max_time_s", sa.BigInteger(), nullable=False),
        sa.Column("is_default", sa.Boolean(), nullable=False),
        sa.Column("allowed_accounts_json", sa.Text(), nullable=False),
        sa.Column("allowed_qos_json", sa.Text(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_partitions")),
    )
    op.create_table(
        "policy_settings",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_policy_settings")),
    )
    op.create_table(
        "usage_ledger",
        sa.Column("account", sa.Text(), nullable=False),
        sa.Column("user_name", sa.Text(), nullable=False),
        sa.Column("decayed_gpu_s", sa.Double(), nullable=False),
        sa.Column("period_gpu_s", sa.Double(), nullable=False),
        sa.Column("total_gpu_s", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("account", "user_name", name=op.f("pk_usage_ledger")),
    )
    op.create_table(
        "job_holds",
        sa.Column("job_id", JobId, autoincrement=False, nullable=False),
        sa.Column("by_admin", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.job_id"], name=op.f("fk_job_holds_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_job_holds")),
    )


def downgrade() -> None:
    op.drop_table("job_holds")
    op.drop_table("usage_ledger")
    op.drop_table("policy_settings")
    op.drop_table("partitions")
    op.drop_table("quotas")
    op.drop_table("qos")
    op.drop_table("coordinators")
    op.drop_index(op.f("ix_user_accounts_account"), table_name="user_accounts")
    op.drop_table("user_accounts")
    op.drop_table("users")
    op.drop_table("accounts")
