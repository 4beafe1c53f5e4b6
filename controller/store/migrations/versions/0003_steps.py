"""job steps: one row per gsrun step

Revision ID: 0003_steps
Revises: 0002
Create Date: 2026-12-02 14:10:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_steps"
down_revision: str | Sequence[str] | None = "0003_containment"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A migration is a frozen snapshot: it spells out its types instead of importing schema.py, which moves on.
JobId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "job_steps",
        sa.Column("job_id", JobId, autoincrement=False, nullable=False),
        sa.Column("step_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("user_name", sa.Text(), nullable=False),
        sa.Column("uid", sa.BigInteger(), nullable=False),
        sa.Column("argv_json", sa.Text(), nullable=False),
        sa.Column("layout_json", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("start_time", sa.Double(), nullable=False),
        sa.Column("end_time", sa.Double(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.job_id"], name=op.f("fk_job_steps_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "step_id", name=op.f("pk_job_steps")),
    )


def downgrade() -> None:
    op.drop_table("job_steps")
