"""job specs stored once: a job_specs table keyed by the spec's digest, jobs.spec_json becomes jobs.spec_key;
unfinished_submissions, the large arrays being written in chunks

Before, every job row carried its spec's JSON, so an array's spec was stored once per task (a 300-task array
with a 1 MB script grew the database by hundreds of MB). Existing rows are moved over: each distinct spec
text becomes one job_specs row.

Revision ID: 0003_secctl
Revises: 0002
Create Date: 2026-12-02 14:00:00.000000
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_secctl"
down_revision: str | Sequence[str] | None = "0003_storefaults"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JobId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

# Rows moved per round trip, so that a large database is migrated without holding it all in memory.
BATCH = 1000


def _spec_key(spec_json: str) -> str:
    # Frozen copy of serde.spec_key: a migration must not change meaning when the code moves on.
    return hashlib.sha256(spec_json.encode()).hexdigest()[:32]


# Column-only table descriptions, for the data steps (not the schema; the schema is spelled out below).
_jobs = sa.table("jobs", sa.column("job_id", sa.BigInteger), sa.column("spec_json", sa.Text),
                 sa.column("spec_key", sa.Text))
_specs = sa.table("job_specs", sa.column("spec_key", sa.Text), sa.column("spec_json", sa.Text))


def upgrade() -> None:
    op.create_table(
        "job_specs",
        sa.Column("spec_key", sa.Text(), nullable=False),
        sa.Column("spec_json", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("spec_key", name=op.f("pk_job_specs")),
    )
    op.create_table(
        "unfinished_submissions",
        sa.Column("first_job_id", JobId, autoincrement=False, nullable=False),
        sa.Column("job_count", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("first_job_id", name=op.f("pk_unfinished_submissions")),
    )
    # A plain ADD COLUMN (no table rebuild on SQLite, where a rebuild of jobs would cascade-delete attempts).
    op.add_column("jobs", sa.Column("spec_key", sa.Text(), nullable=False, server_default=""))
    connection = op.get_bind()
    stored: set[str] = set()
    last_id = 0
    while True:
        rows = connection.execute(
            sa.select(_jobs.c.job_id, _jobs.c.spec_json)
            .where(_jobs.c.job_id > last_id)
            .order_by(_jobs.c.job_id)
            .limit(BATCH)
        ).all()
        if not rows:
            break
        new_specs: dict[str, str] = {}
        keys = []
        for row in rows:
            key = _spec_key(row.spec_json)
            keys.append({"id": row.job_id, "key": key})
            if key not in stored:
                new_specs[key] = row.spec_json
        if new_specs:
            connection.execute(sa.insert(_specs), [{"spec_key": k, "spec_json": v} for k, v in new_specs.items()])
            stored.update(new_specs)
        connection.execute(
            sa.update(_jobs).where(_jobs.c.job_id == sa.bindparam("id")).values(spec_key=sa.bindparam("key")),
            keys,
        )
        last_id = rows[-1].job_id
    op.drop_column("jobs", "spec_json")  # ALTER TABLE ... DROP COLUMN (SQLite 3.35 and later)
    op.create_index(op.f("ix_jobs_spec_key"), "jobs", ["spec_key"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_jobs_spec_key"), table_name="jobs")
    op.add_column("jobs", sa.Column("spec_json", sa.Text(), nullable=False, server_default="{}"))
    connection = op.get_bind()
    specs = sa.select(_specs.c.spec_json).where(_specs.c.spec_key == _jobs.c.spec_key).scalar_subquery()
    connection.execute(sa.update(_jobs).values(spec_json=specs))
    op.drop_column("jobs", "spec_key")
    op.drop_table("job_specs")
    op.drop_table("unfinished_submissions")
