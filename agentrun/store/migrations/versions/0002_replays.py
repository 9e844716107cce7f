"""Approved replays, with at most one non-forced approval per original run.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "replays",
        sa.Column("uid", sa.String(length=64), nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("run_uid", sa.String(length=64), nullable=False),
        sa.Column("run_name", sa.String(length=253), nullable=False),
        sa.Column("forced", sa.Boolean(), nullable=False),
        sa.Column("unforced_run_uid", sa.String(length=64), nullable=True),
        sa.Column("reason", sa.String(length=64), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("replay_run_name", sa.String(length=253), nullable=False),
        sa.Column("tools_executed", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("uid", name=op.f("pk_replays")),
        sa.UniqueConstraint("unforced_run_uid", name=op.f("uq_replays_unforced_run_uid")),
    )
    op.create_index(op.f("ix_replays_run_uid"), "replays", ["run_uid"])


def downgrade() -> None:
    op.drop_index(op.f("ix_replays_run_uid"), table_name="replays")
    op.drop_table("replays")
