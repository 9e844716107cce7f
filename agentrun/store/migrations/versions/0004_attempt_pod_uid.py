"""The uid of each attempt's pod, written once the pod was created: a level-based reconcile
tells "not created yet" from "created, then gone" by it.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("pod_uid", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("pod_uid")
