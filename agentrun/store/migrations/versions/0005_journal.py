"""The journal: each ledger row keeps its tool's effect class, its idempotency key and,
once the call finished, its result (what a resumed attempt answers the call with when the
response never reached the session). The sample outbox gets a unique idempotency key.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 10:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tool_calls") as batch:
        batch.add_column(sa.Column("effect", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("idempotency_key", sa.String(length=80), nullable=True))
        batch.add_column(sa.Column("result", sa.JSON(none_as_null=True), nullable=True))
    # The sample tools' world dedupes by idempotency key, as a real email provider does.
    with op.batch_alter_table("sample_outbox") as batch:
        batch.add_column(sa.Column("idempotency_key", sa.String(length=80), nullable=True))
        batch.create_unique_constraint(op.f("uq_sample_outbox_idempotency_key"),
                                       ["idempotency_key"])


def downgrade() -> None:
    with op.batch_alter_table("sample_outbox") as batch:
        batch.drop_constraint(op.f("uq_sample_outbox_idempotency_key"), type_="unique")
        batch.drop_column("idempotency_key")
    with op.batch_alter_table("tool_calls") as batch:
        batch.drop_column("result")
        batch.drop_column("idempotency_key")
        batch.drop_column("effect")
