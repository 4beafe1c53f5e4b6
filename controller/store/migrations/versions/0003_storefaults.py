"""database outages: durable attempt stops (a preemption's grace deadline, its recorded state and reason)

Revision ID: 0003_storefaults
Revises: 0002
Create Date: 2026-12-02 14:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_storefaults"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A migration is a frozen snapshot: it spells out its types instead of importing schema.py, which moves on.
JobId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "attempt_stops",
        sa.Column("job_id", JobId, nullable=False, autoincrement=False),
        sa.Column("attempt", sa.Integer(), nullable=False, autoincrement=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("requeue_as", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("terminate_at", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.job_id"], name=op.f("fk_attempt_stops_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "attempt", name=op.f("pk_attempt_stops")),
    )


def downgrade() -> None:
    op.drop_table("attempt_stops")
