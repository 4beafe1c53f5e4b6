"""containment: what each attempt used (peak memory, CPU time, GPU use), measured in its cgroups

Revision ID: 0003_containment
Revises: 0002
Create Date: 2026-12-02 14:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_containment"
down_revision: str | Sequence[str] | None = "0003_secctl"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job_attempts") as batch:
        batch.add_column(sa.Column("usage_json", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_attempts") as batch:
        batch.drop_column("usage_json")
