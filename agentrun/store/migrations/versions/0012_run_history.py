"""History beyond etcd: a run's spec, labels and annotations as they were at launch, and
the indexes the archive pages by (newest first).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04 18:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("spec", sa.JSON(none_as_null=True), nullable=True))
        batch.add_column(sa.Column("labels", sa.JSON(none_as_null=True), nullable=True))
        batch.add_column(sa.Column("annotations", sa.JSON(none_as_null=True), nullable=True))
    op.create_index(op.f("ix_runs_namespace_created_at_uid"), "runs",
                    ["namespace", "created_at", "uid"])
    op.create_index(op.f("ix_runs_created_at_uid"), "runs", ["created_at", "uid"])


def downgrade() -> None:
    op.drop_index(op.f("ix_runs_created_at_uid"), table_name="runs")
    op.drop_index(op.f("ix_runs_namespace_created_at_uid"), table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("annotations")
        batch.drop_column("labels")
        batch.drop_column("spec")
