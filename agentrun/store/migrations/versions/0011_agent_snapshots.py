"""Declarative agents: content-addressed Agent snapshots, and the one each run pinned.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "agent_snapshots",
        sa.Column("digest", sa.String(length=80), nullable=False),
        sa.Column("root", sa.String(length=253), nullable=False),
        sa.Column("snapshot", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("digest", name=op.f("pk_agent_snapshots")),
    )
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("agent_digest", sa.String(length=80), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("agent_digest")
    op.drop_table("agent_snapshots")
