"""Manual resume: an approval says whether it resumes; an attempt may resume an attempt of
another run (a replay run continuing a fork of its original's session).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 11:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("replays") as batch:
        batch.add_column(sa.Column("resume", sa.Boolean(), nullable=False,
                                   server_default=sa.false()))
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("resumes_run_uid", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("resumes_run_uid")
    with op.batch_alter_table("replays") as batch:
        batch.drop_column("resume")
