"""A run's outcome: the whole final answer of each attempt, and what its model calls used.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 23:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "results",
        sa.Column("run_uid", sa.String(length=64), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("json", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("digest", sa.String(length=80), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("run_uid", "attempt", name=op.f("pk_results")),
    )
    op.create_table(
        "usage",
        sa.Column("run_uid", sa.String(length=64), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("model_calls", sa.Integer(), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_micro_usd", sa.BigInteger(), nullable=False),
        sa.Column("priced", sa.Boolean(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("run_uid", "attempt", "model", name=op.f("pk_usage")),
    )
    op.create_index(op.f("ix_usage_updated_at"), "usage", ["updated_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_usage_updated_at"), table_name="usage")
    op.drop_table("usage")
    op.drop_table("results")
