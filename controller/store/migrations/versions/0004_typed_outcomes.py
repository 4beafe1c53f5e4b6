"""typed outcomes: an attempt whose launch failed before any rank ran says so in a column of its own (it
was the prefix "launch failed" of its reason)

Revision ID: 0004_typed_outcomes
Revises: 0003_steps
Create Date: 2026-12-06 01:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_typed_outcomes"
down_revision: str | Sequence[str] | None = "0003_steps"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job_attempts") as batch:
        batch.add_column(sa.Column("launch_failed", sa.Boolean(), nullable=False, server_default=sa.false()))
    # Attempts recorded before: their reason was the only record of it.
    op.execute(
        "UPDATE job_attempts SET launch_failed = TRUE WHERE state = 'FAILED' AND reason LIKE 'launch failed%'"
    )


def downgrade() -> None:
    with op.batch_alter_table("job_attempts") as batch:
        batch.drop_column("launch_failed")
