"""Approvals: tool calls that wait for a human's decision, and the decision.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 23:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "approvals",
        sa.Column("run_uid", sa.String(length=64), nullable=False),
        sa.Column("call_id", sa.String(length=255), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("tool", sa.String(length=255), nullable=False),
        sa.Column("args", sa.Text(), nullable=False),
        sa.Column("args_digest", sa.String(length=80), nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("decision", sa.String(length=16), nullable=True),
        sa.Column("approver", sa.String(length=253), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("approval_name", sa.String(length=253), nullable=True),
        sa.PrimaryKeyConstraint("run_uid", "call_id", name=op.f("pk_approvals")),
    )
    op.create_index(op.f("ix_approvals_expires_at"), "approvals", ["expires_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_approvals_expires_at"), table_name="approvals")
    op.drop_table("approvals")
