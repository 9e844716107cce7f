"""Session ownership (namespaced ADK sessions, one live run per session), and replay
approvals found by the replay run's name.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 08:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "session_owners",
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("session_id", sa.String(length=253), nullable=False),
        sa.Column("agent", sa.String(length=253), nullable=False),
        sa.Column("user_id", sa.String(length=253), nullable=False),
        sa.Column("owner_run_uid", sa.String(length=64), nullable=False),
        sa.Column("holder_run_uid", sa.String(length=64), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("namespace", "session_id", name=op.f("pk_session_owners")),
    )
    op.create_index(op.f("ix_replays_namespace_replay_run_name"), "replays",
                    ["namespace", "replay_run_name"])


def downgrade() -> None:
    op.drop_index(op.f("ix_replays_namespace_replay_run_name"), table_name="replays")
    op.drop_table("session_owners")
